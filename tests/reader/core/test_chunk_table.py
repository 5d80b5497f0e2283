"""The chunk table a cache download shares with the processes that join it (reader.core.cache.chunk_table)."""

import os
import threading

from reader.core.cache.chunk_table import ChunkTable


def test_a_joined_table_sees_the_owners_header_and_landed_chunks(tmp_path):
    path = str(tmp_path / "shard.snapcache-chunks")
    owner = ChunkTable.create(path, "shard.0123.snapcache-tmp", 4 << 20, 3)
    joined = ChunkTable.join(path)
    assert (joined.temp_name, joined.chunk_bytes, joined.chunks) == ("shard.0123.snapcache-tmp", 4 << 20, 3)
    assert [joined.landed(chunk) for chunk in range(3)] == [None] * 3
    owner.mark_landed(1, 0xDEADBEEF)
    joined.mark_landed(2, 0)  # a CRC32C of 0 is a landed chunk too
    assert [owner.landed(chunk) for chunk in range(3)] == [None, 0xDEADBEEF, 0]
    owner.remove()
    assert ChunkTable.join(path) is None  # the download ended: nothing to join
    assert joined.landed(1) == 0xDEADBEEF  # what joined it keeps reading its table
    assert os.listdir(tmp_path) == []


def test_a_table_that_is_not_whole_is_not_joined(tmp_path):
    path = tmp_path / "shard.snapcache-chunks"
    path.write_bytes(b"SNAPCHK1" + bytes(10))
    assert ChunkTable.join(str(path)) is None
    ChunkTable.create(str(path), "t", 1 << 20, 2).close()
    with open(path, "r+b") as table:  # a table cut short (its records do not match its chunk count)
        table.truncate(path.stat().st_size - 1)
    assert ChunkTable.join(str(path)) is None


def test_a_chunk_is_claimed_by_one_table_at_a_time_even_within_one_process(tmp_path):
    """Claims are open-file-description locks: two tables opened in one process exclude each other as two
    processes' do, and a claim waited for is taken when its holder lets go (or closes its table)."""
    path = str(tmp_path / "t")
    first, second = ChunkTable.create(path, "t.tmp", 1 << 20, 4), ChunkTable.join(path)
    assert first.claim(0, wait=False)
    assert not second.claim(0, wait=False)
    assert second.claim(1, wait=False)  # another chunk's claim is its own
    taken = threading.Event()

    def wait_for_claim():
        second.claim(0, wait=True)
        taken.set()

    waiter = threading.Thread(target=wait_for_claim)
    waiter.start()
    assert not taken.wait(0.3)
    first.release(0)
    assert taken.wait(10)
    waiter.join()
    assert not first.claim(0, wait=False)
    second.close()  # closing lets every claim go, as a process that ends does
    assert first.claim(0, wait=False) and first.claim(1, wait=False)
