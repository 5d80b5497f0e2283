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
Rows/s counts rows received (parallel_epochs delivers every row once per worker).
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

from bench.reader_bench import make_rows_dataset, num_rows, tf_pipeline, write_snapfeed, write_tfdata

SIZE = "3KB"
BATCH = 1024
#: tf.data service servers block forever in __del__ once their dispatcher is gone, so they live
#: until the process ends with os._exit.
_KEEP_ALIVE: list = []


def _rate(batches) -> tuple[float, int]:
    started, rows = time.perf_counter(), 0
    for batch in batches:
        rows += len(batch["label"])
    return rows / (time.perf_counter() - started), rows


def _cold_and_warm(dataset) -> dict:
    """Rows/s of a first epoch (servers just started: imports, shard opening) and of a second one."""
    cold, rows = _rate(dataset)
    warm, _ = _rate(dataset)
    return {"cold": cold, "warm": warm, "rows": rows}


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    process = subprocess.Popen(
        [sys.executable, "-m", "reader.service", *args], stdout=subprocess.PIPE, text=True, env=env
    )
    return process, process.stdout.readline().split()[-1]


def snapfeed_service(path: str) -> dict:
    import reader

    dispatcher, target = _start("dispatcher", "--port=0")
    workers = [_start("worker", f"--dispatcher={target}")[0] for _ in range(2)]
    try:
        time.sleep(3)  # workers announce themselves (1 s heartbeat)
        return {
            mode: _cold_and_warm(reader.distributed_dataset(path, BATCH, service=target, processing_mode=mode, seed=0))
            for mode in ("distributed_epoch", "parallel_epochs")
        }
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

        local = _cold_and_warm(reader.distributed_dataset(path, BATCH, seed=0))["warm"]
        ours = snapfeed_service(path)
        theirs = tfdata_service(rows, tf_path)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    print(f"service: {rows} rows of {SIZE}, batch {BATCH}, 2 workers on loopback, one consumer; rows/s received")
    print("each system reads two epochs: the first right after its servers started (cold), then a warm one")
    print(f"local reader (no service, warm): {local:,.0f} rows/s")
    report = {"rows": rows, "local_reader": local, "modes": {}}
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
