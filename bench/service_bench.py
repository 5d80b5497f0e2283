"""`make bench` (service part): rows/s delivered to one consumer by 2 workers on loopback.

Workload: the reader bench's ~3 KB rows (image uint8[32,32,3] + features f32[16]
+ label), ``--megabytes`` of random data, batch 1024.
- snapfeed service: dispatcher + 2 workers as separate processes
  (``python -m reader.service``), consumer = ``reader.distributed_dataset(service=...)``,
  in both processing modes.
- tf.data service: in-process DispatchServer + 2 WorkerServers (C++ threads).
  parallel_epochs: the tf.data .snapshot() pipeline, batched, distributed.
  distributed_epoch: tf.data service cannot split a snapshot dataset, so it runs
  the equivalent range -> map(make row) pipeline (said in the report).
- local reader: ``reader.distributed_dataset`` in the consumer process, no service.
- transport ceiling: the distributed_epoch splits fetched from the same workers
  over Arrow Flight and nothing else, two at a time: what the data plane alone
  moves on this machine, so what distributed_epoch could deliver at most here.
Rows/s counts rows received (parallel_epochs delivers every row once per worker).
Each system reads a cold epoch, then warm epochs for ``WARM_SECONDS``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from bench.reader_bench import make_rows_dataset, num_rows, row_bytes, tf_pipeline, write_snapfeed, write_tfdata

SIZE = "3KB"
BATCH = 1024
#: Warm rates are timed over whole epochs until at least this long.
WARM_SECONDS = 1.0
#: tf.data service servers block forever in __del__ once their dispatcher is gone, so they live
#: until the process ends with os._exit.
_KEEP_ALIVE: list = []


def _cold_and_warm(dataset) -> dict:
    """Rows/s of a first epoch (servers just started: imports, shard opening), then of further epochs
    until ``WARM_SECONDS`` are timed (an epoch of the local reader is a few tens of milliseconds)."""
    started, rows = time.perf_counter(), 0
    for batch in dataset:
        rows += len(batch["label"])
    cold, epoch_rows = rows / (time.perf_counter() - started), rows
    started, cpu, rows = time.perf_counter(), time.process_time(), 0
    while not rows or time.perf_counter() - started < WARM_SECONDS:
        for batch in dataset:
            rows += len(batch["label"])
    gigabytes = rows * row_bytes(SIZE) / 1e9
    return {
        "cold": cold,
        "warm": rows / (time.perf_counter() - started),
        "rows": epoch_rows,
        "cpu_s_per_gb": (time.process_time() - cpu) / gigabytes,
    }


def _transport_ceiling(path: str, dispatcher: str, workers: list[str]) -> float:
    """Rows/s of fetching the job's splits from the workers, nothing else (no dispatcher, no batches).

    What the data plane alone moves on this machine: the most distributed_epoch
    could deliver here. Two fetches in flight, one per worker.
    """
    import concurrent.futures

    import reader
    from reader.service import splits
    from reader.service.connection import ServiceConnection
    from reader.service.worker_clients import WorkerClients

    snapshot = reader.open_snapshot(path)
    clients = WorkerClients(
        ServiceConnection(dispatcher, "distributed_epoch", None),
        snapshot.path,
        snapshot.metadata.run_id,
        [c.name for c in snapshot.metadata.columns],
    )
    blocks = splits.job_blocks(snapshot.block_rows, 0, 0)

    def fetch(split: int) -> int:
        sent = [len(part.order) for part in splits.remaining_parts(blocks, 0, 0, split, 0)]
        clients.fetch_split(workers, lambda: workers, 0, 0, split, 0, sent)
        return sum(sent)

    with concurrent.futures.ThreadPoolExecutor(len(workers)) as pool:
        sum(pool.map(fetch, range(splits.split_count(blocks))))  # warm
        started, rows = time.perf_counter(), 0
        while not rows or time.perf_counter() - started < WARM_SECONDS:
            rows += sum(pool.map(fetch, range(splits.split_count(blocks))))
    clients.close()
    return rows / (time.perf_counter() - started)


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen(
        [sys.executable, "-m", "reader.service", *args], stdout=subprocess.PIPE, text=True, env=env
    )
    return process, process.stdout.readline().split()[-1]


def snapfeed_service(path: str) -> dict:
    import reader

    dispatcher, target = _start("dispatcher", "--port=0")
    started = [_start("worker", f"--dispatcher={target}") for _ in range(2)]
    workers = [process for process, _ in started]
    try:
        time.sleep(3)  # workers announce themselves (1 s heartbeat)
        results = {
            mode: _cold_and_warm(reader.distributed_dataset(path, BATCH, service=target, processing_mode=mode, seed=0))
            for mode in ("distributed_epoch", "parallel_epochs")
        }
        results["transport_ceiling"] = _transport_ceiling(path, target, [address for _, address in started])
        return results
    finally:
        for process in [*workers, dispatcher]:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)


def tfdata_service(rows: int, snapshot_path: str) -> dict:
    import tensorflow as tf

    dispatcher = tf.data.experimental.service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [
        tf.data.experimental.service.WorkerServer(tf.data.experimental.service.WorkerConfig(dispatcher_address=address))
        for _ in range(2)
    ]
    _KEEP_ALIVE.extend([dispatcher, *workers])  # see the os._exit at the bottom
    service = tf.data.experimental.service
    snapshot_batches = tf_pipeline(SIZE, rows, snapshot_path).batch(BATCH)
    equivalent_batches = make_rows_dataset(SIZE, rows).batch(BATCH)
    return {
        "parallel_epochs": _cold_and_warm(
            snapshot_batches.apply(service.distribute(processing_mode="parallel_epochs", service=dispatcher.target))
        ),
        "distributed_epoch": _cold_and_warm(
            equivalent_batches.apply(service.distribute(processing_mode="distributed_epoch", service=dispatcher.target))
        ),
        "workers": len(workers),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--megabytes", type=int, default=100)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-service-bench-"))
    rows = num_rows(SIZE, args.megabytes)
    try:
        path = write_snapfeed(work, SIZE, rows)
        tf_path = write_tfdata(work, SIZE, rows)
        import reader

        local_run = _cold_and_warm(reader.distributed_dataset(path, BATCH, seed=0))
        local = local_run["warm"]
        ours = snapfeed_service(path)
        theirs = tfdata_service(rows, tf_path)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"service: {rows} rows of {SIZE}, batch {BATCH}, 2 workers on loopback, one consumer; rows/s received")
    print(
        f"each system reads an epoch right after its servers started (cold), then epochs for {WARM_SECONDS:.0f} s (warm)"
    )
    print(f"local reader (no service, warm): {local:,.0f} rows/s")
    ceiling = ours["transport_ceiling"]
    print(
        f"transport ceiling (the splits fetched from the workers, nothing else): {ceiling:,.0f} rows/s "
        f"= {ceiling / local:.2f}x the local reader"
    )
    consumer_cpu = ", ".join(
        f"{mode} {ours[mode]['cpu_s_per_gb']:.2f}" for mode in ("distributed_epoch", "parallel_epochs")
    )
    print(
        f"CPU s/GB in the consumer's process (warm): local reader {local_run['cpu_s_per_gb']:.2f}, "
        f"service consumer {consumer_cpu} (workers and dispatcher not counted)"
    )
    report = {"rows": rows, "local_reader": local_run, "transport_ceiling": ceiling, "modes": {}}
    for mode in ("distributed_epoch", "parallel_epochs"):
        our, their = ours[mode], theirs[mode]
        note = " (tf.data: range+map pipeline, it cannot split a snapshot)" if mode == "distributed_epoch" else ""
        for phase in ("cold", "warm"):
            print(
                f"{mode:18} {phase}  snapfeed {our[phase]:10,.0f}  tf.data service {their[phase]:9,.0f}  "
                f"ratio {our[phase] / their[phase]:6.1f}x  vs local reader {our[phase] / local:5.2f}x{note}"
            )
        report["modes"][mode] = {"snapfeed": our, "tf_data_service": their}
    out = pathlib.Path(__file__).parent / "results"
    out.mkdir(exist_ok=True)
    (out / "service_bench.json").write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    # tf.data service's WorkerServer.__del__ can block forever at interpreter exit once its
    # dispatcher is gone; everything is measured, printed and written by now.
    os._exit(0)
