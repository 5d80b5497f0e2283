"""`make bench` (remote reads): the reader on S3 and GCS emulators behind a proxy with a round-trip delay.

Workload: the reader bench's 3KB rows (image uint8[32,32,3] + features float32[16] + label),
``--rows`` rows (default 200,000: 629 MB in 3 shards of 1 MiB blocks, uncompressed random bytes),
written once by WriteSnapshot under ``out/remote-read-bench/`` (ignored by git), then uploaded to
moto's S3 server and to fake-gcs-server (``testing.object_stores``). Every client request goes through
``testing.http_proxy`` with ``--delay-ms`` (default 20 ms) added to each request: a realistic round
trip to a store in another building, which a store on 127.0.0.1 does not have. The proxy counts the
requests.

Systems, each in its own process (peak RSS is its own), on the same endpoint:

- ceiling: every 1 MiB block's bytes read by ranged GETs, in a random order, by as many threads as
  the reader has I/O threads (AUTO 32), with the same client (pyarrow.fs, what the reader uses),
  shards opened and their footers read concurrently first, timed too: what this endpoint delivers
  to that concurrency, so what the reader could deliver at most here.
- snapfeed: ``reader.distributed_dataset(snapshot, 1024, seed=0, num_epochs=1)``, shuffled, NumPy
  output, one epoch (shard opening and first batch included; reading the manifest and its column
  specs only in the first batch's time); every row counted once (labels are row ids).
- snapfeed-in-order: the same with ``shuffle=False``: neighbouring blocks are read by merged GETs.
- local-new-process: the same reader on the local copy of the snapshot, one epoch in a new process whose
  first step reads the files whole into the page cache, untimed (what cache-epoch2 is compared with: both
  pay a new process's first epoch, from files in the page cache).
- local-warm: the same reader on the local copy of the snapshot, its page cache warm (an untimed epoch
  first): what a later epoch from the shard cache is compared with.
- cache-epoch1/2/3: the reader with ``cache=reader.CacheOptions(dir=...)`` (``reader.core.cache.shard_cache``), one
  epoch per process, the three in turn on one cache directory emptied before epoch 1: epoch 1 downloads every
  shard whole (its first batch waits for the chunks holding the first window's blocks); epoch 2, in a new process, reads
  the local copies as a new training job would (trusting the check each entry recorded when it was
  downloaded; also compared with local-new-process); epoch 3 is timed as
  local-warm is, after an untimed epoch from the cache in the same process. GETs are the proxy's (the
  manifest's few included).
- cache-3-processes: three such readers started at once on one empty cache (one process per
  accelerator): the first to open a shard downloads it, the others join its download (reading what
  landed, downloading into it the chunks their reads need first), so the bytes their ranged GETs ask
  for are the snapshot's once (printed below the table; their GETs are one reader's plus each process's
  manifest reads and, on GCS, a metadata request per shard a joining process downloaded a chunk of).
  rows/s is the three processes' rows over the wall time of all three; the first batch is the slowest's.
- tf.data: whether TensorFlow's filesystems can read the store at all (``tf.io.gfile.exists`` on a
  shard), reported as is: TensorFlow 2.21 has no ``s3://`` filesystem without tensorflow-io, and
  its ``gs://`` filesystem talks to storage.googleapis.com only (no emulator setting), so tf.data
  cannot be compared here.

Reported per store: rows/s and the ratio to the ceiling (goal: at least 0.9; the cache rows' goal is
0.9x local-warm, printed below the table), seconds to the first
batch, peak RSS (MiB) against ``read_ahead_bytes`` + 300 MB, GET requests per MiB of the snapshot
(HEADs and footers included; about 1 per 1 MiB block when shuffled), and what decides the ratio where
cores are few: the reading process's CPU seconds per GB, and the cores the whole machine kept busy
(the emulator and the proxy share them: where the ceiling already keeps every core busy, each CPU
second the reader spends beyond the ceiling's client is time taken from the store). Runs repeat ``--repeats``
times interleaved; the median by rows/s is reported (everything shares 2 cores: the emulators and
the proxy are Python and Go processes beside the reader).

What decides the ratio is printed under each store's table, per GB: the CPU seconds of the ceiling's
client (C), of the reader (R) and of the store side (S: the emulator, the proxy and whatever else
ran, from the machine's busy time less the reading process's). Sharing N cores, both are CPU-bound
when the machine is busy, and the ratio is about (C + S) / (R + S). ``--pin`` gives each side cores
of its own, as a host whose store is in another building has: the emulator and the proxy on the
first half of the cores, every reading process on the other half. Each side is then bound by its
own cores, and the reader keeps the ceiling's rate only where its cores cover R per GB as the
client's cover C.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import time

from bench import cpu_pinning, proc_cpu, runs
from bench.reader_bench import cached_snapfeed, status_mb
from testing.snapshots import row_bytes

SIZE = "3KB"
BATCH = 1024
DEFAULT_ROWS = 200_000
WORKDIR = pathlib.Path(__file__).resolve().parent.parent / "out" / "remote-read-bench"
BUCKET = "snapfeed-remote-bench"
#: Memory the reader may use beyond its read-ahead (the issue's goal: read_ahead_bytes + 300 MB).
RSS_ALLOWANCE_BYTES = 300 * 10**6
#: The shard cache of the cache-* systems, emptied before cache-epoch1 and cache-3-processes.
CACHE_DIR = WORKDIR / "cache"
CACHE_SYSTEMS = ("cache-epoch1", "cache-epoch2", "cache-epoch3")
SHARED_READERS = 3


class TimedPart:
    """A timed part of a run, started when made, with what decides a ratio on a small machine: this
    process's CPU seconds per GB, and how many cores the whole machine kept busy meanwhile (at the core
    count, the store's CPU and ours compete: the emulator and the proxy are processes this one does not own)."""

    def __init__(self) -> None:
        self._cpu, self._busy, self.started = time.process_time(), proc_cpu.machine_busy_s(), time.perf_counter()

    def cpu_figures(self, seconds: float, gigabytes: float) -> dict:
        """CPU seconds per GB of this process and of everything else on the machine (the store side:
        the emulator and the proxy, with whatever else ran), and the cores kept busy."""
        own, busy = time.process_time() - self._cpu, proc_cpu.machine_busy_s() - self._busy
        return {
            "cpu_s_per_gb": own / gigabytes,
            "store_cpu_s_per_gb": max(0.0, busy - own) / gigabytes,
            "busy_cores": busy / seconds,
        }


def upload(local: pathlib.Path, uri: str) -> None:
    """Copies the snapshot directory to ``uri`` (pyarrow.fs, with the emulator's environment set)."""
    import pyarrow.fs as pafs

    filesystem, prefix = pafs.FileSystem.from_uri(uri)
    pafs.copy_files(str(local), prefix, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=filesystem)


def run_ceiling(uri: str, rows: int) -> dict:
    import concurrent.futures
    import random

    import reader
    from reader.core import block_io
    from reader.core.options import AUTO_IO_THREADS
    from schemas import storage

    snapshot = reader.open_snapshot(uri)
    paths = [snapshot.shard_path(index) for index in range(snapshot.num_shards)]
    timed = TimedPart()
    with concurrent.futures.ThreadPoolExecutor(AUTO_IO_THREADS) as pool:
        files = list(pool.map(storage.open_random_access, paths))
        layouts = list(pool.map(lambda file: block_io.read_layout(file, file.size()), files))
        reads = [(file, block) for file, layout in zip(files, layouts, strict=True) for block in layout.blocks]
        random.Random(0).shuffle(reads)
        fetched = sum(pool.map(lambda read: block_io.read_exactly(read[0], read[1].offset, read[1].length).size, reads))
    seconds = time.perf_counter() - timed.started
    return {
        "rows_per_s": rows / seconds,
        "seconds": seconds,
        "bytes": fetched,
        "peak_rss_mb": status_mb("VmHWM"),
        **timed.cpu_figures(seconds, fetched / 1e9),
    }


def run_reader(uri: str, rows: int, **options) -> dict:
    """One epoch of ``reader.distributed_dataset`` over ``uri``, timed; ``options``: its keywords (``shuffle=``,
    ``cache=reader.CacheOptions(...)``)."""
    import numpy as np

    import reader

    opening = time.perf_counter()
    # The manifest and the column specs: timed in the first batch, not in rows/s, as the ceiling has neither.
    snapshot = reader.open_snapshot(uri)
    _ = snapshot.element_spec
    timed = TimedPart()
    first, count = None, 0
    seen = np.zeros(rows, dtype=np.uint8)
    for batch in reader.distributed_dataset(snapshot, BATCH, seed=0, num_epochs=1, **options):
        if first is None:
            first = time.perf_counter() - opening
        seen[batch["label"]] += 1
        count += len(batch["label"])
    seconds = time.perf_counter() - timed.started
    return {
        "rows_per_s": count / seconds,
        "seconds": seconds,
        "open_s": timed.started - opening,
        "first_batch_s": first,
        "peak_rss_mb": status_mb("VmHWM"),
        "rows": count,
        "every_row_once": bool((seen == 1).all()),
        **timed.cpu_figures(seconds, count * row_bytes(SIZE) / 1e9),
    }


def run_tfdata(uri: str) -> dict:
    """Whether TensorFlow's filesystem reaches the store (its error when not)."""
    import reader

    snapshot = reader.open_snapshot(uri)
    import tensorflow as tf

    try:
        return {"reachable": bool(tf.io.gfile.exists(snapshot.shard_path(0)))}
    except Exception as exc:  # noqa: BLE001 - what TensorFlow says is the result
        return {"reachable": False, "error": f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"}


def run_warm(path: str, rows: int, **options) -> dict:
    """The reader timed on its second epoch in this process (the first warms the page cache and the process)."""
    run_reader(path, rows, **options)
    return run_reader(path, rows, **options)


def run_shared(uri: str, rows: int) -> dict:
    """``SHARED_READERS`` cache-epoch1 processes at once on one empty cache: their rows over the wall time."""
    command = [sys.executable, "-m", "bench.remote_read_bench", "--worker=cache-epoch1", f"--path={uri}"]
    started = time.perf_counter()
    processes = [
        subprocess.Popen([*command, f"--rows={rows}"], stdout=subprocess.PIPE, text=True) for _ in range(SHARED_READERS)
    ]
    results = [json.loads(process.communicate()[0].strip().splitlines()[-1]) for process in processes]
    seconds = time.perf_counter() - started
    return {
        "rows_per_s": sum(result["rows"] for result in results) / seconds,
        "seconds": seconds,
        "first_batch_s": max(result["first_batch_s"] for result in results),
        "peak_rss_mb": max(result["peak_rss_mb"] for result in results),
        "every_row_once": all(result["every_row_once"] for result in results),
    }


def shard_cache():
    """The cache-* systems' shard cache: ``CACHE_DIR``, its budget AUTO."""
    import reader

    return reader.CacheOptions(dir=str(CACHE_DIR))


def worker(system: str, uri: str, rows: int) -> dict:
    """One run of ``system``, in this process (on the cores ``--reader-cores`` gave, when pinned)."""
    if system in ("cache-epoch1", "cache-epoch2"):
        return run_reader(uri, rows, cache=shard_cache())
    if system == "cache-epoch3":
        return run_warm(uri, rows, cache=shard_cache())
    if system == "cache-3-processes":
        return run_shared(uri, rows)
    if system == "local-new-process":
        local = cached_snapfeed(WORKDIR, SIZE, rows)
        for shard in local.glob("*/*.arrow"):  # into the page cache, as the cache's entries are after their download
            with open(shard, "rb", buffering=0) as file:
                while file.read(8 << 20):
                    pass
        return run_reader(str(local), rows)
    if system == "local-warm":
        return run_warm(str(cached_snapfeed(WORKDIR, SIZE, rows)), rows)
    if system == "ceiling":
        return run_ceiling(uri, rows)
    if system == "snapfeed":
        return run_reader(uri, rows)
    if system == "snapfeed-in-order":
        return run_reader(uri, rows, shuffle=False)
    if system == "tf.data":
        return run_tfdata(uri)
    raise SystemExit(f"unknown system {system}")


@contextlib.contextmanager
def emulator(store: str):
    from testing import object_stores

    with object_stores.s3_server() if store == "s3" else object_stores.gcs_server() as server:
        yield server


def measure_store(
    store: str,
    local: pathlib.Path,
    rows: int,
    delay_s: float,
    repeats: int,
    systems: list[str],
    reader_cores: list[int] | None = None,
) -> dict:
    from testing.http_proxy import http_proxy

    with emulator(store) as server:
        root = server.make_bucket(BUCKET)
        uri = f"{root}/{local.parent.name}/{local.name}"
        saved = dict(os.environ)
        os.environ.update(server.env)  # the upload goes straight to the emulator
        try:
            started = time.perf_counter()
            upload(local, uri)
            print(f"{store}: uploaded in {time.perf_counter() - started:.1f} s", file=sys.stderr)
        finally:
            os.environ.clear()
            os.environ.update(saved)
        runs: dict[str, list[dict]] = {system: [] for system in systems}
        with http_proxy(server.endpoint, delay_s=delay_s) as proxy:
            env = {**os.environ, **server.env_via(proxy.endpoint), "TF_CPP_MIN_LOG_LEVEL": "3"}
            for repeat in range(repeats):
                for system in systems:
                    if system == "tf.data" and repeat:
                        continue
                    if system in ("cache-epoch1", "cache-3-processes"):
                        shutil.rmtree(CACHE_DIR, ignore_errors=True)  # every byte downloaded anew
                    before, ranged = proxy.stats()["requests_by_method"], proxy.stats()["ranged_bytes"]
                    command = [sys.executable, "-m", "bench.remote_read_bench", f"--worker={system}", f"--path={uri}"]
                    command.append(f"--rows={rows}")
                    if reader_cores:
                        command.append(f"--reader-cores={','.join(map(str, reader_cores))}")
                    completed = subprocess.run(
                        command, capture_output=True, text=True, env=env, check=False, timeout=1800
                    )
                    if completed.returncode != 0:
                        raise SystemExit(f"{store} {system} failed:\n{completed.stderr[-3000:]}")
                    result = json.loads(completed.stdout.strip().splitlines()[-1])
                    after = proxy.stats()["requests_by_method"]
                    result["requests"] = {m: after.get(m, 0) - before.get(m, 0) for m in after}
                    result["ranged_mb"] = (proxy.stats()["ranged_bytes"] - ranged) / 1e6
                    print(f"{store} {system} run {repeat + 1}: {json.dumps(result)}", file=sys.stderr)
                    runs[system].append(result)
    return runs


def main() -> None:
    args = runs.arguments(
        __doc__,
        (
            "ceiling",
            "snapfeed",
            "snapfeed-in-order",
            "local-new-process",
            "local-warm",
            *CACHE_SYSTEMS,
            "cache-3-processes",
            "tf.data",
        ),
        [
            ("--rows", {"type": int, "default": DEFAULT_ROWS}),
            ("--delay-ms", {"type": float, "default": 20.0}),
            ("--stores", {"default": "s3,gcs"}),
            ("--pin", {"action": "store_true", "help": "the store side and the readers on cores of their own"}),
            ("--reader-cores", {"default": "", "help": argparse.SUPPRESS}),
        ],
    )
    if args.worker:
        if args.reader_cores:
            cpu_pinning.pin_process(os.getpid(), {int(core) for core in args.reader_cores.split(",")})
        print(json.dumps(worker(args.worker, args.path, args.rows)))
        return
    reader_cores = pin_store_side() if args.pin else None
    local = cached_snapfeed(WORKDIR, SIZE, args.rows)
    snapshot_bytes = sum(f.stat().st_size for f in local.glob("*/*.arrow"))
    systems = args.systems.split(",")
    results = {
        store: measure_store(store, local, args.rows, args.delay_ms / 1000, args.repeats, systems, reader_cores)
        for store in args.stores.split(",")
    }
    report(args, snapshot_bytes, results, reader_cores)


def pin_store_side() -> list[int]:
    """Keeps this process (so the proxy's threads and the emulator it starts) on the first half of its
    cores; returns the other half, for the reading processes."""
    cores = cpu_pinning.usable_cpus()
    if len(cores) < 2:
        raise SystemExit(f"--pin needs at least 2 cores to split; this process may use {len(cores)}")
    half = len(cores) // 2
    cpu_pinning.pin_process(os.getpid(), set(cores[:half]))
    return cores[half:]


def report(
    args, snapshot_bytes: int, results: dict[str, dict[str, list[dict]]], reader_cores: list[int] | None = None
) -> None:
    from reader.core.options import AUTO_IO_THREADS, AUTO_READ_AHEAD_BYTES

    mib = snapshot_bytes / (1 << 20)
    rss_bound = (AUTO_READ_AHEAD_BYTES + RSS_ALLOWANCE_BYTES) / (1 << 20)  # MiB, as peak RSS is reported
    print(
        f"remote reads: {args.rows} rows of {row_bytes(SIZE)} B ({snapshot_bytes / 1e6:.0f} MB), batch {BATCH}, "
        f"{args.delay_ms:.0f} ms added to every request by the proxy, {AUTO_IO_THREADS} I/O threads; "
        f"median of {args.repeats} runs by rows/s; peak RSS bound = read_ahead_bytes + "
        f"{RSS_ALLOWANCE_BYTES // 10**6} MB = {rss_bound:.0f} MiB; CPU s/GB: the reading process's own over "
        f"its timed part; store s/GB: the rest of the machine's (emulator, proxy); busy: cores the whole machine "
        f"kept busy meanwhile, of {os.cpu_count()}"
        + (
            f"; pinned: store side on cores {cpu_pinning.usable_cpus()}, readers on {reader_cores}"
            if reader_cores
            else ""
        )
    )
    print(
        f"{'store':5} {'system':17} {'rows/s':>9} {'MB/s':>6} {'vs ceiling':>10} {'1st batch':>9} "
        f"{'peak RSS':>10} {'GET/MiB':>7} {'HEADs':>5} {'CPU s/GB':>8} {'store':>5} {'busy':>5}  every run's rows/s"
    )
    for store, store_runs in results.items():
        ceiling = None
        if store_runs.get("ceiling"):
            ceiling = sorted(r["rows_per_s"] for r in store_runs["ceiling"])[len(store_runs["ceiling"]) // 2]
        for system, system_runs in store_runs.items():
            if not system_runs:
                continue
            if system == "tf.data":
                result = system_runs[0]
                said = "reads the emulator" if result["reachable"] else f"cannot read it: {result.get('error', '')}"
                print(f"{store:5} {system:17} {said}")
                continue
            result = median(system_runs)
            ratio = f"{result['rows_per_s'] / ceiling:9.2f}x" if ceiling else "         -"
            first = f"{result['first_batch_s']:8.2f}s" if "first_batch_s" in result else "        -"
            gets = result["requests"].get("GET", 0) / mib
            every = " ".join(f"{run['rows_per_s']:.0f}" for run in system_runs)
            cpu = f"{result['cpu_s_per_gb']:8.2f}" if "cpu_s_per_gb" in result else "       -"
            busy = f"{result['busy_cores']:5.2f}" if "busy_cores" in result else "    -"
            store_cpu = f"{result['store_cpu_s_per_gb']:5.2f}" if "store_cpu_s_per_gb" in result else "    -"
            print(
                f"{store:5} {system:17} {result['rows_per_s']:9.0f} {result['rows_per_s'] * row_bytes(SIZE) / 1e6:6.0f} "
                f"{ratio} {first} {result['peak_rss_mb']:7.0f}MiB {gets:7.2f} {result['requests'].get('HEAD', 0):5} "
                f"{cpu} {store_cpu} {busy}  {every}"
            )
            if result.get("every_row_once") is False:
                print(f"  {store} {system}: some row was not read exactly once")
        cache_summary(store, store_runs, mib)
        what_decides(store, store_runs, reader_cores)
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "remote_read_bench.json").write_text(json.dumps(results, indent=1))


def median(system_runs: list[dict]) -> dict:
    return sorted(system_runs, key=lambda run: run["rows_per_s"])[len(system_runs) // 2]


def what_decides(store: str, store_runs: dict[str, list[dict]], reader_cores: list[int] | None) -> None:
    """The ceiling's and the reader's CPU per GB, the store side's, and the ratio they allow (module docstring)."""
    if not (store_runs.get("ceiling") and store_runs.get("snapfeed")):
        return
    ceiling, ours = median(store_runs["ceiling"]), median(store_runs["snapfeed"])
    client, reader = ceiling["cpu_s_per_gb"], ours["cpu_s_per_gb"]
    store_side = ceiling["store_cpu_s_per_gb"]
    measured = ours["rows_per_s"] / ceiling["rows_per_s"]
    if reader_cores:
        readers, stores = len(reader_cores), len(cpu_pinning.usable_cpus())

        def rate(reading_cpu: float) -> float:  # GB/s: the slower side's cores, each side CPU-bound
            return min(readers / reading_cpu, stores / store_side)

        how = (
            f"each side on cores of its own ({readers} reading, {stores} store), a CPU-bound ratio is "
            f"min({readers}/R, {stores}/S) / min({readers}/C, {stores}/S) = {rate(reader) / rate(client):.2f}x"
        )
    else:
        shared = (client + store_side) / (reader + store_side)
        how = f"sharing {os.cpu_count()} cores, a CPU-bound ratio is (C + S) / (R + S) = {shared:.2f}x"
    print(
        f"  {store} what decides it, CPU s per GB: ceiling's client C {client:.2f}, reader R {reader:.2f}, store side "
        f"S {store_side:.2f}; {how} (measured {measured:.2f}x); where the store's CPU is elsewhere the reader keeps "
        f"the ceiling's rate with {reader / client:.1f}x the client's cores ({reader:.1f} cores per GB/s)"
    )


def cache_summary(store: str, store_runs: dict[str, list[dict]], mib: float) -> None:
    """Later epochs from the cache against the warm local reader (goal 0.9x), and GETs per epoch."""
    if not store_runs.get("local-warm"):
        return
    local = median(store_runs["local-warm"])["rows_per_s"]
    fresh = median(store_runs["local-new-process"])["rows_per_s"] if store_runs.get("local-new-process") else None
    for system in (*CACHE_SYSTEMS, "cache-3-processes"):
        if store_runs.get(system):
            result = median(store_runs[system])
            like = (
                f" ({result['rows_per_s'] / fresh:.2f}x local-new-process)"
                if fresh and system == "cache-epoch2"
                else ""
            )
            print(
                f"  {store} {system}: {result['rows_per_s'] / local:.2f}x local-warm{like}, "
                f"{result['requests'].get('GET', 0)} GETs ({result['requests'].get('GET', 0) / mib:.2f}/MiB), "
                f"{result['ranged_mb']:.0f} MB asked for by ranged GETs (the snapshot: {mib * (1 << 20) / 1e6:.0f} MB)"
            )


if __name__ == "__main__":
    main()
