"""The local cache of bucket shards (``cache=reader.CacheOptions(dir=...)``, reader.core.cache.shard_cache), on the S3
and GCS emulators.

GETs are counted by ``testing.http_proxy`` in front of the emulator; several
readers are real processes sharing one cache directory.
"""

import errno
import fcntl
import gc
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
import warnings

import numpy as np
import prometheus_client
import pytest
from prometheus_client.parser import text_string_to_metric_families

import reader
from reader import CacheOptions
from reader.core import blocks
from reader.core.cache import download_queue, entry_check, shard_cache, shard_fill
from reader.core.cache.shard_cache import OUTCOMES
from reader.service import WorkerConfig
from schemas import shard_codec
from schemas.errors import CorruptSnapshotError, UsageError
from tests import helpers

ROWS = 1200

#: A reader process: reads the snapshot through the cache and prints how many rows it got and their id sum;
#: with "hold", it stops after its first batch until a line arrives on stdin.
PROGRAM = textwrap.dedent(
    """
    import sys, reader
    uri, cache_dir, budget, hold = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "hold"
    rows = total = 0
    cache = reader.CacheOptions(dir=cache_dir, max_bytes=budget)
    for batch in reader.distributed_dataset(uri, 100, seed=1, cache=cache):
        rows += len(batch["id"])
        total += int(batch["id"].sum())
        if hold and rows == len(batch["id"]):
            print("reading", flush=True)
            sys.stdin.readline()
    print(rows, total, flush=True)
    """
)


@pytest.fixture(scope="module")
def local_snapshot(tmp_path_factory):
    """1200 rows of 3 KB (uncompressed, plain columns: later epochs read the cache directly) in 4 shards."""
    root = tmp_path_factory.mktemp("cached")
    batches = helpers.id_batches([300] * 4, image_shape=(32, 32, 3))
    return helpers.write_snapshot(
        root, "cached", batches, compression="NONE", block_size_bytes=64 << 10, shard_size_bytes=900_000
    )


def gets(proxy) -> int:
    return proxy.stats()["requests_by_method"].get("GET", 0)


def ids(snapshot, cache_dir, max_bytes="AUTO", **options) -> list[int]:
    cache = reader.CacheOptions(dir=str(cache_dir), max_bytes=max_bytes)
    batches = reader.distributed_dataset(snapshot, 100, seed=1, cache=cache, **options)
    return [int(i) for batch in batches for i in batch["id"]]


def entries(cache_dir) -> list[pathlib.Path]:
    return sorted(pathlib.Path(cache_dir).rglob(f"*{shard_cache.ENTRY_SUFFIX}"))


def test_later_epochs_read_the_cache_and_ask_the_bucket_for_nothing(local_snapshot, proxied, tmp_path):
    start, proxy = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))
    expected = ids(reader.open_snapshot(local_snapshot), tmp_path / "unused")
    before = gets(proxy)
    assert ids(snapshot, tmp_path / "cache") == expected
    first = gets(proxy) - before
    assert first > 0
    assert len(entries(tmp_path / "cache")) == snapshot.num_shards
    for entry in entries(tmp_path / "cache"):  # under <snapshot id>/<run id>/
        assert entry.parent.name == snapshot.metadata.run_id and entry.parent.parent.name == snapshot.snapshot_id
    assert not (tmp_path / "unused").exists()  # a local snapshot is never cached
    before = gets(proxy)
    assert ids(snapshot, tmp_path / "cache") == expected  # a later epoch (another dataset: nothing kept in memory)
    assert sorted(ids(snapshot, tmp_path / "cache", num_epochs=2)) == sorted(expected * 2)
    assert gets(proxy) - before == 0
    # The cache's counters, as a trainer's dashboard scrapes them (metrics=): 3 datasets opened each shard once.
    registry = prometheus_client.CollectorRegistry()
    assert ids(snapshot, tmp_path / "cache", metrics=registry) == expected
    shards, labels = snapshot.num_shards, {"cache_dir": str(tmp_path / "cache")}
    counted = {o: registry.get_sample_value("snapfeed_cache_shards_total", labels | {"outcome": o}) for o in OUTCOMES}
    assert counted == {"download": shards, "joined": 0, "entry": 3 * shards, "bucket": 0}
    total_bytes = sum(shard.num_bytes for shard in snapshot.metadata.shards)
    assert registry.get_sample_value("snapfeed_cache_downloaded_bytes_total", labels) == total_bytes


def run_readers(uri, cache_dir, count, budget=1 << 30) -> list[str]:
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", PROGRAM, uri, str(cache_dir), str(budget), "go"],
            stdout=subprocess.PIPE,
            text=True,
            env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
        )
        for _ in range(count)
    ]
    outputs = [process.communicate(timeout=120)[0].strip() for process in processes]
    assert all(process.returncode == 0 for process in processes), outputs
    return outputs


@pytest.mark.slow  # three reader processes, 10-15 s on 2 cores
def test_processes_sharing_a_cache_download_each_shard_once(local_snapshot, proxied, tmp_path):
    """Three reader processes at once, on one cache: the bucket serves the bytes of one reader's ranged GETs
    (the first to open a shard downloads it, the others join its download)."""
    start, proxy = proxied
    uri = start(local_snapshot)
    shards = reader.open_snapshot(uri).num_shards
    expected = f"{ROWS} {ROWS * (ROWS - 1) // 2}"

    def requests(run) -> tuple[int, int]:  # (GETs, bytes ranged GETs asked for) of run()
        before = proxy.stats()
        run()
        after = proxy.stats()
        return gets(proxy) - before["requests_by_method"].get("GET", 0), after["ranged_bytes"] - before["ranged_bytes"]

    alone, alone_bytes = requests(lambda: run_readers(uri, tmp_path / "alone", 1))
    direct, _ = requests(lambda: run_readers(uri, tmp_path / "direct", 1, budget=1))  # no shard fits: read directly
    opening, opening_bytes = requests(  # the manifest: every process reads it
        lambda: subprocess.run(
            [sys.executable, "-c", f"import reader; reader.open_snapshot({uri!r}).element_spec"], check=True
        )
    )
    outputs = []
    shared, shared_bytes = requests(lambda: outputs.extend(run_readers(uri, tmp_path / "shared", 3)))
    assert outputs == [expected] * 3
    assert shared_bytes == alone_bytes + 2 * opening_bytes, (alone_bytes, opening_bytes, shared_bytes)
    # On GCS opening a shard is a request: a joining process opens one only to download a chunk of it.
    assert alone + 2 * opening <= shared <= alone + 2 * opening + 2 * shards, (alone, opening, shared)
    assert shared < 3 * direct
    assert len(entries(tmp_path / "shared")) == reader.open_snapshot(uri).num_shards


@pytest.mark.slow  # two reader processes
@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_eviction_under_a_small_budget_spares_what_another_process_reads(local_snapshot, proxied, tmp_path):
    start, proxy = proxied
    uri = start(local_snapshot)
    snapshot = reader.open_snapshot(uri)
    cache = tmp_path / "cache"
    largest = max(shard.num_bytes for shard in snapshot.metadata.shards)
    budget = largest + 1  # room for one shard (or a few of the smaller ones)
    cache.mkdir()
    (cache / "notes.txt").write_text("mine")  # not a cache entry: never deleted
    holder = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, uri, str(cache), str(budget), "hold"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    try:
        assert holder.stdout.readline().strip() == "reading"
        held = entries(cache)
        assert held and sum(entry.stat().st_size for entry in held) <= budget  # the others: read from the bucket
        expected = list(range(ROWS))
        assert sorted(ids(snapshot, cache, max_bytes=budget)) == expected
        assert entries(cache) == held and held[0].exists()  # the entry being read stayed
        output, _ = holder.communicate("go\n", timeout=120)
        assert output.split() == [str(ROWS), str(ROWS * (ROWS - 1) // 2)]
    finally:
        holder.kill()
    gc.collect()  # the datasets read above, which hold their entries for as long as they live
    other = reader.open_snapshot(start(local_snapshot, "other"))  # another snapshot, the holder gone: evicts now
    assert sorted(ids(other, cache, max_bytes=budget)) == list(range(ROWS))
    assert not any(entry.exists() for entry in held)
    assert entries(cache) and all(entry.parent.parent.name == "other" for entry in entries(cache))
    assert sum(entry.stat().st_size for entry in entries(cache)) <= budget
    assert (cache / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_corrupt_entry_is_downloaded_again_never_delivered(local_snapshot, proxied, tmp_path):
    start, proxy = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))

    def images():
        batches = reader.distributed_dataset(
            snapshot, 100, seed=1, cache=reader.CacheOptions(dir=str(tmp_path / "cache"))
        )
        return np.concatenate([batch["image"] for batch in batches])

    expected = images()
    entry = entries(tmp_path / "cache")[0]
    good = entry.read_bytes()
    with open(entry, "r+b") as file:  # same size, a block's bytes flipped
        file.seek(len(good) // 2)
        file.write(bytes(255 - b for b in good[len(good) // 2 : len(good) // 2 + 64]))
    before = gets(proxy)
    np.testing.assert_array_equal(images(), expected)
    assert gets(proxy) - before > 0  # that shard was fetched again
    assert entry.read_bytes() == good


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_new_process_trusts_an_entry_unchanged_since_its_check(local_snapshot, proxied, tmp_path, monkeypatch):
    """An entry records its check (reader.core.cache.entry_check): a new process reads it without reading it whole
    first, unless read=ReadOptions(verify_checksums=True), which also catches bytes changed with the mtime put back."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))
    cache = tmp_path / "cache"

    def images(**read):
        batches = reader.distributed_dataset(
            snapshot, 100, seed=1, read=reader.ReadOptions(**read), cache=reader.CacheOptions(dir=str(cache))
        )
        return np.concatenate([batch["image"] for batch in batches])

    expected = images()
    with open(entries(cache)[0], "rb") as entry:
        if entry_check.recorded(entry.fileno()) is None:
            pytest.skip(f"{tmp_path} keeps no user xattrs: every process checks every entry there")
    checked = []
    checksum_file = shard_codec.checksum_file
    monkeypatch.setattr(
        shard_codec, "checksum_file", lambda handle, **how: checked.append(handle.name) or checksum_file(handle, **how)
    )
    shard_cache.open_cache.cache_clear()  # a cache object as a new process has one: nothing checked in it yet
    np.testing.assert_array_equal(images(), expected)
    assert checked == []
    shard_cache.open_cache.cache_clear()
    np.testing.assert_array_equal(images(verify_checksums=True), expected)
    assert len(checked) == snapshot.num_shards
    entry = entries(cache)[0]
    stat, good = entry.stat(), entry.read_bytes()
    with open(entry, "r+b") as file:  # bytes changed in place, then its mtime put back
        file.seek(len(good) // 2)
        file.write(bytes(255 - b for b in good[len(good) // 2 : len(good) // 2 + 64]))
    os.utime(entry, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    shard_cache.open_cache.cache_clear()
    np.testing.assert_array_equal(images(verify_checksums=True), expected)
    assert entry.read_bytes() == good  # deleted and downloaded again


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_downloads_abandoned_by_an_ended_process_are_deleted_never_one_under_way(local_snapshot, proxied, tmp_path):
    """A process killed mid-download leaves its preallocated temporary file and its chunk table (or one it was
    writing); the next download there deletes them, but not a download another process still holds (writes),
    nor the table of an entry whose download lock is held."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))
    cache = shard_cache.open_cache(tmp_path / "cache", None)
    run = cache.entry_path(snapshot, 0).parent
    run.mkdir(parents=True)
    abandoned, under_way = (run / f"shard-x.arrow.{name}{shard_cache.TEMP_SUFFIX}" for name in ("dead", "live"))
    abandoned.write_bytes(b"\0" * 1000)
    under_way.write_bytes(b"\0" * 1000)
    tables = {name: run / f"shard-{name}.arrow{shard_cache.CHUNKS_SUFFIX}" for name in ("dead", "live")}
    staged = run / f"shard-dead.arrow{shard_cache.CHUNKS_SUFFIX}.0123456789ab"
    for table in (*tables.values(), staged):
        table.write_bytes(b"SNAPCHK1")
    with open(under_way, "rb") as held, open(run / f"shard-live.arrow{shard_cache.LOCK_SUFFIX}", "wb") as owning:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # as the downloading process holds it
        fcntl.flock(owning.fileno(), fcntl.LOCK_EX)  # and the download lock of the entry it downloads
        assert sorted(ids(snapshot, tmp_path / "cache")) == list(range(ROWS))
        assert not abandoned.exists() and under_way.exists()
        assert not tables["dead"].exists() and not staged.exists() and tables["live"].exists()
    assert len(entries(tmp_path / "cache")) == snapshot.num_shards


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_rewritten_snapshot_never_serves_the_old_runs_bytes(tmp_path, proxied):
    start, _ = proxied
    batches = helpers.id_batches([200, 200])
    local = helpers.write_snapshot(tmp_path / "root", "daily", batches, compression="NONE", shard_size_bytes=8000)
    old = reader.open_snapshot(start(local))
    assert sorted(ids(old, tmp_path / "cache")) == list(range(400))
    for batch in batches:
        batch["id"] += 1000
    helpers.write_snapshot(tmp_path / "root", "daily", batches, compression="NONE", shard_size_bytes=8000)
    new = reader.open_snapshot(start(local))  # --mode=write: a new run under the same snapshot id
    assert new.metadata.run_id != old.metadata.run_id
    assert sorted(ids(new, tmp_path / "cache")) == list(range(1000, 1400))
    runs = {entry.parent.name for entry in entries(tmp_path / "cache")}
    assert runs == {old.metadata.run_id, new.metadata.run_id}


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_an_unwritable_cache_warns_once_and_the_epoch_reads_the_bucket(local_snapshot, proxied, tmp_path):
    start, _ = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))
    if os.geteuid() == 0:  # root writes through a read-only mode: a directory that cannot be made instead
        (tmp_path / "file").write_text("")
        cache = tmp_path / "file" / "cache"
    else:
        cache = tmp_path / "cache"
        cache.mkdir(mode=0o555)
    shard_cache.open_cache.cache_clear()  # a fresh cache object: its one warning not given yet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sorted(ids(snapshot, cache)) == list(range(ROWS))
    said = [str(w.message) for w in caught if "cache" in str(w.message)]
    assert len(said) == 1 and "reads from the bucket directly" in said[0], said


#: A reader process whose files may not grow past ``limit`` bytes (a disk with no room for a shard): prints its
#: rows, their id sum and the cache's warnings, one per line.
FULL_DISK_PROGRAM = textwrap.dedent(
    """
    import resource, signal, sys, warnings
    import reader
    uri, cache_dir, limit = sys.argv[1], sys.argv[2], int(sys.argv[3])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    rows = total = 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for batch in reader.distributed_dataset(uri, 100, seed=1, cache=reader.CacheOptions(dir=cache_dir)):
            rows += len(batch["id"])
            total += int(batch["id"].sum())
    print(rows, total)
    for warning in caught:
        if "cache" in str(warning.message):
            print(" ".join(str(warning.message).split()))
    """
)


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_full_cache_disk_warns_once_and_the_epoch_reads_the_bucket(local_snapshot, proxied, tmp_path):
    """A cache disk with no room for a shard: one warning, every row read from the bucket, nothing left behind."""
    start, _ = proxied
    uri = start(local_snapshot)
    cache = tmp_path / "cache"
    completed = subprocess.run(
        [sys.executable, "-c", FULL_DISK_PROGRAM, uri, str(cache), str(64 << 10)],
        capture_output=True,
        text=True,
        timeout=120,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    lines = completed.stdout.splitlines()
    assert lines[0].split() == [str(ROWS), str(ROWS * (ROWS - 1) // 2)]
    assert len(lines) == 2 and "cannot be used" in lines[1] and "reads from the bucket directly" in lines[1], lines
    assert not entries(cache) and not list(cache.rglob(f"*{shard_cache.TEMP_SUFFIX}"))  # nor a partial download


@pytest.mark.parametrize("object_store", ["s3", "gs"], indirect=True)
def test_a_download_whose_get_is_lost_is_retried_and_cached_whole(local_snapshot, proxied, tmp_path):
    """A shard's ranged GET that loses its response mid-download is asked again: every row, every entry whole."""
    start, proxy = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))
    proxy.drop_response(lambda method, target, headers: method == "GET" and "range" in headers, times=2)
    assert sorted(ids(snapshot, tmp_path / "cache")) == list(range(ROWS))
    assert proxy.stats()["responses_dropped"] == 2
    cached = entries(tmp_path / "cache")
    assert len(cached) == snapshot.num_shards
    for entry in cached:
        shard = int(entry.name.split(".arrow")[0].rsplit("-", 1)[1])
        assert entry.read_bytes() == pathlib.Path(reader.open_snapshot(local_snapshot).shard_path(shard)).read_bytes()


@pytest.fixture
def chunked_snapshot(tmp_path):
    """8000 rows of 3 KB in 1 MiB blocks and shards of three 4 MiB download chunks (and a small last one)."""
    batches = helpers.id_batches([2000] * 4, image_shape=(32, 32, 3))
    options = {"block_size_bytes": 1 << 20, "shard_size_bytes": 12_000_000}
    return helpers.write_snapshot(tmp_path, "chunked", batches, compression="NONE", **options)


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_download_is_read_directly_as_it_lands_and_reads_ahead_move_its_chunks_up(
    chunked_snapshot, proxied, tmp_path, monkeypatch
):
    """A shard downloading into the cache is read as a local one is, straight into the window's memory (no
    fetched block held in the reader's buffers), and the windows read ahead have their chunks downloaded
    before the rest of the download. Here nothing lands that no read asked for: the epoch ends only
    because reads (and reads ahead) ask for every chunk they need."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(chunked_snapshot))
    asked: dict[tuple[int, int], int] = {}  # (download, chunk): the most urgent priority it was queued with
    asked_changed = threading.Condition()
    first_asked: dict[
        int, tuple[int, bool]
    ] = {}  # download: (priority, whether its last chunk) of its first chunk queued
    push, land = download_queue.Queue.push, shard_fill.Filling.land

    def recorded(queue, priority, filling, chunk):
        with asked_changed:
            first_asked.setdefault(id(filling), (priority, chunk == len(filling._landed) - 1))
            key = (id(filling), chunk)
            asked[key] = min(priority, asked.get(key, priority))
            asked_changed.notify_all()
        push(queue, priority, filling, chunk)

    def when_asked(filling, chunk):
        with asked_changed:
            asked_changed.wait_for(lambda: asked.get((id(filling), chunk), 9) < download_queue.BACKGROUND, 60)
        return land(filling, chunk)

    fetches = []
    monkeypatch.setattr(shard_fill, "CHUNK_BYTES", 256 << 10)  # a window's blocks are a few of a shard's chunks
    monkeypatch.setattr(download_queue.Queue, "push", recorded)
    monkeypatch.setattr(shard_fill.Filling, "land", when_asked)
    monkeypatch.setattr(blocks, "Fetch", lambda *args, **kwargs: fetches.append(args))
    got = ids(snapshot, tmp_path / "cache", shuffle_buffer_size=1000)
    assert sorted(got) == list(range(8000))
    assert not fetches, "blocks of a download were fetched into buffers, not read directly"
    priorities = list(asked.values())
    assert priorities.count(download_queue.AHEAD) > 0, priorities  # first asked for by a read ahead
    # The footer, which opening a shard reads at once, is queued before the rest of its download.
    assert set(first_asked.values()) == {(download_queue.DEMANDED, True)} and len(first_asked) == snapshot.num_shards


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_download_read_directly_is_checked_as_asked_and_a_corrupt_block_never_delivered(
    chunked_snapshot, proxied, tmp_path
):
    """ReadOptions(verify_checksums=) applies to a shard read while it downloads as to any other: "blocks"
    checks each block before its rows are delivered, True the whole shard before its first block; a byte
    changed in the bucket is then an error naming the shard, never rows."""
    start, _ = proxied
    local = pathlib.Path(tmp_path / "copy")
    shutil.copytree(chunked_snapshot, local)
    uri = start(str(local), "good")
    expected = sorted(range(8000))
    for verify in ("blocks", True):
        shard_cache.open_cache.cache_clear()
        checked = reader.ReadOptions(verify_checksums=verify)
        assert sorted(ids(reader.open_snapshot(uri), tmp_path / f"cache-{verify}", read=checked)) == expected
    bad = pathlib.Path(reader.open_snapshot(str(local)).shard_path(1))
    with open(bad, "r+b") as shard:  # one byte of an image in the shard's second chunk
        shard.seek(shard_fill.CHUNK_BYTES + 1000)
        byte = shard.read(1)
        shard.seek(-1, os.SEEK_CUR)
        shard.write(bytes([byte[0] ^ 0xFF]))
    corrupt = reader.open_snapshot(start(str(local), "bad"))
    for verify in ("blocks", True):
        shard_cache.open_cache.cache_clear()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "not cached: ... corrupt", the download's own finding
            with pytest.raises(CorruptSnapshotError, match=bad.name):
                ids(corrupt, tmp_path / f"bad-cache-{verify}", read=reader.ReadOptions(verify_checksums=verify))


def test_download_threads_kept_for_reads_never_take_background_chunks():
    """Of the download threads, the urgent ones take only chunks a read waits for (or will soon): with every
    other thread busy on a background chunk, a demanded one is downloaded at once, and a background one waits."""

    class Download:
        def __init__(self, hold: threading.Event | None = None) -> None:
            self.landed: list[int] = []
            self.hold = hold
            self.changed = threading.Condition()

        def claim(self, chunk):
            return True

        def land(self, chunk):
            if self.hold is not None:
                assert self.hold.wait(30)
            with self.changed:
                self.landed.append(chunk)
                self.changed.notify_all()

    release = threading.Event()
    queue = download_queue.Queue(threads=2, urgent_threads=1)
    busy, other = Download(hold=release), Download()
    try:
        queue.push(download_queue.BACKGROUND, busy, 0)  # the one general thread, held
        queue.push(download_queue.BACKGROUND, other, 1)  # no thread may take it: the other one is urgent only
        queue.push(download_queue.DEMANDED, other, 2)
        with other.changed:
            assert other.changed.wait_for(lambda: 2 in other.landed, 30)
        queue.push(download_queue.AHEAD, other, 3)
        with other.changed:
            assert other.changed.wait_for(lambda: 3 in other.landed, 30)
            assert other.landed == [2, 3], "a background chunk was taken by an urgent thread"
    finally:
        release.set()
    with other.changed:
        assert other.changed.wait_for(lambda: 1 in other.landed, 30)


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_cache_disk_failing_mid_download_warns_once_and_the_rest_is_read_from_the_bucket(
    chunked_snapshot, proxied, tmp_path, monkeypatch
):
    """The disk fills up after a download's first chunk landed: that chunk is read from the file, every
    other byte from the bucket (never the preallocated zeros of the file), with one warning."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(chunked_snapshot))
    write_all = shard_fill._write_all

    def full_after_the_first_chunk(descriptor, data, offset):
        if offset >= shard_fill.CHUNK_BYTES:
            raise OSError(errno.ENOSPC, "No space left on device")
        write_all(descriptor, data, offset)

    monkeypatch.setattr(shard_fill, "_write_all", full_after_the_first_chunk)
    shard_cache.open_cache.cache_clear()  # a fresh cache object: its one warning not given yet
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = reader.distributed_dataset(
            snapshot, 100, seed=1, cache=reader.CacheOptions(dir=str(tmp_path / "cache"))
        )
        seen = np.zeros(8000, dtype=np.int64)
        for batch in batches:
            np.add.at(seen, batch["id"], 1)
            np.testing.assert_array_equal(batch["value"], batch["id"] * 0.5)
            np.testing.assert_array_equal(batch["image"][:, 0, 0, 0], batch["id"] % 251)
    assert (seen == 1).all()
    said = [str(w.message) for w in caught if "cache" in str(w.message)]
    assert len(said) == 1 and "No space left" in said[0], said
    local = reader.open_snapshot(chunked_snapshot)
    for entry in entries(tmp_path / "cache"):  # only a shard of one chunk, landed before the disk filled up
        shard = int(entry.name.split(".arrow")[0].rsplit("-", 1)[1])
        assert snapshot.metadata.shards[shard].num_bytes <= shard_fill.CHUNK_BYTES
        assert entry.read_bytes() == pathlib.Path(local.shard_path(shard)).read_bytes()
    assert not list((tmp_path / "cache").rglob(f"*{shard_cache.TEMP_SUFFIX}"))


@pytest.mark.parametrize("object_store", ["s3"], indirect=True)
def test_a_download_landing_out_of_order_is_checked_whole_and_a_corrupt_one_never_cached(
    chunked_snapshot, proxied, tmp_path, monkeypatch
):
    """A download's CRC32C is folded in file order as chunks land: chunks that land before the ones ahead
    of them are read back from the file, so an entry is the manifest's bytes whatever order its chunks
    landed in; a shard whose bytes in the bucket do not match the manifest is read but never cached."""
    start, _ = proxied
    local = pathlib.Path(tmp_path / "copy")
    shutil.copytree(chunked_snapshot, local)
    snapshot = reader.open_snapshot(str(local))
    bad = pathlib.Path(snapshot.shard_path(1))
    with open(bad, "r+b") as shard:  # one byte of an image in the shard's second chunk
        shard.seek(shard_fill.CHUNK_BYTES + 1000)
        byte = shard.read(1)
        shard.seek(-1, os.SEEK_CUR)
        shard.write(bytes([byte[0] ^ 0xFF]))
    snapshot = reader.open_snapshot(start(str(local)))
    land = shard_fill.Filling.land

    def first_chunk_last(filling, chunk):
        if chunk == 0 and len(filling._landed) == 3:
            assert filling._landed[1].wait(60) and filling._landed[2].wait(60)
        return land(filling, chunk)

    monkeypatch.setattr(shard_fill.Filling, "land", first_chunk_last)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert sorted(ids(snapshot, tmp_path / "cache")) == list(range(8000))
    said = [str(w.message) for w in caught if "not cached" in str(w.message)]
    assert len(said) == 1 and bad.name in said[0] and "corrupt" in said[0], said
    cached = {int(entry.name.split(".arrow")[0].rsplit("-", 1)[1]): entry for entry in entries(tmp_path / "cache")}
    assert sorted(cached) == [shard for shard in range(snapshot.num_shards) if shard != 1]
    assert [-(-snapshot.metadata.shards[shard].num_bytes // shard_fill.CHUNK_BYTES) for shard in cached].count(3)
    for shard, entry in cached.items():
        assert entry.read_bytes() == pathlib.Path(reader.open_snapshot(str(local)).shard_path(shard)).read_bytes()


def test_a_download_reserved_but_not_yet_allocated_counts_against_the_budget(tmp_path, monkeypatch):
    """Two shards opened at once under a budget for one: the second sees the first's reservation at its full
    size while the first is still allocating it (it once counted as an empty file: both were downloaded)."""
    cache = shard_cache.ShardCache(tmp_path / "cache", budget_bytes=1000)
    (tmp_path / "cache").mkdir()
    allocating, release = threading.Event(), threading.Event()
    fallocate = os.posix_fallocate

    def slow_fallocate(descriptor, offset, length):  # the first download's allocation waits for the second
        if not allocating.is_set():
            allocating.set()
            assert release.wait(30)
        fallocate(descriptor, offset, length)

    monkeypatch.setattr(os, "posix_fallocate", slow_fallocate)
    first: list = []
    thread = threading.Thread(target=lambda: first.append(cache._reserve(tmp_path / "cache" / "a.snapcache", 800)))
    thread.start()
    try:
        assert allocating.wait(30)
        assert cache._reserve(tmp_path / "cache" / "b.snapcache", 800) is None, "no room: the first holds 800 bytes"
    finally:
        release.set()
        thread.join(30)
    temp, descriptor = first[0]
    assert os.fstat(descriptor).st_size == 800
    os.close(descriptor)


def test_cache_options_are_checked(tmp_path, monkeypatch, local_snapshot):
    with pytest.raises(UsageError, match="not on local disk"):
        reader.distributed_dataset(local_snapshot, 10, cache=reader.CacheOptions(dir="s3://bucket/cache"))
    with pytest.raises(UsageError, match="max_bytes=0"):
        reader.distributed_dataset(local_snapshot, 10, cache=reader.CacheOptions(dir=str(tmp_path), max_bytes=0))
    monkeypatch.setenv(shard_cache.ENV_DIR, str(tmp_path / "mine"))
    assert shard_cache.resolve_dir("auto") == tmp_path / "mine"
    monkeypatch.delenv(shard_cache.ENV_DIR)
    assert shard_cache.resolve_dir("AUTO") == pathlib.Path("~/.cache/snapfeed").expanduser()
    assert 0 < shard_cache.auto_budget(tmp_path / "new" / "dir") <= shard_cache.AUTO_BUDGET_BYTES


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_service_workers_read_bucket_shards_through_the_cache(local_snapshot, proxied, tmp_path):
    """Two workers of one host with ``cache_dir=`` (``--cache_dir``): the shards are downloaded once, and a second
    epoch asks the bucket for nothing."""
    from reader.service import DispatchServer, WorkerServer
    from tests.reader.service.probes import ids_of, wait_for_workers

    start, proxy = proxied
    snapshot = reader.open_snapshot(start(local_snapshot))
    dispatcher = DispatchServer().start()
    cache = str(tmp_path / "cache")
    workers = [
        WorkerServer(
            WorkerConfig(dispatcher_address=dispatcher.target, metrics_port=0, cache=CacheOptions(dir=cache))
        ).start()
        for _ in range(2)
    ]
    try:
        wait_for_workers(dispatcher.target, 2)
        read = reader.distributed_dataset(snapshot, 100, service=dispatcher.target, seed=3)
        assert ids_of(read) == {i: 1 for i in range(ROWS)}
        assert len(entries(tmp_path / "cache")) == snapshot.num_shards
        before = gets(proxy)
        read = reader.distributed_dataset(snapshot, 100, service=dispatcher.target, seed=4)
        assert ids_of(read) == {i: 1 for i in range(ROWS)}
        assert gets(proxy) - before == 0
        # Each worker serves its cache's counts (both workers of this process share one cache object).
        for worker in workers:
            with urllib.request.urlopen(worker.metrics_target, timeout=10) as response:
                families = text_string_to_metric_families(response.read().decode())
            downloads = {
                sample.labels["worker"]: sample.value
                for family in families
                for sample in family.samples
                if sample.name == "snapfeed_cache_shards_total" and sample.labels["outcome"] == "download"
            }
            assert downloads == {worker.target: snapshot.num_shards}
    finally:
        for worker in workers:
            worker.stop()
        dispatcher.stop()


def test_a_process_forked_while_its_parent_downloads_reads_the_rest_from_the_bucket(proxied, tmp_path, monkeypatch):
    """A DataLoader worker forked while the trainer downloads shards into the cache: the downloads go on in
    the parent, on threads the fork did not copy. The child reads what had not landed from the bucket, not
    waiting for chunks that would never land, and closes its copy of each download's lock; the parent's
    downloads still end as entries."""
    start, _ = proxied
    # Shards of 3 chunks (and a small last one): each one's middle chunk is held in the parent until the
    # child is done (its footer, in the last chunk, lands: the parent opens it as a first read would).
    batches = helpers.id_batches([2000] * 4, image_shape=(32, 32, 3))
    options = {"block_size_bytes": 1 << 20, "shard_size_bytes": 12_000_000}
    local = helpers.write_snapshot(tmp_path, "big", batches, compression="NONE", **options)
    snapshot = reader.open_snapshot(start(local))
    chunks = [-(-shard.num_bytes // shard_fill.CHUNK_BYTES) for shard in snapshot.metadata.shards]
    assert chunks.count(3) == 2
    parent, release, land = os.getpid(), threading.Event(), shard_fill.Filling.land

    def middle_chunks_held(filling, chunk):
        if chunk == 1 and len(filling._landed) == 3 and os.getpid() == parent:
            release.wait(120)
        return land(filling, chunk)

    monkeypatch.setattr(shard_fill.Filling, "land", middle_chunks_held)
    cache = tmp_path / "cache"
    dataset = reader.distributed_dataset(snapshot, 100, seed=1, num_epochs=1, cache=reader.CacheOptions(dir=str(cache)))
    source = dataset._source._pipeline.source  # test-only access: open the shards, as a first read would
    source._files.open_many(range(snapshot.num_shards), 2)
    downloads = [filling for filling in source._files._entries if isinstance(filling, shard_fill.Filling)]
    held = [filling for filling in downloads if len(filling._landed) == 3]  # under way until released
    assert len(downloads) == snapshot.num_shards and len(held) == 2

    try:
        status, locks_open, got = helpers.epoch_in_forked_child(
            dataset, lambda: len(_open_locks(filling._entry for filling in held))
        )
    finally:
        release.set()
    assert status == 0
    assert sorted(got) == list(range(8000)) and locks_open == 0
    for filling in downloads:
        filling.wait_checked()
    assert len(entries(cache)) == snapshot.num_shards
    assert sorted(ids(snapshot, cache)) == list(range(8000))


def _open_locks(entries) -> list[str]:
    """The download locks of ``entries`` that this process has open (a descriptor's number alone may have
    been reused by then)."""
    locks, found = {entry + shard_cache.LOCK_SUFFIX for entry in entries}, []
    for descriptor in os.listdir("/proc/self/fd"):
        try:
            path = os.readlink(f"/proc/self/fd/{descriptor}")
        except OSError:
            continue  # the listing's own descriptor, closed by now
        if path in locks:
            found.append(path)
    return found


#: A process that starts downloading every shard of a snapshot into a cache and holds chunk 1 of each: before
#: its claim ("land": another process may download it meanwhile) or holding it ("download": mid-GET). It
#: says "downloading" once every download is under way, lets go at a line on stdin, says "done" once the
#: downloads are entries; it gives up (exit 3) when held a minute.
OWNER = textwrap.dedent(
    """
    import os, sys, threading, reader
    from reader.core.cache import shard_fill
    uri, cache_dir, where = sys.argv[1], sys.argv[2], sys.argv[3]
    release, name = threading.Event(), "land" if where == "land" else "_download"
    original = getattr(shard_fill.Filling, name)
    def held(filling, chunk):
        if chunk == 1 and not release.wait(60):
            os._exit(3)
        return original(filling, chunk)
    setattr(shard_fill.Filling, name, held)
    dataset = reader.distributed_dataset(uri, 100, seed=1, num_epochs=1, cache=reader.CacheOptions(dir=cache_dir))
    source = dataset._source._pipeline.source  # test-only access: open the shards, as a first read would
    source._files.open_many(range(source._snapshot.num_shards), 4)
    print("downloading", flush=True)
    sys.stdin.readline()
    release.set()
    for filling in source._files._entries:
        filling.wait_checked()
    print("done", flush=True)
    """
)


def start_owner(uri, cache_dir, where) -> subprocess.Popen:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, uri, str(cache_dir), where],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert owner.stdout.readline().strip() == "downloading"
    return owner


@pytest.mark.parametrize("object_store", ["s3", "gs"], indirect=True)
def test_a_process_joins_a_download_under_way_and_each_byte_is_downloaded_once(chunked_snapshot, proxied, tmp_path):
    """A process opening shards that another process is downloading reads the chunks already landed and
    downloads the ones its reads need into the same file: its epoch ends while the other's downloads are
    still held part way (it never waits for a whole shard); the owner then takes up what it landed without a
    GET, finishes the entries, and the bytes downloaded by the two processes together are the shards' once."""
    start, proxy = proxied
    uri = start(chunked_snapshot)
    snapshot = reader.open_snapshot(uri)
    cache = tmp_path / "cache"
    opening = proxy.stats()["ranged_bytes"]
    subprocess.run([sys.executable, "-c", f"import reader; reader.open_snapshot({uri!r}).element_spec"], check=True)
    opening = proxy.stats()["ranged_bytes"] - opening  # what any process reads of the manifest
    before = proxy.stats()["ranged_bytes"]
    owner = start_owner(uri, cache, "land")
    try:
        assert sorted(ids(snapshot, cache)) == list(range(8000))
        assert owner.poll() is None, "the owner's downloads ended before this process's epoch did"
        held = sum(shard_fill.chunk_count(s.num_bytes, shard_fill.CHUNK_BYTES) > 1 for s in snapshot.metadata.shards)
        counts = shard_cache.opened_caches()[-1].counts()  # the one-chunk shard is an entry already
        assert held >= 2 and counts["joined"] == held and counts["entry"] == snapshot.num_shards - held, counts
        assert owner.communicate("go\n", timeout=120)[0].strip() == "done"
    finally:
        owner.kill()
    assert len(entries(cache)) == snapshot.num_shards
    shard_bytes = sum(shard.num_bytes for shard in snapshot.metadata.shards)
    assert proxy.stats()["ranged_bytes"] - before == shard_bytes + 2 * opening
    before = gets(proxy)
    assert sorted(ids(snapshot, cache)) == list(range(8000))  # the entries the two made together
    assert gets(proxy) == before
    assert not list(cache.rglob(f"*{shard_cache.CHUNKS_SUFFIX}")), "a finished download left its chunk table"


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_joined_download_whose_owner_is_killed_mid_get_is_read_whole(chunked_snapshot, proxied, tmp_path):
    """The owner of a download dies holding a chunk's claim (mid-GET): the kernel lets the claim go with it,
    and the process that joined the download downloads that chunk itself; every row arrives once, and a
    later epoch downloads the shards again into entries."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(chunked_snapshot))
    cache = tmp_path / "cache"
    owner = start_owner(snapshot.path, cache, "download")
    got: list[int] = []
    reading = threading.Thread(target=lambda: got.extend(ids(snapshot, cache)), daemon=True)
    reading.start()
    time.sleep(1)  # the joined reads wait on chunk 1's claims by now (or find its owner gone)
    owner.kill()
    owner.wait()
    reading.join(120)
    assert not reading.is_alive()
    assert sorted(got) == list(range(8000))
    assert sorted(ids(snapshot, cache)) == list(range(8000))
    assert len(entries(cache)) == snapshot.num_shards


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_process_checking_whole_shards_waits_for_a_download_rather_than_join_it(chunked_snapshot, proxied, tmp_path):
    """read=ReadOptions(verify_checksums=True) checks a whole shard before its first block: a process asking for it
    waits for the download another process has under way and reads the checked entry, never the joined chunks."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(chunked_snapshot))
    cache = tmp_path / "cache"
    owner = start_owner(snapshot.path, cache, "land")
    got: list[int] = []
    checked = reader.ReadOptions(verify_checksums=True)
    reading = threading.Thread(target=lambda: got.extend(ids(snapshot, cache, read=checked)), daemon=True)
    try:
        reading.start()
        reading.join(1)
        assert reading.is_alive(), "read the shards before their downloads could end"
        assert owner.communicate("go\n", timeout=120)[0].strip() == "done"
    finally:
        owner.kill()
    reading.join(120)
    assert sorted(got) == list(range(8000))
    counts = shard_cache.opened_caches()[-1].counts()
    assert counts["joined"] == 0 and counts["entry"] == snapshot.num_shards, counts


@pytest.mark.parametrize("object_store", ["gs"], indirect=True)
def test_a_joined_download_is_held_like_an_entry_once_finished_even_after_its_owner_ends(
    chunked_snapshot, proxied, tmp_path
):
    """A process that joined downloads reads on after their owner made them entries and its process ended:
    its reads then hold the files shared, as an entry's readers do, so eviction spares them while it lives."""
    start, _ = proxied
    snapshot = reader.open_snapshot(start(chunked_snapshot))
    cache = tmp_path / "cache"
    owner = start_owner(snapshot.path, cache, "land")
    dataset = reader.distributed_dataset(snapshot, 100, seed=1, num_epochs=1, cache=reader.CacheOptions(dir=str(cache)))
    source = dataset._source._pipeline.source  # test-only access: open the shards, as a first read would
    try:
        source._files.open_many(range(snapshot.num_shards), 2)
        joined = [opened for opened in source._files._entries if isinstance(opened, shard_fill.Filling)]
        assert len(joined) >= 2 and not any(filling.owner for filling in joined)
        assert owner.communicate("go\n", timeout=120)[0].strip() == "done"  # entries made, its process ended
    finally:
        owner.kill()
    assert len(entries(cache)) == snapshot.num_shards
    assert sorted(int(i) for batch in dataset for i in batch["id"]) == list(range(8000))
    assert not [entry for entry in entries(cache) if shard_cache._delete_unheld(entry)]
    del dataset, source, joined
    deadline = time.monotonic() + 30  # the pipeline's threads let go of it as they end
    while entries(cache) and time.monotonic() < deadline:
        gc.collect()
        for entry in entries(cache):
            shard_cache._delete_unheld(entry)
        time.sleep(0.1)
    assert not entries(cache), "the files stayed held after the dataset was gone"
