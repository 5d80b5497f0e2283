"""Locks a forked process gets back unheld.

A fork copies only the forking thread. A lock that another thread held at that
moment stays held in the child for good, and the first child thread to take it
hangs: a DataLoader worker forked while the trainer's reader threads were
opening a shard of the same dataset would hang on that shard's lock (a test
holds one across a fork). ``Lock`` is a
``threading.Lock`` that is replaced by a new, unheld one in every forked child
(``os.register_at_fork``). What it guards is updated in single assignments or
small dict and list steps, so a child never meets more than one update cut short.
"""

from __future__ import annotations

import os
import threading
import weakref

_LIVE: weakref.WeakSet[Lock] = weakref.WeakSet()


class Lock:
    """A ``threading.Lock`` for ``with`` blocks, new and unheld in a forked child."""

    __slots__ = ("__weakref__", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        _LIVE.add(self)

    def __enter__(self) -> Lock:
        self._lock.acquire()
        return self

    def __exit__(self, *exc_info) -> None:
        self._lock.release()


def _renew_in_child() -> None:
    for lock in list(_LIVE):
        lock._lock = threading.Lock()


os.register_at_fork(after_in_child=_renew_in_child)
