"""reader.core.loading.Loading: reads on a pool, the waiting caller running those not started yet."""

import concurrent.futures
import threading

import pytest

from reader.core.loading import Loading


def test_a_waiting_caller_runs_unstarted_reads_itself_and_results_keep_their_order():
    release = threading.Event()
    ran_on: dict[int, int] = {}

    def read(index: int):
        def run():
            if index == 0:
                release.wait(5)  # holds the pool's only thread
            ran_on[index] = threading.get_ident()
            return index * 10

        return run

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = Loading(pool, [read(i) for i in range(4)], lambda results: results)
        threading.Timer(0.2, release.set).start()
        assert loading.result() == [0, 10, 20, 30]
        assert loading.result() == [0, 10, 20, 30]  # assembled once
    caller = threading.get_ident()
    assert ran_on[0] != caller and all(ran_on[i] == caller for i in (1, 2, 3))


def test_cancel_waits_for_running_reads_and_drops_the_rest():
    started, release = threading.Event(), threading.Event()
    finished = []

    def slow():
        started.set()
        release.wait(5)
        finished.append("slow")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        loading = Loading(pool, [slow, lambda: finished.append("never")], lambda results: results)
        started.wait(5)
        threading.Timer(0.2, release.set).start()
        loading.cancel()
        assert finished == ["slow"], "cancel returned only after the running read finished"


def test_a_read_error_reaches_the_caller():
    def broken():
        raise OSError("unreadable")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        with pytest.raises(OSError, match="unreadable"):
            Loading(pool, [broken], lambda results: results).result()
