"""Several snapshots as one dataset: unions of folders, handles and views, over real snapshots.

Three "days" hold ids 0..599, 600..1399 and 1400..1999 in shards of uneven
sizes; a fourth has another column type. Every test checks the multiset of
ids delivered (each exactly once per epoch) and the steps of every pipeline.
"""

from __future__ import annotations

import collections
import json

import numpy as np
import pytest

import reader
import reader.service
from schemas import views
from schemas.errors import UsageError
from tests import helpers
from tests.helpers import state_refusal
from tests.reader.service.probes import with_two_workers

DAY_SIZES = [[100, 250, 250], [400, 400], [37, 263, 300]]
ROWS = sum(map(sum, DAY_SIZES))


def _day_batches(day: int) -> list[dict[str, np.ndarray]]:
    start = sum(map(sum, DAY_SIZES[:day]))
    batches = helpers.id_batches([start, *DAY_SIZES[day]])[1:]  # ids start where the day before ended
    for batch in batches:
        batch["day"] = np.full(len(batch["id"]), day, np.int64)
    return batches


@pytest.fixture(scope="module")
def days(tmp_path_factory) -> list[str]:
    """Three daily snapshots (their folders), each in several shards."""
    root = tmp_path_factory.mktemp("days")
    return [
        helpers.write_snapshot(root / f"day{day}", "daily", _day_batches(day), shard_size_bytes=20_000)
        for day in range(len(DAY_SIZES))
    ]


@pytest.fixture(scope="module")
def other_schema(tmp_path_factory) -> str:
    """A snapshot whose ``value`` column is float64 and which lacks ``image``."""
    ids = np.arange(5000, 5100, dtype=np.int64)
    batch = {"id": ids, "value": ids.astype(np.float64), "day": np.full(100, 9, np.int64)}
    return helpers.write_snapshot(tmp_path_factory.mktemp("other"), "other", [batch])


def ids_of(step) -> list[int]:
    step = [step] if isinstance(step, dict) else step
    return [int(i) for batch in step for i in batch["id"]]


def epoch_ids(source, pipelines: int = 1, policy: str = "AUTO", batch: int = 64, **kwargs) -> list[list[list[int]]]:
    """Every pipeline's steps of one epoch, as id lists."""
    steps = []
    for pipeline in range(pipelines):
        dataset = reader.distributed_dataset(
            source,
            batch,
            input_context=reader.InputContext(pipelines, pipeline, pipelines),
            shard_policy=policy,
            seed=3,
            num_epochs=1,
            columns=["id", "day"],
            **kwargs,
        )
        steps.append([ids_of(step) for step in dataset])
    return steps


def test_a_union_reads_every_row_of_every_snapshot_once_shuffled_across_them(days):
    (steps,) = epoch_ids(days)
    delivered = [i for step in steps for i in step]
    assert sorted(delivered) == list(range(ROWS))
    first_step_days = {i // 600 if i < 600 else (1 if i < 1400 else 2) for i in steps[0]}
    assert len(first_step_days) >= 2, "the first step mixes snapshots: one epoch order over all their blocks"
    again = epoch_ids([reader.open_snapshot(days[0]), days[1], days[2]])[0]
    assert again == steps, "folders and open_snapshot handles are the same union"


@pytest.mark.parametrize("policy", ["AUTO", "FILE", "DATA", "OFF"])
def test_every_shard_policy_splits_a_union_as_one_snapshot(days, policy):
    per_pipeline = epoch_ids(days, pipelines=3, policy=policy, batch=96)
    assert len({len(steps) for steps in per_pipeline}) == 1, "equal steps per pipeline"
    delivered = collections.Counter(i for steps in per_pipeline for step in steps for i in step)
    copies = 3 if policy == "OFF" else 1  # OFF: every pipeline reads everything, on purpose
    assert sorted(delivered) == list(range(ROWS)) and set(delivered.values()) == {copies}


def test_a_state_saved_on_a_union_resumes_on_another_topology_exactly_once(days):
    def dataset(pipelines, pipeline, batch):
        return reader.distributed_dataset(
            days, batch, input_context=reader.InputContext(pipelines, pipeline, pipelines), seed=11, num_epochs=1
        )

    seen, state = [], None
    for pipeline in range(2):
        iterator = iter(dataset(2, pipeline, 64))
        for _ in range(5):
            seen += ids_of(next(iterator))
        if pipeline == 0:
            state = json.loads(json.dumps(iterator.get_state()))
    rest = []
    for pipeline in range(3):
        iterator = iter(dataset(3, pipeline, 96))
        iterator.set_state(state)
        rest.append([ids_of(step) for step in iterator])
    assert len({len(steps) for steps in rest}) == 1
    assert sorted(seen + [i for steps in rest for step in steps for i in step]) == list(range(ROWS))


def test_a_state_is_refused_by_another_set_of_snapshots(days):
    iterator = iter(reader.distributed_dataset(days[:2], 64, seed=1))
    next(iterator)
    state = iterator.get_state()
    message = state_refusal(iter(reader.distributed_dataset(days[1:], 64, seed=1)), state)
    assert "saved on a union of 2 snapshots" in message and "build the dataset over the same snapshots" in message
    message = state_refusal(iter(reader.distributed_dataset(days[0], 64, seed=1)), state)
    assert "this dataset reads snapshot" in message
    restored = iter(reader.distributed_dataset(days[:2], 64, seed=1))
    restored.set_state(state)
    assert len(ids_of(next(restored))) == 64


def test_schemas_must_agree_on_the_columns_read(days, other_schema):
    with pytest.raises(UsageError) as refused:
        reader.distributed_dataset([days[0], other_schema], 64)
    message = str(refused.value)
    assert "\n" not in message
    assert "'image' is missing from" in message and other_schema in message
    assert "'value' is float32[] in" in message and "float64[] in" in message
    assert "pass columns= with shared ones ('id', 'day')" in message
    dataset = reader.distributed_dataset([days[0], other_schema], 100, columns=["id", "day"], num_epochs=1, seed=0)
    delivered = [i for step in dataset for i in ids_of(step)]
    assert sorted(delivered) == list(range(600)) + list(range(5000, 5100))
    with pytest.raises(UsageError, match=r"listed twice"):
        reader.distributed_dataset([days[0], days[0]], 64)


def test_a_view_reads_its_latest_version_or_a_pinned_one_and_states_name_it(days, tmp_path):
    view = str(tmp_path / "daily-view")
    for day in days:
        snapshot = reader.open_snapshot(day)
        views.add(view, snapshot.paths, snapshot.metadata, keep=2)
    (latest,) = epoch_ids(view)
    assert sorted(i for step in latest for i in step) == list(range(600, ROWS))  # days 1 and 2: keep=2
    (pinned,) = epoch_ids(f"{view}@1")
    assert sorted(i for step in pinned for i in step) == list(range(600))

    iterator = iter(reader.distributed_dataset(f"{view}@2", 64, seed=5))
    next(iterator)
    state = iterator.get_state()
    message = state_refusal(iter(reader.distributed_dataset(view, 64, seed=5)), state)
    assert f"saved on view {view}@2 (2 snapshots)" in message and f"build the dataset on {view}@2" in message
    restored = iter(reader.distributed_dataset(f"{view}@2", 64, seed=5))
    restored.set_state(state)
    next(restored)


def test_a_view_version_keeps_reading_its_run_after_the_folder_is_rewritten(days, tmp_path):
    root = tmp_path / "day"
    folder = helpers.write_snapshot(root, "daily", _day_batches(0))
    view = str(tmp_path / "view")
    snapshot = reader.open_snapshot(folder)
    views.add(view, snapshot.paths, snapshot.metadata)
    helpers.write_snapshot(root, "daily", _day_batches(1))  # a new run of the same folder, like --mode=write
    assert reader.open_snapshot(folder).metadata.run_id != snapshot.metadata.run_id
    (steps,) = epoch_ids(f"{view}@1")
    assert sorted(i for step in steps for i in step) == list(range(600)), "version 1 reads the run it recorded"


def test_reader_dataset_reads_a_union(days):
    tf = pytest.importorskip("tensorflow")
    dataset = reader.dataset(days, 100, seed=2, num_epochs=1, columns=["id"])
    assert isinstance(dataset, tf.data.Dataset)
    delivered = [int(i) for batch in dataset for i in batch["id"].numpy()]
    assert sorted(delivered) == list(range(ROWS))


@pytest.fixture
def cluster():
    """A dispatcher and two workers on loopback."""
    dispatcher = reader.service.DispatchServer(reader.service.DispatcherConfig(lease_seconds=2)).start()
    with with_two_workers(dispatcher) as workers:
        yield dispatcher, workers


def test_the_service_serves_a_union_exactly_once_and_every_worker_whole(days, cluster):
    dispatcher, _ = cluster
    shared = reader.ServiceOptions(address=dispatcher.target, job_name="window")

    def consume() -> list[int]:  # two consumers of one job, first come first served
        dataset = reader.distributed_dataset(days, 50, service=shared, seed=4, columns=["id"])
        return [i for step in dataset for i in ids_of(step)]

    delivered = [i for ids in helpers.read_at_once(consume, 2) for i in ids]
    assert sorted(delivered) == list(range(ROWS)), "distributed_epoch: every row of the union once"
    parallel = reader.ServiceOptions(address=dispatcher.target, processing_mode="parallel_epochs")
    rows = collections.Counter(
        i for step in reader.distributed_dataset(days, 50, service=parallel, columns=["id"]) for i in ids_of(step)
    )
    assert sorted(rows) == list(range(ROWS)) and set(rows.values()) == {2}, "parallel_epochs: each worker's whole"


def test_the_service_reads_a_pinned_view_at_its_runs_after_a_rewrite(cluster, tmp_path):
    dispatcher, _ = cluster
    root = tmp_path / "day"
    folder = helpers.write_snapshot(root, "daily", _day_batches(0))
    view = str(tmp_path / "view")
    snapshot = reader.open_snapshot(folder)
    views.add(view, snapshot.paths, snapshot.metadata)
    pinned = reader.distributed_dataset(f"{view}@1", 50, service=dispatcher.target, seed=4, columns=["id"])
    helpers.write_snapshot(root, "daily", _day_batches(1))  # a new run of the folder after the dataset was opened
    assert sorted(i for step in pinned for i in ids_of(step)) == list(range(600)), "the run version 1 recorded"
    unheld = reader.distributed_dataset(folder, 50, service=dispatcher.target, columns=["id"])
    helpers.write_snapshot(root, "daily", _day_batches(2))  # no view holds the run that dataset planned from
    with pytest.raises(reader.SnapshotNotFoundError, match="is no longer the run of"):
        next(iter(unheld))


def test_torch_dataloader_workers_read_a_union_once(days):
    torch = pytest.importorskip("torch")
    dataset = reader.distributed_dataset(days, 100, seed=1, columns=["id"]).to_torch()
    loader = torch.utils.data.DataLoader(dataset, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert sorted(torch.cat([batch["id"] for batch in loader]).tolist()) == list(range(ROWS))


def test_jax_output_reads_a_union(days):
    pytest.importorskip("jax")
    dataset = reader.distributed_dataset(days, 100, seed=1, columns=["id"], output="jax", num_epochs=1)
    assert sorted(int(i) for step in dataset for i in np.asarray(step["id"])) == list(range(ROWS))
