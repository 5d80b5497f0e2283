"""Snapshots written once per session by real Beam pipelines, for the reader tests."""

import numpy as np
import pytest

from tests import helpers

UNEVEN_BATCH_SIZES = [37, 300, 5, 700, 120, 838]


@pytest.fixture(scope="session")
def range_root(tmp_path_factory):
    """Snapshots ``range<n>`` holding ids 0..n-1 in stored order, one shard each."""
    root = tmp_path_factory.mktemp("ranges")
    for n in (4, 6, 8, 10, 12):
        helpers.write_snapshot(root, f"range{n}", helpers.id_batches([n]))
    return root


@pytest.fixture(scope="session")
def uneven_snapshot(tmp_path_factory):
    """2000 rows in shards of uneven row counts: rows carry payloads of 4 to 400 bytes."""
    root = tmp_path_factory.mktemp("uneven")
    batches = helpers.id_batches(UNEVEN_BATCH_SIZES)
    for index, batch in enumerate(batches):
        width = 4 * 10 ** (index % 3)
        batch["payload"] = np.array([b"x" * width] * len(batch["id"]), dtype=object)
    return helpers.write_snapshot(
        root,
        "uneven",
        batches,
        compression="NONE",
        block_size_bytes=1800,
        shard_size_bytes=12_000,
    )


@pytest.fixture(scope="session")
def large_snapshot(tmp_path_factory):
    """100k small rows in 2000 blocks of 50 over several shards, to measure shuffle quality.

    With a bounded window, |Spearman| is about 1/sqrt(number of blocks): the
    block permutation is what spreads rows across the epoch.
    """
    root = tmp_path_factory.mktemp("large")
    batches = [{"id": np.arange(s, s + 10_000, dtype=np.int64)} for s in range(0, 100_000, 10_000)]
    return helpers.write_snapshot(root, "large", batches, block_size_bytes=400, shard_size_bytes=250_000)


@pytest.fixture(scope="session", params=[2048, 40_960], ids=["2KB-rows", "40KB-rows"])
def wide_snapshot(request, tmp_path_factory):
    """Rows of 2 KB (window copy, then one gather) or 40 KB (copied row by row from the blocks).

    Each row's bytes are derived from its id, so a misplaced row is detected.
    """
    width = request.param
    root = tmp_path_factory.mktemp(f"wide{width}")
    rows = 160 if width > 10_000 else 800
    ids = np.arange(rows, dtype=np.int64)
    payload = ((ids[:, None] * 7 + np.arange(width)[None, :]) % 251).astype(np.uint8)
    batches = [{"id": ids[s : s + 80], "payload": payload[s : s + 80]} for s in range(0, rows, 80)]
    return helpers.write_snapshot(root, "wide", batches, block_size_bytes=width * 3, shard_size_bytes=width * 60)
