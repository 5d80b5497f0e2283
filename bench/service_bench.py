"""`make bench` (service part): rows/s delivered to one consumer by 2 workers on loopback, and what it costs.

Workload: the reader bench's ~3 KB rows (image uint8[32,32,3] + features f32[16]
+ label), ``--megabytes`` of random data, batch 1024.
- local reader: ``reader.distributed_dataset`` in the consumer process, no service.
- snapfeed service: dispatcher + 2 workers as separate processes
  (``python -m reader.service``), consumer = ``reader.distributed_dataset(service=...)``,
  in both processing modes.
- transport ceiling: the distributed_epoch splits fetched from the same workers with plain
  Arrow Flight and nothing else, one per worker at a time (``bench.flight_ceiling``): what the
  data plane alone moves here, so what distributed_epoch could deliver at most.
- tf.data service: in-process DispatchServer + 2 WorkerServers (C++ threads).
  parallel_epochs: the tf.data .snapshot() pipeline, batched, distributed.
  distributed_epoch: tf.data service cannot split a snapshot dataset, so it runs
  the equivalent range -> map(make row) pipeline (said in the report).
Rows/s counts rows received (parallel_epochs delivers every row once per worker).

Each system reads a cold epoch, then warm epochs interleaved with the others' in ``--repeats``
rounds of ``--warm-seconds`` each (``bench.warm_epochs``); reported: the median warm epoch's rows/s
and seconds from ``iter()`` to its first batch; CPU seconds per GB delivered, of the consumer's
process (``time.process_time()``, all threads) and of the dispatcher + workers (``/proc/PID/stat``).

Pinned variant (2 usable CPUs or more): the consumer pinned to the first usable CPU and the dispatcher
+ workers (a second cluster) to the second, against the local reader pinned to the first with
``read=reader.ReadOptions(num_reader_threads=1)``; each a process of its own, ``--repeats`` runs interleaved,
median run. Shows whether the transport or the consumer is the bottleneck when each side has a core.

``--json``: the table goes to stderr and stdout's last line is one JSON object of the figures (also
written to ``--out``, by default bench/results/service_bench.json).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator

from bench import cpu_pinning, runs, warm_epochs
from bench.flight_ceiling import SplitFetcher
from bench.reader_bench import make_rows_dataset, tf_pipeline, write_tfdata
from bench.service_cluster import ServiceCluster
from testing.snapshots import num_rows, row_bytes, write_random_rows

SIZE = "3KB"
BATCH = 1024
WORKERS = 2
MODES = ("distributed_epoch", "parallel_epochs")
CEILING = "transport_ceiling"
TFDATA = "tf.data "  # + mode
#: The local reader of the pinned variant: one core, one reader thread (``reader.ReadOptions(num_reader_threads=)``).
#: num_io_threads stays AUTO: on a warm page cache, num_io_threads=1 measured the same (within this machine's noise).
PINNED_READER_THREADS = 1
#: tf.data service servers block forever in __del__ once their dispatcher is gone, so they live
#: until the process ends with os._exit.
_KEEP_ALIVE: list = []


def batch_rows(dataset) -> Callable[[], Iterator[int]]:
    """A dataset's epochs as row counts per batch; ``iter(dataset)`` runs when an epoch is started."""
    return lambda: (len(batch["label"]) for batch in dataset)


def service_systems(path: str, cluster: ServiceCluster) -> list[warm_epochs.System]:
    import reader

    systems = [
        warm_epochs.System(
            mode,
            batch_rows(
                reader.distributed_dataset(
                    path, BATCH, seed=0, service=reader.ServiceOptions(address=cluster.target, processing_mode=mode)
                )
            ),
            cluster.pids,
        )
        for mode in MODES
    ]
    fetcher = SplitFetcher(reader.open_snapshot(path), cluster.workers, BATCH)
    return [*systems, warm_epochs.System(CEILING, fetcher.epoch, cluster.pids)]


def tfdata_systems(rows: int, snapshot_path: str) -> list[warm_epochs.System]:
    import tensorflow as tf

    service = tf.data.experimental.service
    dispatcher = service.DispatchServer()
    address = dispatcher.target.split("://")[1]
    workers = [service.WorkerServer(service.WorkerConfig(dispatcher_address=address)) for _ in range(WORKERS)]
    _KEEP_ALIVE.extend([dispatcher, *workers])  # see the os._exit at the bottom
    pipelines = {
        "distributed_epoch": make_rows_dataset(SIZE, rows).batch(BATCH),
        "parallel_epochs": tf_pipeline(SIZE, rows, snapshot_path).batch(BATCH),
    }
    return [
        warm_epochs.System(
            TFDATA + mode,
            batch_rows(batches.apply(service.distribute(processing_mode=mode, service=dispatcher.target))),
        )
        for mode, batches in pipelines.items()
    ]


def pinned_run(system: str, path: str, service: str, server_pids: list[int], warm_seconds: float) -> dict:
    """One pinned consumer (this process, already pinned): the local reader or a service mode."""
    import reader

    if system == "local":
        dataset, pids = (
            reader.distributed_dataset(
                path, BATCH, seed=0, read=reader.ReadOptions(num_reader_threads=PINNED_READER_THREADS)
            ),
            [],
        )
    else:
        dataset, pids = (
            reader.distributed_dataset(
                path, BATCH, seed=0, service=reader.ServiceOptions(address=service, processing_mode=system)
            ),
            server_pids,
        )
    measured = warm_epochs.measure(
        [warm_epochs.System(system, batch_rows(dataset), pids)], 1, warm_seconds, row_bytes(SIZE)
    )
    return measured[system]


def pinned_variant(path: str, repeats: int, warm_seconds: float) -> dict:
    """The consumer on one CPU, the dispatcher + workers on another, vs the local reader on one CPU."""
    cpus = cpu_pinning.usable_cpus()
    if len(cpus) < 2:
        return {"skipped": f"needs 2 usable CPUs, this process may use only {cpus}"}
    consumer, servers = cpus[0], cpus[1]
    with ServiceCluster(WORKERS, {servers}) as cluster:
        arguments = [
            f"--path={path}",
            f"--service={cluster.target}",
            f"--server-pids={','.join(map(str, cluster.pids))}",
            f"--cpu={consumer}",
            f"--warm-seconds={warm_seconds}",
        ]
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        results = runs.median_runs("bench.service_bench", ("local", *MODES), repeats, arguments, "rows_per_s", env)
    by = {result.pop("system"): result for result in results}
    return {
        "consumer_cpu": consumer,
        "servers_cpu": servers,
        "local_options": {"read": {"num_reader_threads": PINNED_READER_THREADS}},
        **compared_with_local(by),
        "runs": by,
    }


def compared_with_local(by: dict[str, dict]) -> dict:
    """Each mode's figures beside the local reader's (``by``: measurements of "local" and each mode)."""
    local = by["local"]

    def of(key: str, names=MODES) -> dict:
        return {name: by[name][key] for name in names}

    def versus_local(key: str) -> dict:
        return {mode: by[mode][key] / local[key] for mode in MODES}

    return {
        "local_rows_per_s": local["rows_per_s"],
        "rows_per_s": of("rows_per_s"),
        "vs_local": versus_local("rows_per_s"),
        "consumer_cpu_s_per_gb": of("consumer_cpu_s_per_gb", ("local", *MODES)),
        "consumer_cpu_vs_local": versus_local("consumer_cpu_s_per_gb"),
        "worker_cpu_s_per_gb": of("server_cpu_s_per_gb"),
        "first_batch_s": of("first_batch_s", ("local", *MODES)),
        "first_batch_vs_local": versus_local("first_batch_s"),
    }


def figures(rows: int, measured: dict[str, dict], pinned: dict) -> dict:
    """The issue's figures, from every system's measurements (kept under ``systems``)."""
    return {
        "rows": rows,
        "row_bytes": row_bytes(SIZE),
        "batch": BATCH,
        "workers": WORKERS,
        "usable_cpus": len(cpu_pinning.usable_cpus()),
        "load_average": os.getloadavg(),
        **compared_with_local(measured),
        "ceiling_ratio": measured[CEILING]["rows_per_s"] / measured["local"]["rows_per_s"],
        "vs_tfdata": {mode: measured[mode]["rows_per_s"] / measured[TFDATA + mode]["rows_per_s"] for mode in MODES},
        "pinned": pinned,
        "systems": measured,
    }


def report(result: dict, out) -> None:
    def say(line: str = "") -> None:
        print(line, file=out)

    measured, local = result["systems"], result["local_rows_per_s"]
    say(
        f"service: {result['rows']} rows of {SIZE}, batch {BATCH}, {WORKERS} workers on loopback, one consumer; "
        f"rows/s received; warm = median epoch of epochs interleaved across systems; load {result['load_average']}"
    )
    say(
        f"{'system':28} {'cold':>10} {'warm':>10} {'vs local':>8} {'1st batch':>9} {'consumer':>9} {'servers':>8} "
        f"{'epochs':>6}"
    )
    say(f"{'':28} {'rows/s':>10} {'rows/s':>10} {'':>8} {'ms':>9} {'CPU s/GB':>9} {'CPU s/GB':>8}")
    for name, system in measured.items():
        servers = f"{system['server_cpu_s_per_gb']:8.2f}" if "server_cpu_s_per_gb" in system else f"{'-':>8}"
        say(
            f"{name:28} {system['cold_rows_per_s']:10,.0f} {system['rows_per_s']:10,.0f} "
            f"{system['rows_per_s'] / local:7.2f}x {system['first_batch_s'] * 1e3:9.1f} "
            f"{system['consumer_cpu_s_per_gb']:9.2f} {servers} {system['warm_epochs']:6}"
        )
    say("(tf.data rows: its workers run in the consumer's process; its distributed_epoch reads a range+map pipeline,")
    say(" as tf.data service cannot split a snapshot)")
    ratios = ", ".join(f"{mode} {result['vs_tfdata'][mode]:.1f}x" for mode in MODES)
    say(f"snapfeed service vs tf.data service (warm rows/s): {ratios}")
    say(f"transport ceiling / local reader: {result['ceiling_ratio']:.2f}")
    for key, what in (("consumer_cpu_vs_local", "consumer CPU s/GB"), ("first_batch_vs_local", "warm first batch")):
        say(f"{what} vs the local reader's: " + ", ".join(f"{mode} {result[key][mode]:.2f}x" for mode in MODES))
    pinned = result["pinned"]
    if "skipped" in pinned:
        say(f"pinned variant skipped: {pinned['skipped']}")
        return
    say(
        f"pinned: consumer on CPU {pinned['consumer_cpu']}, dispatcher + workers on CPU {pinned['servers_cpu']}; "
        f"local reader on CPU {pinned['consumer_cpu']} with "
        f"read=ReadOptions(num_reader_threads={PINNED_READER_THREADS}): "
        f"{pinned['local_rows_per_s']:,.0f} rows/s, {pinned['consumer_cpu_s_per_gb']['local']:.2f} CPU s/GB"
    )
    for mode in MODES:
        run = pinned["runs"][mode]
        say(
            f"pinned {mode:18} {run['rows_per_s']:10,.0f} rows/s = {pinned['vs_local'][mode]:.2f}x local; consumer "
            f"{run['consumer_cpu_s_per_gb']:.2f} CPU s/GB = {pinned['consumer_cpu_vs_local'][mode]:.2f}x local "
            f"(core {run['consumer_cores']:.0%} busy); servers {run['server_cpu_s_per_gb']:.2f} CPU s/GB "
            f"(core {run['server_cores']:.0%} busy)"
        )


def measure_all(path: str, tf_path: str, rows: int, repeats: int, warm_seconds: float) -> dict[str, dict]:
    import reader

    local = warm_epochs.System("local", batch_rows(reader.distributed_dataset(path, BATCH, seed=0)))
    with ServiceCluster(WORKERS) as cluster:
        systems = [local, *service_systems(path, cluster), *tfdata_systems(rows, tf_path)]
        return warm_epochs.measure(systems, repeats, warm_seconds, row_bytes(SIZE))


def main() -> None:
    args = runs.arguments(
        __doc__,
        options=[
            ("--megabytes", {"type": int, "default": 100}),
            ("--warm-seconds", {"type": float, "default": 1.0, "help": "per system and round"}),
            ("--json", {"action": "store_true", "help": "print the figures as one JSON line last"}),
            ("--workdir", {"default": None}),
            ("--out", {"default": str(runs.RESULTS / "service_bench.json")}),
            ("--service", {"default": None, "help": argparse.SUPPRESS}),
            ("--server-pids", {"default": "", "help": argparse.SUPPRESS}),
            ("--cpu", {"type": int, "default": None, "help": argparse.SUPPRESS}),
        ],
    )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if args.worker:  # one pinned run of pinned_variant
        cpu_pinning.pin_process(os.getpid(), {args.cpu})
        server_pids = [int(pid) for pid in args.server_pids.split(",") if pid]
        print(json.dumps(pinned_run(args.worker, args.path, args.service, server_pids, args.warm_seconds)))
        return
    work = pathlib.Path(args.workdir or tempfile.mkdtemp(prefix="snapfeed-service-bench-"))
    rows = num_rows(SIZE, args.megabytes)
    try:
        path = write_random_rows(work, SIZE, rows)
        tf_path = write_tfdata(work, SIZE, rows)
        measured = measure_all(path, tf_path, rows, args.repeats, args.warm_seconds)
        pinned = pinned_variant(path, args.repeats, args.warm_seconds)
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
    result = figures(rows, measured, pinned)
    report(result, sys.stderr if args.json else sys.stdout)
    out = pathlib.Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    sys.stderr.flush()
    # tf.data service's WorkerServer.__del__ can block forever at interpreter exit once its
    # dispatcher is gone; everything is measured, printed and written by now.
    os._exit(0)
