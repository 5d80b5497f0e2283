"""Small steps cross from the prefetch thread to the consumer in groups (``ReadPipeline.step_groups``)."""

import numpy as np
import pytest

import reader
from reader.core import allocator
from reader.core.options import ReaderOptions
from reader.core.pipeline import GROUP_BYTES, MAX_GROUP_STEPS, ReadPipeline
from reader.core.plan import InputContext, Position, ShardPolicy


def _flat(steps):
    return [(position, [batch["id"].tolist() for batch in batches]) for position, batches in steps]


def test_small_steps_are_grouped_the_first_alone_and_in_the_same_order(uneven_snapshot):
    snapshot = reader.open_snapshot(uneven_snapshot)
    pipeline = ReadPipeline(snapshot, ReaderOptions(global_batch_size=64, seed=3, num_epochs=2))
    assert pipeline.group_steps == MAX_GROUP_STEPS  # 64 rows of at most 400 bytes: far under GROUP_BYTES
    groups = list(pipeline.step_groups(Position(0, 0), 2))
    sizes = [len(group) for group in groups]
    assert sizes[0] == 1 and set(sizes[1:-1]) == {MAX_GROUP_STEPS} and 0 < sizes[-1] <= MAX_GROUP_STEPS
    assert _flat(step for group in groups for step in group) == _flat(pipeline.steps(Position(0, 0), 2))


def test_large_steps_and_lent_batch_memory_cross_one_at_a_time(uneven_snapshot):
    snapshot = reader.open_snapshot(uneven_snapshot)
    rows = int(GROUP_BYTES // 4)  # at least 4 bytes a row: a step over GROUP_BYTES
    assert ReadPipeline(snapshot, ReaderOptions(global_batch_size=rows, seed=3)).group_steps == 1

    def lent(rows, empty_batch):  # a DataLoader worker's slots are counted for prefetch steps
        return allocator.new_batch(rows, empty_batch)

    pipeline = ReadPipeline(snapshot, ReaderOptions(global_batch_size=64, seed=3), lent)
    assert pipeline.group_steps == 1
    assert [len(group) for group in pipeline.step_groups(Position(0, 0), 1)] == [1] * pipeline.steps_per_epoch


def test_a_state_taken_inside_a_group_resumes_exactly(uneven_snapshot):
    def dataset():
        return reader.distributed_dataset(uneven_snapshot, 64, seed=5, num_epochs=1)

    everything = [step["id"].copy() for step in dataset()]
    iterator = iter(dataset())
    for _ in range(3):  # the first group is one step, the second eight: stop inside it
        next(iterator)
    state = iterator.get_state()
    restored = iter(dataset())
    restored.set_state(state)
    rest = [step["id"] for step in restored]
    assert len(rest) == len(everything) - 3
    assert all(np.array_equal(a, b) for a, b in zip(rest, everything[3:], strict=True))


def _steps(pipeline, start, stop_epoch, gathers):
    """Each step's per-replica batches as lists, and how many gathers made them (counted into ``gathers``)."""
    from reader.core.gather import Gatherer

    gather = Gatherer.gather

    def counted(self, epoch, start_row, stop_row):
        gathers.append((epoch, start_row, stop_row))
        return gather(self, epoch, start_row, stop_row)

    Gatherer.gather = counted
    try:
        return [
            (position, [{name: values.tolist() for name, values in batch.items()} for batch in batches])
            for position, batches in pipeline.steps(start, stop_epoch)
        ]
    finally:
        Gatherer.gather = gather


@pytest.mark.parametrize(
    "options",
    [
        dict(global_batch_size=64),
        dict(global_batch_size=60, context=InputContext(num_replicas_in_sync=3)),
        dict(global_batch_size=48, shard_policy=ShardPolicy.DATA, context=InputContext(2, 1, 2)),
    ],
    ids=["one-replica", "three-replicas", "data-sliced"],
)
def test_small_shuffled_steps_are_gathered_together_into_the_same_batches(uneven_snapshot, options, monkeypatch):
    """Eight steps' rows gathered into one batch and handed out as its slices are the steps gathered one by
    one, row for row, over epochs, a partial last step and a start inside an epoch."""
    snapshot = reader.open_snapshot(uneven_snapshot)
    pipeline = ReadPipeline(snapshot, ReaderOptions(seed=3, num_epochs=2, drop_remainder=False, **options))
    assert pipeline.gather_steps == MAX_GROUP_STEPS
    for start in (Position(0, 0), Position(1, 5)):
        together: list = []
        grouped = _steps(pipeline, start, 2, together)
        with monkeypatch.context() as alone:
            alone.setattr(ReadPipeline, "gather_steps", property(lambda self: 1))
            one_by_one: list = []
            expected = _steps(pipeline, start, 2, one_by_one)
        assert grouped == expected
        assert len(one_by_one) == len(expected)
        if pipeline.step_plan.data_sliced:  # this pipeline's slices of global batches are not contiguous
            assert together == one_by_one
        else:
            assert len(together) < len(one_by_one) / 4


def test_unshuffled_steps_are_gathered_one_by_one_as_views(uneven_snapshot):
    snapshot = reader.open_snapshot(uneven_snapshot)
    pipeline = ReadPipeline(snapshot, ReaderOptions(global_batch_size=64, shuffle=False, num_epochs=1))
    assert pipeline.group_steps == MAX_GROUP_STEPS and pipeline.gather_steps == 1
