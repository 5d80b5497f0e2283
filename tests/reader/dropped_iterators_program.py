"""Builds, partly reads and drops iterators of every kind while another iterator reads to its end.

Run as ``python -m tests.reader.dropped_iterators_program SNAPSHOT DISPATCHER ROUNDS [--collector-everywhere]``
by ``test_dropped_iterators.py``, in a process of its own: a finalizer that locks deadlocks this process
(faulthandler then prints every thread's stack and ends it), never the test run. Prints one JSON line.

Each dropped iterator is left in a reference cycle, so the cyclic collector (not reference counting)
finalizes it, at an allocation of whichever thread runs it then, as a trainer's dropped iterators are
(an exception's traceback, an object holding a bound method of itself). Every tenth round also collects
while holding concurrent.futures' global lock, which every ``ThreadPoolExecutor.submit`` takes: a
finalizer that submits there deadlocks at once rather than one run in a hundred.
``--collector-everywhere`` sets ``gc.set_threshold(1)``: the collector runs at nearly every allocation.
"""

import argparse
import concurrent.futures.thread
import faulthandler
import gc
import json
import os
import sys
import threading
import time

import reader

#: Steps read of each iterator before it is dropped: enough that a service consumer delivered whole splits
#: whose acks are still to be sent.
STEPS_READ = 12


def _kinds(snapshot: str, dispatcher: str) -> dict:
    """A dataset of every kind of iterator, made anew every few rounds (so their pools and connections go too)."""
    return {
        "local": lambda: reader.distributed_dataset(snapshot, 32, seed=1),
        "distributed_epoch": lambda: reader.distributed_dataset(snapshot, 32, seed=1, service=dispatcher),
        "parallel_epochs": lambda: reader.distributed_dataset(
            snapshot, 32, seed=1, service=reader.ServiceOptions(address=dispatcher, processing_mode="parallel_epochs")
        ),
        "device_prefetch": lambda: reader.distributed_dataset(
            snapshot, 32, seed=1, output="torch", placement=reader.PlacementOptions(device="cpu", prefetch_to_device=2)
        ),
        "torch": lambda: reader.distributed_dataset(snapshot, 32, seed=1).to_torch(),
    }


def _open_descriptors() -> int:
    return len(os.listdir("/proc/self/fd"))


def _drop_in_a_cycle(iterator) -> None:
    cycle = [iterator]
    cycle.append(cycle)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("snapshot")
    parser.add_argument("dispatcher")
    parser.add_argument("rounds", type=int)
    parser.add_argument("--collector-everywhere", action="store_true")
    args = parser.parse_args()
    makers = _kinds(args.snapshot, args.dispatcher)

    def one_round(datasets: dict) -> None:
        for dataset in datasets.values():
            iterator = iter(dataset)
            for _ in range(STEPS_READ):
                next(iterator)
            _drop_in_a_cycle(iterator)
            del iterator

    one_round({name: make() for name, make in makers.items()})  # what stays: the reaper, gRPC's own threads
    gc.collect()
    time.sleep(3)
    baseline = {"threads": threading.active_count(), "descriptors": _open_descriptors()}

    full_read: list[int] = []
    reading = threading.Thread(
        target=lambda: full_read.append(
            sum(len(step["id"]) for step in reader.distributed_dataset(args.snapshot, 32, seed=2, num_epochs=2))
        ),
        name="full-read",
    )
    reading.start()
    if args.collector_everywhere:
        gc.set_threshold(1)
    datasets = {}
    for number in range(args.rounds):
        faulthandler.dump_traceback_later(120, exit=True)  # a deadlock: every stack, then exit 1
        if number % 5 == 0:
            datasets = {name: make() for name, make in makers.items()}
        one_round(datasets)
        if number % 10 == 9:
            with concurrent.futures.thread._global_shutdown_lock:
                gc.collect()
    del datasets
    gc.set_threshold(700, 10, 10)
    reading.join(120)
    faulthandler.cancel_dump_traceback_later()

    gc.collect()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        now = {"threads": threading.active_count(), "descriptors": _open_descriptors()}
        if now["threads"] <= baseline["threads"] and now["descriptors"] <= baseline["descriptors"]:
            break
        time.sleep(0.2)
    left = sorted(thread.name for thread in threading.enumerate())
    settled = round(20 - (deadline - time.monotonic()), 1)
    report = {"baseline": baseline, "after": now, "rows_read": full_read, "threads_left": left, "settled_s": settled}
    print(json.dumps(report))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
