"""The mixture's plan: exact epoch shares, batches within one row of their weight, and the window row order."""

from __future__ import annotations

import numpy as np
import pytest

from reader.core.mixture import MixtureWindow
from reader.core.mixture_plan import MixturePlan, apportion, largest_remainder
from reader.core.plan import Piece


def test_largest_remainder_gives_the_left_rows_to_the_largest_fractions():
    assert largest_remainder(10, [3, 1]).tolist() == [8, 2]  # 7.5, 2.5: a tie goes to the first
    assert largest_remainder(100, [1, 1, 1]).tolist() == [34, 33, 33]
    assert largest_remainder(7, [0.5, 0.25, 0.25]).tolist() == [3, 2, 2]  # 3.5, 1.75, 1.75


@pytest.mark.parametrize("trial", range(4))
def test_every_batch_is_within_one_row_of_its_weight_and_every_epoch_exact(trial):
    rng = np.random.default_rng(trial)
    for _ in range(500):
        sources = int(rng.integers(1, 9))
        weights = (
            tuple(float(w) for w in rng.integers(1, 12, sources)) if trial % 2 else tuple(rng.random(sources) + 0.01)
        )
        plan = MixturePlan(
            tuple(int(r) for r in rng.integers(1, 500, sources)),
            weights,
            int(rng.integers(1, 5000)),
            int(rng.integers(1, 300)),
            bool(rng.integers(0, 2)),
        )
        table = plan.batch_quotas
        assert table.sum(axis=1).tolist() == plan.sizes
        assert table.sum(axis=0).tolist() == plan.quotas.tolist()
        assert plan.quotas.tolist() == largest_remainder(plan.delivered_rows, weights).tolist()
        assert (np.abs(table - np.outer(plan.sizes, plan.shares)) < 1 + 1e-9).all()


def test_a_dropped_partial_batch_leaves_whole_batches_only():
    plan = MixturePlan((100, 100), (1.0, 1.0), epoch_rows=250, batch=64, drop_remainder=True)
    assert plan.sizes == [64, 64, 64] and plan.delivered_rows == 192 and plan.quotas.tolist() == [96, 96]


def test_extras_are_spread_over_the_epoch_not_bunched_at_its_start():
    table = apportion([3000, 7000], [10] * 1000, [0.3, 0.7])  # every cell exact: no extras
    assert (table == [3, 7]).all()
    table = apportion([3500, 6500], [10] * 1000, [0.35, 0.65])  # 3.5: every other batch one more
    extras = table[:, 0] - 3
    assert extras.sum() == 500 and set(extras.tolist()) == {0, 1}
    behind = np.abs(np.cumsum(extras) - 0.5 * np.arange(1, 1001))  # against an even spread, batch by batch
    assert behind.max() <= 20


def test_epochs_continue_each_source_where_the_last_stopped():
    plan = MixturePlan((10, 1000), (1.0, 1.0), epoch_rows=100, batch=10, drop_remainder=False)
    assert [plan.source_start(0, epoch) for epoch in range(3)] == [0, 50, 100]


def test_a_window_row_order_gives_each_batch_its_quota_of_each_source():
    quotas = np.array([[3, 1], [2, 2], [4, 0]])
    pieces = (Piece(0, 0, 0, 9), Piece(1, 0, 0, 3))  # source 0's 9 rows, then source 1's 3
    for seed in (None, 7):
        window = MixtureWindow(pieces, start=0, rows=12, seed=seed, quotas=quotas, passes=((9,), (2, 1)))
        row_order = window.row_order()
        assert sorted(row_order.tolist()) == list(range(12))  # every loaded row once
        source = (row_order >= 9).astype(int)
        assert [np.bincount(source[lo:hi], minlength=2).tolist() for lo, hi in ((0, 4), (4, 8), (8, 12))] == (
            quotas.tolist()
        )
        source_1 = [position for position in row_order.tolist() if position >= 9]
        assert source_1[2] == 11  # its rows of a second pass come after those of the first
    assert window.row_order().tolist() == MixtureWindow(pieces, 0, 12, 7, quotas, ((9,), (2, 1))).row_order().tolist()
