"""reader.distributed_dataset over real snapshots written by Beam: semantics end to end."""

import collections
import json
import subprocess
import sys

import numpy as np
import pytest

import reader
from tests import helpers


def ids(step):
    """A step's ids: one list per replica."""
    batches = step if isinstance(step, list) else [step]
    return [b["id"].tolist() for b in batches]


def read_ids(root, batch, **kwargs):
    return [ids(step) for step in reader.distributed_dataset(root, batch, **kwargs)]


@pytest.mark.parametrize(
    ("n", "batch", "replicas", "expected"),
    [
        (6, 4, 2, [[[0, 1], [2, 3]], [[4], [5]]]),
        (4, 4, 5, [[[0], [1], [2], [3], []]]),
        (8, 4, 3, [[[0, 1], [2, 3], []], [[4, 5], [6, 7], []]]),
    ],
)
def test_rebatching_matches_seed_003(range_root, n, batch, replicas, expected):
    got = read_ids(range_root / f"range{n}", batch, num_replicas=replicas, shuffle=False)
    assert got == expected
    dataset = reader.distributed_dataset(range_root / f"range{n}", batch, num_replicas=replicas, shuffle=False)
    assert dataset.steps_per_epoch == len(expected)


def test_drop_remainder_drops_the_partial_global_batch(range_root):
    assert read_ids(range_root / "range6", 4, num_replicas=2, shuffle=False, drop_remainder=True) == [[[0, 1], [2, 3]]]


def test_batches_keep_stored_tensor_shapes_and_dtypes(uneven_snapshot):
    dataset = reader.distributed_dataset(uneven_snapshot, 64, seed=1)
    step = next(iter(dataset))
    assert step["image"].shape == (64, 4, 4, 3) and step["image"].dtype == np.uint8
    assert step["value"].dtype == np.float32 and step["payload"].dtype == object
    np.testing.assert_array_equal(step["image"][:, 0, 0, 0], (step["id"] % 251).astype(np.uint8))
    np.testing.assert_array_equal(step["value"], step["id"] * 0.5)
    assert dataset.element_spec["image"].shape == (None, 4, 4, 3)


def test_columns_projects(uneven_snapshot):
    step = next(iter(reader.distributed_dataset(uneven_snapshot, 8, columns=["id"])))
    assert list(step) == ["id"]


def epoch_of_worker(path, policy, workers, worker, batch_per_worker=8, **kwargs):
    context = reader.InputContext(workers, worker, workers)
    dataset = reader.distributed_dataset(
        path, batch_per_worker * workers, input_context=context, shard_policy=policy, seed=5, **kwargs
    )
    return [ids(step)[0] for step in dataset], dataset.steps_per_epoch


@pytest.mark.parametrize("policy", ["AUTO", "FILE"])
def test_every_row_once_across_1_to_16_workers_with_equal_steps(uneven_snapshot, policy):
    snapshot = reader.open_snapshot(uneven_snapshot)
    assert len({sum(rows) for rows in snapshot.block_rows}) > 3, "the fixture must have uneven shards"
    for workers in range(1, 17):
        seen: collections.Counter = collections.Counter()
        step_counts = set()
        for worker in range(workers):
            steps, steps_per_epoch = epoch_of_worker(uneven_snapshot, policy, workers, worker)
            assert len(steps) == steps_per_epoch
            step_counts.add(len(steps))
            for step in steps:
                seen.update(step)
        assert step_counts == {next(iter(step_counts))}, f"{workers} workers take different numbers of steps"
        assert sorted(seen) == list(range(2000)) and set(seen.values()) == {1}, f"{workers} workers"


def test_auto_with_fewer_shards_than_workers_works_and_file_names_auto(range_root):
    seen = []
    for worker in range(4):
        steps, _ = epoch_of_worker(range_root / "range12", "AUTO", 4, worker, batch_per_worker=2)
        seen += [i for step in steps for i in step]
    assert sorted(seen) == list(range(12))
    with pytest.raises(reader.UsageError, match="AUTO"):
        epoch_of_worker(range_root / "range12", "FILE", 2, 0)


def test_data_policy_example_of_seed_003(range_root):
    got = [epoch_of_worker(range_root / "range12", "DATA", 2, w, batch_per_worker=2, shuffle=False)[0] for w in (0, 1)]
    assert got == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]


def test_data_policy_with_shuffle_needs_a_shared_seed(range_root):
    context = reader.InputContext(2, 0, 2)
    with pytest.raises(reader.UsageError, match="seed"):
        reader.distributed_dataset(range_root / "range12", 4, input_context=context, shard_policy="DATA")


def test_off_gives_every_worker_everything(range_root):
    for worker in (0, 1):
        steps, _ = epoch_of_worker(range_root / "range12", "OFF", 2, worker, batch_per_worker=2, shuffle=False)
        assert steps == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11]]


ORDER_SCRIPT = """
import json, sys, reader
dataset = reader.distributed_dataset(sys.argv[1], 50, seed=int(sys.argv[2]), num_epochs=2, shuffle_buffer_size=300)
print(json.dumps([step["id"].tolist() for step in dataset]))
"""


def test_same_seed_same_order_in_another_process_and_epochs_differ(uneven_snapshot):
    here = [
        ids(s)[0]
        for s in reader.distributed_dataset(uneven_snapshot, 50, seed=9, num_epochs=2, shuffle_buffer_size=300)
    ]
    completed = subprocess.run(
        [sys.executable, "-c", ORDER_SCRIPT, uneven_snapshot, "9"],
        capture_output=True,
        text=True,
        env=helpers.cli_env(PYTHONHASHSEED="123"),
        check=True,
    )
    assert json.loads(completed.stdout) == here
    per_epoch = len(here) // 2
    first, second = sum(here[:per_epoch], []), sum(here[per_epoch:], [])
    assert first != second and sorted(first) == sorted(second) == list(range(2000))


def test_seed_none_differs_run_to_run_and_reshuffle_off_repeats(uneven_snapshot):
    a = [ids(s)[0] for s in reader.distributed_dataset(uneven_snapshot, 100)]
    b = [ids(s)[0] for s in reader.distributed_dataset(uneven_snapshot, 100)]
    assert a != b
    same = [
        ids(s)[0]
        for s in reader.distributed_dataset(uneven_snapshot, 100, seed=1, num_epochs=2, reshuffle_each_epoch=False)
    ]
    assert same[: len(same) // 2] == same[len(same) // 2 :]


@pytest.mark.parametrize("window", ["AUTO", 10_000])
def test_shuffle_quality_on_100k_rows(large_snapshot, window):
    stored = np.concatenate([s["id"] for s in reader.distributed_dataset(large_snapshot, 4096, shuffle=False)])
    position = np.empty(len(stored), np.int64)
    position[stored] = np.arange(len(stored))
    out = np.concatenate(
        [s["id"] for s in reader.distributed_dataset(large_snapshot, 4096, seed=3, shuffle_buffer_size=window)]
    )
    assert sorted(out.tolist()) == list(range(100_000))
    stored_position = position[out]
    spearman = np.corrcoef(stored_position, np.arange(len(out)))[0, 1]  # both are permutations: ranks = values
    neighbours = np.mean(np.abs(np.diff(stored_position)) == 1)
    assert abs(spearman) < 0.05 and neighbours < 0.01, (spearman, neighbours)


RESUME_SCRIPT = """
import json, sys, reader
states = json.loads(sys.stdin.read())
out = []
for state in states:
    dataset = reader.distributed_dataset(sys.argv[1], 96, num_replicas=2, num_epochs=2, shuffle_buffer_size=200)
    iterator = iter(dataset)
    iterator.set_state(state)
    out.append([[b["id"].tolist() for b in step] for step in iterator])
print(json.dumps(out))
"""


def test_resume_from_every_step_in_a_new_process(uneven_snapshot):
    # seed=None on purpose: the state carries the seed, so the new process needs nothing else.
    iterator = iter(
        reader.distributed_dataset(uneven_snapshot, 96, num_replicas=2, num_epochs=2, shuffle_buffer_size=200)
    )
    states, steps = [iterator.get_state()], []
    for step in iterator:
        steps.append(ids(step))
        states.append(json.loads(json.dumps(iterator.get_state())))
    assert len(steps) == 2 * 21
    completed = subprocess.run(
        [sys.executable, "-c", RESUME_SCRIPT, uneven_snapshot],
        input=json.dumps(states),
        capture_output=True,
        text=True,
        env=helpers.cli_env(),
        check=True,
    )
    remaining = json.loads(completed.stdout)
    for k, rest in enumerate(remaining):
        assert rest == steps[k:], f"resuming after {k} steps"


def test_a_state_from_other_options_is_refused(uneven_snapshot):
    """Other shuffle settings (another global batch or topology resumes elastically: test_elastic_resume.py)."""
    state = iter(reader.distributed_dataset(uneven_snapshot, 96)).get_state()
    with pytest.raises(reader.UsageError, match="same arguments"):
        iter(reader.distributed_dataset(uneven_snapshot, 96, reshuffle_each_epoch=False)).set_state(state)


def test_num_epochs_none_repeats_and_iterations_reshuffle(range_root):
    iterator = iter(reader.distributed_dataset(range_root / "range6", 6, num_epochs=None, seed=2))
    epochs = [sorted(next(iterator)["id"].tolist()) for _ in range(5)]
    assert epochs == [list(range(6))] * 5
    dataset = reader.distributed_dataset(range_root / "range12", 12, seed=2)
    assert [s["id"].tolist() for s in dataset] != [s["id"].tolist() for s in dataset]


def test_wide_rows_are_gathered_intact_and_once(wide_snapshot):
    snapshot = reader.open_snapshot(wide_snapshot)
    width = snapshot.element_spec["payload"].shape[1]
    blocks = [rows for shard in snapshot.block_rows for rows in shard]
    assert len(blocks) > 50 and max(blocks) <= 6, "windows must span many small blocks"
    for window in ("AUTO", 37):
        steps = list(reader.distributed_dataset(snapshot, 64, seed=2, num_epochs=2, shuffle_buffer_size=window))
        ids = np.concatenate([step["id"] for step in steps])
        payload = np.concatenate([step["payload"] for step in steps])
        expected = ((ids[:, None] * 7 + np.arange(width)[None, :]) % 251).astype(np.uint8)
        np.testing.assert_array_equal(payload, expected)
        assert sorted(ids.tolist()) == sorted(list(range(snapshot.num_rows)) * 2)
        first_epoch = ids[: snapshot.num_rows]
        assert np.mean(np.abs(np.diff(first_epoch)) == 1) < 0.05


def passes_continue_one_another(snapshot) -> None:
    options = {"seed": 4, "shuffle_buffer_size": 300, "num_replicas": 2}
    one_pass = read_ids(snapshot, 50, num_epochs=4, **options)
    dataset = reader.distributed_dataset(snapshot, 50, num_epochs=1, **options)
    assert [ids(step) for _ in range(3) for step in dataset] == one_pass[: len(one_pass) * 3 // 4]

    # What three passes loaded for epoch 3 is for their seed: a restore there with seed 5 reads its own.
    # (A state of another seed is refused by a dataset given a seed; one built with seed=None takes it.)
    other = reader.distributed_dataset(snapshot, 50, num_epochs=1, **{**options, "seed": 5})
    unseeded = reader.distributed_dataset(snapshot, 50, num_epochs=1, **{**options, "seed": None})
    for _ in range(3):
        for _ in other:
            pass
        for _ in unseeded:
            pass
    expected = iter(other)
    restored = iter(unseeded)
    restored.set_state(expected.get_state())
    assert [ids(step) for step in restored] == [ids(step) for step in expected]

    # A pass left early hands nothing over; the next pass reads its epoch as one long pass would.
    iterator = iter(dataset)
    next(iterator)
    iterator.close()
    assert [ids(step) for step in dataset] == read_ids(snapshot, 50, num_epochs=5, **options)[len(one_pass) :]


def test_passes_over_a_dataset_continue_one_another(uneven_snapshot):
    """Each ``for step in dataset`` starts on windows the previous pass already loaded for it
    (same seed, next epoch): the passes give exactly the steps of one pass over all epochs."""
    passes_continue_one_another(uneven_snapshot)


def test_passes_over_direct_reads_continue_one_another(wide_snapshot):
    passes_continue_one_another(wide_snapshot)


def test_a_restore_elsewhere_never_reuses_windows_loaded_for_another_start(wide_snapshot):
    """Windows a pass loaded for the next one are dropped when the next pass starts anywhere else
    (their ring buffers get reused by that pass's own windows)."""
    options = {"seed": 4, "shuffle_buffer_size": 100}
    dataset = reader.distributed_dataset(wide_snapshot, 50, num_epochs=2, **options)
    steps_per_epoch = dataset.steps_per_epoch

    def state_after(steps: int, num_epochs: int) -> dict:
        probe = iter(reader.distributed_dataset(wide_snapshot, 50, num_epochs=num_epochs, **options))
        for _ in range(steps):
            next(probe)
        return probe.get_state()

    middle_of_epoch_1, start_of_epoch_2 = state_after(steps_per_epoch + 3, 2), state_after(2 * steps_per_epoch, 3)
    for _ in dataset:  # epochs 0 and 1; loads the first windows of epoch 2 for the next pass
        pass
    for state in (middle_of_epoch_1, start_of_epoch_2):  # the first reads through epoch 1, then hands over
        restored = iter(dataset)
        restored.set_state(state)
        expected = iter(reader.distributed_dataset(wide_snapshot, 50, num_epochs=2, **options))
        expected.set_state(state)
        assert [ids(step) for step in restored] == [ids(step) for step in expected]
