"""The elastic resume plan (``reader.core.elastic``), pure: rows delivered before and after any restores = every
row of the epoch exactly once, every pipeline the same number of steps, and a state that stays small."""

import collections
import random

import pytest

from reader.core.elastic import Remainder, Streams, Topology, epoch_cut, remainder_cut, resume, slice_segments
from reader.core.plan import InputContext, Position, ShardPolicy, assigned_pieces, pipeline_rows

EXACT_POLICIES = [ShardPolicy.AUTO, ShardPolicy.FILE, ShardPolicy.DATA]


def topology(policy, pipelines, per_pipeline_batch, window_rows=64, drop_remainder=False):
    return Topology(Streams(policy, pipelines, window_rows), pipelines * per_pipeline_batch, drop_remainder)


def random_topology(rng, shards):
    policy = rng.choice(EXACT_POLICIES)
    pipelines = rng.choice([1, 2, 3, 4, 5, 8])
    if policy is ShardPolicy.FILE:
        pipelines = min(pipelines, shards)
    return topology(policy, pipelines, rng.randint(1, 40), window_rows=rng.choice([16, 64]))


def rows_of(segments):
    return [(pipeline, row) for pipeline, start, stop in segments for row in range(start, stop)]


def delivered(cut, first_step, last_step):
    """Every row the cut's pipelines deliver at steps [first_step, last_step), and each pipeline's step count."""
    rows = []
    for pipeline in range(cut.topology.pipelines):
        for step in range(first_step, last_step):
            rows += rows_of(cut.step_segments(pipeline, step))
    return rows


def base_rows(top, block_rows):
    return rows_of(epoch_cut(top, block_rows).left_after(0))


def assert_equal_steps(cut):
    assert len({cut.plan(p).steps for p in range(cut.topology.pipelines)}) == 1


@pytest.mark.parametrize("seed", range(60))
def test_rows_before_and_after_elastic_restores_are_the_epoch_exactly_once(seed):
    """Restored up to three times in one epoch, the later times during a remainder epoch."""
    rng = random.Random(seed)
    block_rows = [[rng.randint(0, 30) for _ in range(rng.randint(1, 6))] for _ in range(rng.randint(8, 14))]
    first = random_topology(rng, len(block_rows))
    cut = epoch_cut(first, block_rows)
    assert_equal_steps(cut)
    step = rng.randint(0, cut.plan(0).steps - 1) if cut.plan(0).steps else 0
    seen = delivered(cut, 0, step)
    position, saved_by, remainder = Position(3, step), first, None
    for restore in range(3):
        restored_by = random_topology(rng, len(block_rows))
        position, remainder = resume(position, saved_by, remainder, restored_by, block_rows)
        if remainder is None:
            break
        assert position == Position(3, 0) and len(remainder.segments) <= first.pipelines + 8 * restore
        cut = remainder_cut(restored_by, remainder.segments)
        assert_equal_steps(cut)
        steps = cut.plan(0).steps
        step = steps if restore == 2 else rng.randint(0, steps)
        seen += delivered(cut, 0, step)
        position, saved_by = Position(3, step), restored_by
    assert max(collections.Counter(seen).values(), default=1) == 1
    if position == Position(3, 0) and remainder is None:
        assert seen == []  # saved at the epoch's first step: the new topology reads the whole epoch anew
    else:
        assert sorted(seen) == sorted(base_rows(first, block_rows))


def test_a_state_at_either_epoch_boundary_resumes_at_a_normal_epoch():
    block_rows = [[10, 10], [7], [13]]
    saved_by, restored_by = topology(ShardPolicy.AUTO, 4, 3), topology(ShardPolicy.AUTO, 2, 5)
    assert resume(Position(2, 0), saved_by, None, restored_by, block_rows) == (Position(2, 0), None)
    # The last step of a remainder epoch leads to the next epoch, which has no remainder.
    remainder = Remainder(2, saved_by.streams, ((0, 3, 10), (2, 0, 10)))
    steps = remainder_cut(saved_by, remainder.segments).plan(0).steps
    assert resume(Position(2, steps), saved_by, remainder, restored_by, block_rows) == (Position(3, 0), None)
    assert resume(Position(3, 0), saved_by, remainder, restored_by, block_rows) == (Position(3, 0), None)


def test_the_same_topology_resumes_at_the_same_position():
    block_rows = [[10, 10], [7], [13]]
    top = topology(ShardPolicy.AUTO, 4, 3)
    remainder = Remainder(1, topology(ShardPolicy.DATA, 2, 4).streams, ((0, 8, 40),))
    assert resume(Position(1, 2), top, remainder, top, block_rows) == (Position(1, 2), remainder)
    assert resume(Position(1, 2), top, None, topology(ShardPolicy.AUTO, 4, 3), block_rows) == (Position(1, 2), None)


def test_what_is_left_on_data_is_one_stream_past_whole_global_batches():
    block_rows = [[50, 50]]
    data = topology(ShardPolicy.DATA, 4, 5)  # global batch 20
    position, remainder = resume(Position(0, 3), data, None, topology(ShardPolicy.AUTO, 3, 2), block_rows)
    assert (position, remainder.segments) == (Position(0, 0), ((0, 60, 100),))
    cut = remainder_cut(topology(ShardPolicy.AUTO, 3, 2), remainder.segments)
    assert [cut.streams[p] for p in range(3)] == [((0, 60, 73),), ((0, 73, 86),), ((0, 86, 100),)]
    assert cut.plan(0).steps == 7  # ceil(14 / 2): the longest share, the others end on partial or empty batches


def test_off_every_new_pipeline_reads_what_is_left_of_one_stream():
    block_rows = [[30]]
    position, remainder = resume(
        Position(0, 2), topology(ShardPolicy.OFF, 2, 4), None, topology(ShardPolicy.OFF, 3, 5), block_rows
    )
    assert remainder.segments == ((0, 8, 30),)
    cut = remainder_cut(topology(ShardPolicy.OFF, 3, 5), remainder.segments)
    assert all(rows_of(cut.streams[p]) == rows_of(((0, 8, 30),)) for p in range(3))


def test_drop_remainder_delivers_each_row_at_most_once():
    block_rows = [[17, 23, 9], [31]]
    first = topology(ShardPolicy.AUTO, 3, 4, drop_remainder=True)
    seen = delivered(epoch_cut(first, block_rows), 0, 2)
    then = topology(ShardPolicy.AUTO, 2, 7, drop_remainder=True)
    _, remainder = resume(Position(0, 2), first, None, then, block_rows)
    cut = remainder_cut(then, remainder.segments)
    seen += delivered(cut, 0, cut.plan(0).steps)
    assert max(collections.Counter(seen).values()) == 1
    assert len(seen) > 80 - 2 * 7  # dropped: less than one step of the new topology


def test_slicing_segments():
    segments = ((0, 5, 10), (2, 0, 3), (1, 4, 8))
    assert slice_segments(segments, 3, 9) == ((0, 8, 10), (2, 0, 3), (1, 4, 5))
    assert slice_segments(segments, 12, 12) == ()


@pytest.mark.parametrize("policy", list(ShardPolicy))
def test_pipeline_rows_are_the_rows_of_the_assigned_pieces(policy):
    rng = random.Random(policy.value)
    for _ in range(20):
        block_rows = [[rng.randint(0, 30) for _ in range(rng.randint(0, 6))] for _ in range(rng.randint(5, 12))]
        workers = rng.randint(1, 5)
        context = InputContext(workers, 0, workers)
        pieces = assigned_pieces(block_rows, policy, context)
        assert pipeline_rows(block_rows, policy, context) == [sum(p.rows for p in mine) for mine in pieces]
        if policy is ShardPolicy.AUTO:  # the stored order's rows, cut into contiguous ranges
            stored = [(s, b, r) for s, blocks in enumerate(block_rows) for b, n in enumerate(blocks) for r in range(n)]
            assert [(p.shard, p.block, r) for mine in pieces for p in mine for r in range(p.start, p.stop)] == stored
