"""A mixture job's definition and splits (``reader.service.mixture_jobs``), pure: what the consumer sends, the
dispatcher counts and the workers cut must agree."""

from __future__ import annotations

import numpy as np
import pytest

import reader
from reader.core.mixture import MixtureOrder
from reader.service.mixture_jobs import MixtureJob, MixtureSplits, windows_from
from schemas.errors import UsageError
from tests import helpers


@pytest.fixture(scope="module")
def mixture(tmp_path_factory):
    root = tmp_path_factory.mktemp("jobs")
    web = [
        helpers.write_snapshot(root / f"w{i}", f"w{i}", helpers.id_batches([start, 200, 300])[1:])
        for i, start in enumerate((0, 500))
    ]
    code = helpers.write_snapshot(root / "c", "c", helpers.id_batches([5000, 120])[1:])
    return reader.mixture({"web": web, "code": code}, weights={"web": 3, "code": 1}, epoch_rows=1000)


def test_the_definition_travels_as_json_and_rebuilds_the_mixture_from_the_snapshots_sent(mixture):
    job = MixtureJob.of(mixture, 40, 100, drop_remainder=False)
    assert job.member_counts == (2, 1) and job.batches_per_window == 3  # 100 rows: 3 batches of 40
    sent = MixtureJob.from_json(job.to_json())
    assert sent == job
    rebuilt = sent.mixture(mixture.union)
    assert rebuilt.source_rows == mixture.source_rows and rebuilt.weights == mixture.weights
    rows = sent.split_rows(rebuilt)
    assert rows.sum() == 1000 and (rows[:-1] == 120).all(), "windows of whole batches; the last holds the rest"
    windows = sent.order(rebuilt, seed=9).windows(0)
    local = MixtureOrder(mixture, mixture.plan(40, False), 3, 9).windows(0)
    assert [w.rows for w in windows] == rows.tolist() == [w.rows for w in local]
    assert all(np.array_equal(a.row_order(), b.row_order()) for a, b in zip(windows, local, strict=True))
    splits = MixtureSplits(rows)
    assert splits.split_count() == len(rows) and splits.split_rows(2) == 120
    resumed = list(windows_from(windows, 250))
    assert [(w.start, offset) for w, offset in resumed[:2]] == [(240, 10), (360, 0)]


@pytest.mark.parametrize(
    "text",
    [
        "{",
        '{"names": ["a"]}',
        '{"names":["a"],"weights":[1],"member_counts":[0],"epoch_rows":5,"batch":2,'
        '"batches_per_window":1,"drop_remainder":false}',
    ],
)
def test_a_malformed_definition_is_one_line(text):
    with pytest.raises(UsageError, match="malformed mixture definition") as refused:
        MixtureJob.from_json(text)
    assert "\n" not in str(refused.value)


def test_a_definition_with_other_snapshots_than_sent_is_refused(mixture):
    job = MixtureJob.of(mixture, 40, 100, drop_remainder=False)
    with pytest.raises(UsageError, match="a mixture of 3 snapshots was sent with 2"):
        job.mixture(reader.core.union.SnapshotUnion(mixture.union.members[:2]))
