"""Producers run on threads kept from one producer to the next (``reader.core.background``)."""

import gc
import json
import os
import subprocess
import sys
import threading
import time
import weakref

import pytest

from reader.core import background
from reader.core.background import END, BackgroundProducer
from tests import helpers


def _run_to_end(producer: BackgroundProducer) -> list:
    producer.start()
    items = []
    while (item := producer.next_item()) is not END:
        items.append(item)
    producer.cancel()  # returns once its thread is free for the next producer
    return items


def test_producers_of_one_name_run_one_after_another_on_one_kept_thread():
    """A pass's batches are allocated on its producer's thread, and glibc keeps freed memory in that
    thread's arena: the next pass reuses it only if it runs on the same thread."""
    threads = []

    def produce():
        threads.append(threading.current_thread())
        yield from range(3)

    for _ in range(4):
        assert _run_to_end(BackgroundProducer(produce, 1, "test-one-after-another")) == [0, 1, 2]
    assert len(set(threads)) == 1 and threads[0].is_alive()
    assert threads[0].name == "test-one-after-another" and background.producing() is False


def test_producers_at_once_run_on_threads_of_their_own_and_at_most_a_few_are_kept():
    release, started = threading.Event(), threading.Barrier(7)
    threads = []

    def produce():
        threads.append(threading.current_thread())
        started.wait(10)
        release.wait(10)
        yield background.producing()

    producers = [BackgroundProducer(produce, 1, "test-at-once") for _ in range(6)]
    for producer in producers:
        producer.start()
    started.wait(10)
    assert len(set(threads)) == 6
    release.set()
    for producer in producers:
        assert producer.next_item() is True  # on its producer's thread
        assert producer.next_item() is END
        producer.cancel()
    deadline = time.monotonic() + 10
    while sum(thread.is_alive() for thread in threads) > background.IDLE_THREADS_KEPT and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(thread.is_alive() for thread in threads) == background.IDLE_THREADS_KEPT


@pytest.mark.parametrize("fails", ["making the items", "iterating"])
def test_a_producers_error_reaches_its_consumer_and_its_thread_runs_the_next(fails):
    threads = []

    def produce():
        threads.append(threading.current_thread())
        raise ValueError("no items")

    def failing():
        threads.append(threading.current_thread())
        yield 1
        raise ValueError("no items")

    producer = BackgroundProducer(produce if fails == "making the items" else failing, 1, f"test-error-{fails}")
    producer.start()
    items = [producer.next_item() for _ in range(1 if fails == "making the items" else 2)]
    assert isinstance(items[-1], ValueError)
    producer.cancel()
    assert _run_to_end(BackgroundProducer(lambda: iter([7]), 1, f"test-error-{fails}")) == [7]
    assert threads[0].is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_thread_whose_producer_failed_to_close_is_not_kept():
    """An error closing a producer's items ends its thread: a thread kept after that would be handed the
    next producer and never run it, and that producer's consumer would wait forever."""

    class Produced:
        def __iter__(self):
            return self

        def __init__(self):
            self._items = iter([1])

        def __next__(self):
            return next(self._items)

        def close(self):
            raise RuntimeError("closing failed")

    assert _run_to_end(BackgroundProducer(Produced, 1, "test-close-fails")) == [1]
    after = BackgroundProducer(lambda: iter([2]), 1, "test-close-fails")
    after.start()
    assert after.queue.get(timeout=10) == 2
    assert after.queue.get(timeout=10) is END
    after.cancel()


def test_a_cancelled_producer_stops_and_frees_its_thread():
    made = []

    def produce():
        for item in range(1000):
            made.append(item)
            yield item

    producer = BackgroundProducer(produce, 2, "test-cancelled")
    producer.start()
    assert producer.next_item() == 0
    producer.cancel()
    assert len(made) < 10, "the producer stopped at its full queue"
    assert _run_to_end(BackgroundProducer(lambda: iter("ab"), 1, "test-cancelled")) == ["a", "b"]


def test_an_idle_thread_keeps_nothing_of_its_last_producer():
    """A kept thread waiting for its next producer must not hold the last one: that would keep its
    pipeline, and the shard files it has open, alive after the dataset is gone."""

    class Pipeline:  # stands for what a producer's items come from
        def steps(self):
            yield "step"

    pipeline = Pipeline()
    gone = weakref.ref(pipeline)
    assert _run_to_end(BackgroundProducer(pipeline.steps, 1, "test-idle")) == ["step"]
    del pipeline
    gc.collect()
    assert gone() is None


_PASSES_BESIDE_MANY_THREADS = """
import json, os, sys, threading
import numpy as np
import reader
from reader.core import background

if sys.argv[2] == "thread-per-pass":
    background.IDLE_THREADS_KEPT = 0  # each producer thread ends with its pass, as before threads were kept
# More threads than MALLOC_ARENA_MAX (as a cold start's 32 I/O threads on a small host): a new thread
# then shares an arena picked in turn.
ready, done = threading.Barrier(21), threading.Event()

def holder():
    np.ones(1 << 16)
    ready.wait()
    done.wait()

for _ in range(20):
    threading.Thread(target=holder, daemon=True).start()
ready.wait()
dataset = reader.distributed_dataset(sys.argv[1], 1024, seed=0, num_epochs=1)
resident, rows = [], 0
for _ in range(36):
    rows += sum(len(step["id"]) for step in dataset)
    with open("/proc/self/statm") as statm:
        resident.append(int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") >> 20)
print(json.dumps({"grew_mb": resident[-1] - resident[4], "rows": rows}))  # after the first passes' warm-up
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's arenas")
def test_passes_reuse_their_batches_memory_however_many_threads_the_process_has(tmp_path):
    """Each pass's batches are allocated on its producer thread, and glibc keeps freed memory in that
    thread's arena. Producer threads are kept from pass to pass (``reader.core.background``): with a new
    thread each pass and more threads than arenas, each pass left its batches in another arena."""
    rows = 6000
    path = helpers.write_snapshot(
        tmp_path, "passes", helpers.id_batches([1000] * 6, image_shape=(32, 32, 3)), compression="NONE"
    )
    grew = {}
    for threads in ("kept", "thread-per-pass"):
        completed = subprocess.run(
            [sys.executable, "-c", _PASSES_BESIDE_MANY_THREADS, path, threads],
            env={**os.environ, "MALLOC_ARENA_MAX": "16"},
            capture_output=True,
            text=True,
            check=True,
            timeout=300,
        )
        result = json.loads(completed.stdout.strip().splitlines()[-1])
        assert result["rows"] == 36 * rows
        grew[threads] = result["grew_mb"]
    assert grew["thread-per-pass"] > 48, f"each pass's batches should stay in another arena: {grew}"
    assert grew["kept"] < 24, grew  # measured: 3-6 MB kept, 107-145 MB with a thread per pass
