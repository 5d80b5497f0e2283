"""Elastic resume over real reads: part of an epoch on 4 pipelines, one state, then 1, 2, 3, 5 or 8 pipelines with
other replica counts and global batches deliver the rest of that epoch exactly once, in equal steps, and the next
epoch is a normal one of the new topology; a wrong state is one clear line."""

import collections
import json
import subprocess
import sys

import pytest

import reader
from reader.core.state import STATE_VERSION
from tests import helpers
from tests.helpers import state_refusal

ROWS = 2000  # uneven_snapshot: ids 0..1999


def dataset(path, pipelines, pipeline, replicas, batch, *, policy="AUTO", shuffle=True, epochs=2, **kwargs):
    context = reader.InputContext(pipelines, pipeline, replicas)
    kwargs.setdefault("seed", 7)
    return reader.distributed_dataset(
        path,
        batch,
        input_context=context,
        shard_policy=policy,
        shuffle=shuffle,
        num_epochs=epochs,
        columns=["id"],
        **kwargs,
    )


def ids(step):
    """The ids of a step: one dict (one replica per pipeline) or a list of one per replica."""
    step = [step] if isinstance(step, dict) else step
    return [i for batch in step for i in batch["id"].tolist()]


def first_steps(path, steps, *, pipelines=4, replicas=4, batch=64, **kwargs):
    """The ids 4 pipelines deliver in ``steps`` steps, and pipeline 0's state after them (the chief's)."""
    seen, state = [], None
    for pipeline in range(pipelines):
        iterator = iter(dataset(path, pipelines, pipeline, replicas, batch, **kwargs))
        for _ in range(steps):
            seen += ids(next(iterator))
        if pipeline == 0:
            state = json.loads(json.dumps(iterator.get_state()))
        iterator.close()
    return seen, state


def resumed(path, state, pipelines, replicas, batch, **kwargs):
    """Each new pipeline restored from the one state: its steps, by epoch (from each step's state)."""
    per_pipeline = []
    for pipeline in range(pipelines):
        iterator = iter(dataset(path, pipelines, pipeline, replicas, batch, **kwargs))
        iterator.set_state(state)
        epochs = collections.defaultdict(list)
        while True:
            epoch = iterator.get_state()["epoch"]
            try:
                step = next(iterator)
            except StopIteration:
                break
            epochs[epoch].append(ids(step))
        per_pipeline.append(epochs)
    return per_pipeline


def exactly_once(rows):
    counts = collections.Counter(rows)
    assert max(counts.values()) == 1, [row for row, n in counts.items() if n > 1][:10]
    assert sorted(counts) == list(range(ROWS))


def check_epochs(seen, per_pipeline, epoch, *, next_steps):
    """The epoch of the state: ``seen`` + what the new pipelines deliver is every row once, in equal steps;
    the next epoch: every row once in ``next_steps`` steps per pipeline."""
    assert len({len(epochs[epoch]) for epochs in per_pipeline}) == 1
    exactly_once(seen + [i for epochs in per_pipeline for step in epochs[epoch] for i in step])
    assert all(len(epochs[epoch + 1]) == next_steps for epochs in per_pipeline)
    exactly_once([i for epochs in per_pipeline for step in epochs[epoch + 1] for i in step])


@pytest.mark.parametrize(
    "pipelines, replicas, batch", [(1, 1, 96), (2, 4, 40), (3, 3, 48), (5, 10, 50), (8, 8, 64)], ids=str
)
def test_four_pipelines_resume_on_another_topology(uneven_snapshot, pipelines, replicas, batch):
    seen, state = first_steps(uneven_snapshot, 3)
    assert state["step"] == 3 and state["topology"]["pipelines"] == 4
    per_pipeline = resumed(uneven_snapshot, state, pipelines, replicas, batch)
    fresh = dataset(uneven_snapshot, pipelines, 0, replicas, batch)
    check_epochs(seen, per_pipeline, 0, next_steps=fresh.steps_per_epoch)
    # Every replica got its share: a step is split across the pipeline's replicas.
    iterator = iter(dataset(uneven_snapshot, pipelines, 0, replicas, batch))
    iterator.set_state(state)
    assert len(next(iterator)) == replicas // pipelines


@pytest.mark.parametrize("shuffle", [True, False], ids=["shuffled", "stored-order"])
def test_data_sharding_resumes_on_other_pipelines_and_auto(uneven_snapshot, shuffle):
    seen, state = first_steps(uneven_snapshot, 5, policy="DATA", shuffle=shuffle)
    seen_set = set(seen)
    assert len(seen_set) == len(seen) == 5 * 64
    for pipelines, policy in [(2, "DATA"), (3, "AUTO")]:
        per_pipeline = resumed(uneven_snapshot, state, pipelines, pipelines, 30, policy=policy, shuffle=shuffle)
        fresh = dataset(uneven_snapshot, pipelines, 0, pipelines, 30, policy=policy)
        check_epochs(seen, per_pipeline, 0, next_steps=fresh.steps_per_epoch)


def test_file_sharding_resumes_on_fewer_pipelines(uneven_snapshot):
    seen, state = first_steps(uneven_snapshot, 4, policy="FILE", batch=32)
    per_pipeline = resumed(uneven_snapshot, state, 2, 2, 64, policy="FILE")
    check_epochs(seen, per_pipeline, 0, next_steps=dataset(uneven_snapshot, 2, 0, 2, 64, policy="FILE").steps_per_epoch)


def test_a_second_elastic_restore_during_the_remainder_epoch(uneven_snapshot):
    seen, state = first_steps(uneven_snapshot, 2)
    seen3 = []
    for pipeline in range(3):  # 3 pipelines read 4 steps of the remainder; the chief saves
        iterator = iter(dataset(uneven_snapshot, 3, pipeline, 3, 30))
        iterator.set_state(state)
        for _ in range(4):
            seen3 += ids(next(iterator))
        if pipeline == 0:
            state3 = json.loads(json.dumps(iterator.get_state()))
        iterator.close()
    assert state3["remainder"] is not None and state3["step"] == 4
    assert len(state3["remainder"]["segments"]) <= 4 + 3
    per_pipeline = resumed(uneven_snapshot, state3, 5, 5, 25)
    check_epochs(seen + seen3, per_pipeline, 0, next_steps=dataset(uneven_snapshot, 5, 0, 5, 25).steps_per_epoch)


def test_states_at_either_epoch_boundary_resume_at_the_next_epoch(uneven_snapshot):
    four = dataset(uneven_snapshot, 4, 0, 4, 64)
    at_start = iter(four).get_state()  # before the first step of epoch 0
    last = iter(dataset(uneven_snapshot, 4, 0, 4, 64))
    for _ in range(four.steps_per_epoch):
        next(last)
    after_last = last.get_state()  # after the last step of epoch 0
    last.close()
    assert (at_start["epoch"], at_start["step"], after_last["epoch"], after_last["step"]) == (0, 0, 1, 0)
    two_steps = dataset(uneven_snapshot, 2, 0, 2, 50).steps_per_epoch
    per_pipeline = resumed(uneven_snapshot, at_start, 2, 2, 50)
    assert sorted(per_pipeline[0]) == [0, 1] and all(len(e[0]) == two_steps for e in per_pipeline)
    exactly_once([i for epochs in per_pipeline for step in epochs[0] for i in step])
    per_pipeline = resumed(uneven_snapshot, after_last, 2, 2, 50)
    assert sorted(per_pipeline[0]) == [1]  # epoch 1 only, in full: none skipped, none repeated
    exactly_once([i for epochs in per_pipeline for step in epochs[1] for i in step])


def test_the_same_topology_still_restores_each_pipeline_exactly(uneven_snapshot):
    """Asynchronous consumers: each pipeline's own state, at its own step, resumes where it was (seed=None:
    each pipeline draws its own seed, which its state carries)."""
    for pipeline, steps in [(1, 2), (3, 5)]:
        iterator = iter(dataset(uneven_snapshot, 4, pipeline, 4, 64, seed=None, epochs=1))
        head = [ids(next(iterator)) for _ in range(steps)]
        state = iterator.get_state()
        iterator.close()
        again = iter(dataset(uneven_snapshot, 4, pipeline, 4, 64, seed=None, epochs=1))
        again.set_state(state)
        whole = dataset(uneven_snapshot, 4, pipeline, 4, 64, seed=state["seed"], epochs=1)
        assert head + [ids(s) for s in again] == [ids(s) for s in whole]


def test_a_drawn_seed_on_several_pipelines_is_refused_elsewhere_with_one_line(uneven_snapshot):
    _, state = first_steps(uneven_snapshot, 2, seed=None)
    for pipelines, pipeline in [(2, 0), (4, 1)]:
        iterator = iter(dataset(uneven_snapshot, pipelines, pipeline, pipelines, 64, seed=None))
        message = state_refusal(iterator, state)
        assert "seed it drew" in message and "seed=<int>" in message


def test_a_state_of_other_rows_is_refused_naming_which(uneven_snapshot, range_root, tmp_path):
    _, state = first_steps(uneven_snapshot, 1)
    message = state_refusal(iter(dataset(str(range_root / "range12"), 1, 0, 1, 4)), state)
    assert "another snapshot" in message and "range12" in message
    other_run = {**state, "snapshot": [state["snapshot"][0], "0" * 32]}
    assert "rewritten since" in state_refusal(iter(dataset(uneven_snapshot, 2, 0, 2, 64)), other_run)
    assert "seed=7" in state_refusal(iter(dataset(uneven_snapshot, 2, 0, 2, 64, seed=8)), state)
    columns = iter(reader.distributed_dataset(uneven_snapshot, 64, seed=7, columns=["id", "payload"]))
    assert "columns=['id']" in state_refusal(columns, state)
    newer = state_refusal(iter(dataset(uneven_snapshot, 2, 0, 2, 64)), {**state, "version": STATE_VERSION + 1})
    assert "newer snapfeed" in newer and "upgrade" in newer


PROGRAM = """
import json, sys
import reader
path, pipelines, pipeline, batch, steps = sys.argv[1], *map(int, sys.argv[2:6])
state = json.loads(sys.stdin.read() or "null")
data = reader.distributed_dataset(path, batch, input_context=reader.InputContext(pipelines, pipeline, 2 * pipelines),
                                  seed=11, num_epochs=1, columns=["id"])
iterator = iter(data)
if state is not None:
    iterator.set_state(state)
ids = []
for _ in range(steps) if steps >= 0 else iter(int, 1):
    try:
        step = next(iterator)
    except StopIteration:
        break
    ids.append([i for b in step for i in b["id"].tolist()])
print(json.dumps({"ids": ids, "state": iterator.get_state()}))
"""


def run_pipelines(path, pipelines, batch, steps, state=None):
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROGRAM, str(path), str(pipelines), str(p), str(batch), str(steps)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=helpers.REPO_ROOT,
            env=helpers.cli_env(),
        )
        for p in range(pipelines)
    ]
    outs = [proc.communicate(json.dumps(state), timeout=120)[0] for proc in procs]
    assert all(proc.returncode == 0 for proc in procs)
    return [json.loads(out.strip().splitlines()[-1]) for out in outs]


@pytest.mark.slow  # 5 Python processes: about 6 s on 2 idle cores
def test_processes_resume_from_the_chiefs_state_as_json(uneven_snapshot):
    """3 processes, one pipeline each, read 4 steps; 2 new processes resume from the chief's state, passed as JSON."""
    before = run_pipelines(uneven_snapshot, 3, 48, 4)
    after = run_pipelines(uneven_snapshot, 2, 50, -1, state=before[0]["state"])
    assert len({len(out["ids"]) for out in after}) == 1
    exactly_once([i for out in before + after for step in out["ids"] for i in step])
