"""Small steps cross from the prefetch thread to the consumer in groups (``ReadPipeline.step_groups``)."""

import numpy as np

import reader
from reader.core import allocator
from reader.core.options import ReaderOptions
from reader.core.pipeline import GROUP_BYTES, MAX_GROUP_STEPS, ReadPipeline
from reader.core.plan import Position


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
