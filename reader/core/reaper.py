"""The work a dropped object leaves behind, done on a thread of its own, never inside the garbage collector.

A finalizer (``__del__``, a ``weakref.finalize`` callback) runs wherever the
collector happens to run: on any thread, at any allocation, in the middle of
whatever that thread was doing. Once it ran inside a
``ThreadPoolExecutor.submit`` of the local reader, which holds
concurrent.futures' global lock while it allocates a ``Future``; the
finalizer of a dropped service iterator submitted acks of its own, waited
for that same lock and never returned, and every later ``submit`` of the
process blocked behind it (a training job frozen at a random step, no
error). Any lock, pool, join or I/O in a finalizer can do that.

So a finalizer only signals. ``on_collect(obj, work, *args)`` is the way to
have something done once ``obj`` is gone: its finalizer puts ``(work, args)``
on a ``queue.SimpleQueue`` (whose ``put`` is made to be called from
finalizers: no lock a Python thread holds, reentrant) and one daemon
thread, ``snapfeed-reaper``, runs the work later, in an ordinary context
where it may lock, join, close and call out. ``work`` and ``args`` must not
refer to ``obj`` (a strong reference from the finalizer would keep it alive
forever); they hold what ``obj`` owned instead.

The thread is started by the first ``on_collect`` in each process (never
from a finalizer). A forked child (a DataLoader worker) starts with an empty
queue and no thread: what its parent signalled is its parent's to do, and
what it signals waits for its own reaper, started by its first
``on_collect``. Work left when the interpreter exits is dropped with it, as
the process's file descriptors and connections are.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import weakref
from collections.abc import Callable

log = logging.getLogger(__name__)

_work: queue.SimpleQueue = queue.SimpleQueue()
_started_in: int | None = None  # the pid whose reaper thread runs (a forked child has none)
_starting = threading.Lock()


def on_collect(obj: object, work: Callable[..., object], *args: object) -> weakref.finalize:
    """Has ``work(*args)`` run on the reaper thread once ``obj`` is collected; returns the finalizer
    (``.detach()`` it when the work was done otherwise)."""
    _ensure_running()
    finalizer = weakref.finalize(obj, _signal, (work, args))
    finalizer.atexit = False  # at exit the process's resources go with it
    return finalizer


def _signal(item: tuple[Callable[..., object], tuple]) -> None:
    """The finalizer: hands the work over and returns (``SimpleQueue.put`` takes no lock of ours)."""
    _work.put(item)


def _ensure_running() -> None:
    global _started_in
    if _started_in == os.getpid():
        return
    with _starting:
        if _started_in != os.getpid():
            threading.Thread(target=_run, args=(_work,), name="snapfeed-reaper", daemon=True).start()
            _started_in = os.getpid()


def _run(work: queue.SimpleQueue) -> None:
    while True:
        function, args = work.get()
        try:
            function(*args)
        except BaseException as exc:  # noqa: BLE001 - one failed clean-up must not end the thread that runs the others
            log.warning("snapfeed: cleaning up after a dropped object (%s) failed: %s", _name(function), exc)
            log.debug("the clean-up's traceback", exc_info=True)
        del function, args  # what the work held goes now, not when the next item comes


def _name(function: Callable) -> str:
    return getattr(function, "__qualname__", repr(function))


def _forget_in_child() -> None:
    global _work, _started_in, _starting
    _work, _started_in, _starting = queue.SimpleQueue(), None, threading.Lock()


os.register_at_fork(after_in_child=_forget_in_child)
