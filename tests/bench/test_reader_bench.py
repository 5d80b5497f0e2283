"""The reader bench's account of what decides its ratio on hosts it does not run on (``bench.reader_bench``)."""

import threading
import time

from bench import reader_bench


def test_what_decides_gives_the_ratio_the_cpu_figures_allow(monkeypatch):
    monkeypatch.setattr(reader_bench.os, "cpu_count", lambda: 2)
    ours = {"elements_per_s": 40.0, "threads_cpu_s_per_gb": {"gathering": 0.2, "pools": 0.6, "consumer": 0.0}}
    gather = {"elements_per_s": 100.0, "cpu_s_per_gb": 0.2}
    line = reader_bench.what_decides(ours, gather)
    # 2 cores shared: (0.2 + 0.6) / 2 per GB; 4: the gathering thread's 0.2; measured 40 / 100
    assert "= 0.50x (measured 0.40x)" in line and "on 4 free cores 1.00x" in line and "N / max(G, M) = 1.00x" in line
    beside_a_hog = reader_bench.what_decides(ours, gather, hogs=1)
    assert "on 1 free cores" in beside_a_hog and "= 0.25x (measured 0.40x)" in beside_a_hog


def test_thread_cpu_goes_to_the_role_its_name_gives():
    """A pool thread's CPU counts to the pools while it lives, and to the rest (where each pass's ended
    gathering thread is counted) once it has ended."""
    before, cpu_before = reader_bench.thread_roles_cpu_s(), time.process_time()
    spun, release = threading.Event(), threading.Event()

    def spin():
        started = time.thread_time()
        while time.thread_time() - started < 0.3:
            pass
        spun.set()
        release.wait(10)

    pool_thread = threading.Thread(target=spin, name="snapfeed-block_7")
    pool_thread.start()
    spun.wait(10)
    alive = reader_bench.threads_cpu_s_per_gb(before, cpu_before, 0.5)
    release.set()
    pool_thread.join()
    ended = reader_bench.threads_cpu_s_per_gb(before, cpu_before, 0.5)
    assert alive["pools"] >= 0.5 and alive["gathering"] < 0.2  # 0.3 s per half a GB
    assert ended["pools"] == 0.0 and ended["gathering"] >= 0.5
