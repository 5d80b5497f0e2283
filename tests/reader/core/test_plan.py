"""Pure planning logic: sharding policies, equal steps per worker, seed 003's rebatching."""

import collections
import itertools

import numpy as np
import pytest

from reader.core import order
from reader.core.plan import InputContext, Position, ShardPolicy, assigned_pieces, plan_steps, replica_ranges
from schemas.errors import UsageError

UNEVEN = [[7, 7, 3], [40], [1], [13, 13, 13, 2], [25, 25], [9]]  # rows per block, per shard


def rows_of(pieces):
    return [(p.shard, p.block, r) for p in pieces for r in range(p.start, p.stop)]


@pytest.mark.parametrize(
    ("num_rows", "batch", "replicas", "expected"),
    [
        (6, 4, 2, [[[0, 1], [2, 3]], [[4], [5]]]),
        (4, 4, 5, [[[0], [1], [2], [3], []]]),
        (8, 4, 3, [[[0, 1], [2, 3], []], [[4, 5], [6, 7], []]]),
    ],
)
def test_rebatching_examples_of_seed_003(num_rows, batch, replicas, expected):
    context = InputContext(num_replicas_in_sync=replicas)
    plan = plan_steps([num_rows], batch, ShardPolicy.AUTO, context, drop_remainder=False)
    steps = []
    for step in range(plan.steps):
        start, stop = plan.step_range(step)
        steps.append([list(range(start + lo, start + hi)) for lo, hi in replica_ranges(stop - start, replicas)])
    assert steps == expected


def test_drop_remainder_drops_the_partial_global_batch():
    plan = plan_steps([6], 4, ShardPolicy.AUTO, InputContext(num_replicas_in_sync=2), drop_remainder=True)
    assert plan.steps == 1 and plan.step_range(0) == (0, 4)


@pytest.mark.parametrize("policy", [ShardPolicy.AUTO, ShardPolicy.FILE])
@pytest.mark.parametrize("workers", range(1, 17))
def test_file_and_auto_read_every_row_once_with_equal_steps(policy, workers):
    total = sum(map(sum, UNEVEN))
    if policy is ShardPolicy.FILE and workers > len(UNEVEN):
        with pytest.raises(UsageError, match="AUTO"):
            assigned_pieces(UNEVEN, policy, InputContext(num_input_pipelines=workers, num_replicas_in_sync=workers))
        return
    contexts = [InputContext(workers, w, workers) for w in range(workers)]
    per_worker = assigned_pieces(UNEVEN, policy, contexts[0])
    seen = collections.Counter(itertools.chain.from_iterable(rows_of(p) for p in per_worker))
    assert len(seen) == total and set(seen.values()) == {1}
    counts = [sum(p.rows for p in pieces) for pieces in per_worker]
    if policy is ShardPolicy.AUTO:
        assert max(counts) - min(counts) <= 1
    plans = [plan_steps(counts, 2 * workers, policy, c, drop_remainder=False) for c in contexts]
    assert len({p.steps for p in plans}) == 1
    delivered = sum(p.step_range(s)[1] - p.step_range(s)[0] for p in plans for s in range(p.steps))
    assert delivered == total


def test_data_policy_keeps_each_workers_slice_of_the_global_batch():
    # seed 003: 12 rows, global batch 4, 2 workers -> worker 0 [0,1],[4,5],[8,9]; worker 1 [2,3],[6,7],[10,11]
    got = []
    for worker in range(2):
        context = InputContext(2, worker, 2)
        pieces = assigned_pieces([[12]], ShardPolicy.DATA, context)
        plan = plan_steps(
            [sum(p.rows for p in ps) for ps in pieces], 4, ShardPolicy.DATA, context, drop_remainder=False
        )
        got.append([list(range(*plan.step_range(s))) for s in range(plan.steps)])
    assert got == [[[0, 1], [4, 5], [8, 9]], [[2, 3], [6, 7], [10, 11]]]


def test_data_policy_partial_global_batch_gives_the_last_worker_an_empty_slice():
    ranges = []
    for worker in range(2):
        context = InputContext(2, worker, 2)
        plan = plan_steps([10, 10], 4, ShardPolicy.DATA, context, drop_remainder=False)
        ranges.append([plan.step_range(s) for s in range(plan.steps)])
    assert ranges[0][-1] == (8, 10) and ranges[1][-1][0] == ranges[1][-1][1]


def test_off_gives_every_worker_everything_at_its_share_of_the_batch():
    context = InputContext(2, 1, 2)
    pieces = assigned_pieces([[12]], ShardPolicy.OFF, context)
    plan = plan_steps([sum(p.rows for p in ps) for ps in pieces], 4, ShardPolicy.OFF, context, drop_remainder=False)
    assert [plan.step_range(s) for s in range(plan.steps)] == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]


def test_fewer_blocks_than_workers_still_splits_rows_with_auto():
    per_worker = assigned_pieces([[5]], ShardPolicy.AUTO, InputContext(4, 0, 4))
    assert [sum(p.rows for p in pieces) for pieces in per_worker] == [1, 1, 1, 2]


def test_bad_contexts_and_batches_are_usage_errors():
    with pytest.raises(UsageError, match="input_pipeline_id"):
        InputContext(2, 2, 2)
    with pytest.raises(UsageError, match="multiple"):
        InputContext(2, 0, 3)
    with pytest.raises(UsageError, match="at least 1"):
        plan_steps([10], 0, ShardPolicy.AUTO, InputContext(), drop_remainder=False)
    with pytest.raises(UsageError, match="divisible"):
        plan_steps([10, 10], 5, ShardPolicy.AUTO, InputContext(2, 0, 2), drop_remainder=False)
    with pytest.raises(UsageError, match="AUTO, FILE"):
        ShardPolicy.parse("HASH")


def test_same_seed_same_order_and_epochs_differ():
    pieces = assigned_pieces(UNEVEN, ShardPolicy.AUTO, InputContext())[0]

    def stream(seed, epoch, reshuffle=True):
        windows = order.EpochOrder(tuple(pieces), 30, seed, reshuffle_each_epoch=reshuffle).windows(epoch)
        out = []
        for w in windows:
            rows = rows_of(w.pieces)
            out += [rows[i] for i in w.row_order()]
        return out

    assert stream(3, 0) == stream(3, 0)
    assert stream(3, 0) != stream(3, 1)
    assert stream(3, 0, reshuffle=False) == stream(3, 5, reshuffle=False)
    assert stream(3, 0) != stream(4, 0)
    assert sorted(stream(3, 0)) == sorted(rows_of(pieces))


def test_an_epoch_order_keeps_the_windows_of_the_epochs_around_the_last_asked():
    """A pass asks for its epoch's windows and the next one's; the next pass asks for those again (kept),
    and a restore that jumps back gets windows equal to a fresh computation. At most three epochs are kept."""
    pieces = tuple(assigned_pieces(UNEVEN, ShardPolicy.AUTO, InputContext())[0])
    kept = order.EpochOrder(pieces, 30, seed=3)
    for epoch in (0, 1, 1, 2, 3, 9, 0, 4):
        windows = kept.windows(epoch)
        assert windows == order.EpochOrder(pieces, 30, seed=3).windows(epoch)
        assert kept.windows(epoch) is windows  # asked again: the same list, not computed anew
        assert len(kept._computed) <= 3
    assert sorted(kept._computed) == [2, 3, 4]  # the farthest from the epoch asked went first


def test_unshuffled_windows_keep_stored_order():
    pieces = assigned_pieces(UNEVEN, ShardPolicy.AUTO, InputContext())[0]
    windows = order.EpochOrder(tuple(pieces), 50, seed=7, shuffle=False).windows(3)
    assert all(w.row_order() is None for w in windows)
    assert [p for w in windows for p in w.pieces] == pieces
    assert all(w.rows >= 50 for w in windows[:-1]) and np.diff([w.start for w in windows]).min() >= 50


def test_a_position_moves_to_the_next_epoch_after_its_last_step():
    assert Position(2, 0).after(3) == Position(2, 1)
    assert Position(2, 2).after(3) == Position(3, 0)
    assert Position(0, 0).after(1) == Position(1, 0)
    assert Position(1, 5) < Position(2, 0) < Position(2, 1)
