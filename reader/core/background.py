"""A bounded producer: items made ahead of their consumer on a thread of their own, errors handed over,
cancellable.

The reader's iterator runs the pipeline on one (``reader.core.iterator``), and the
device stage runs host-to-device transfers on another
(``reader.outputs.device_prefetch``); both need the same three things: a queue that
bounds how far ahead the producer runs, the producer's exception re-raised on
the consumer's thread, and a stop that does not leave the producer blocked on
a full queue.

Producers run on threads kept from one producer to the next (``_ProducerThread``),
not on a thread each. A pass's batches are allocated on its producer's thread, and
glibc keeps freed memory in the arena (heap) of the thread that allocated it
(``reader.core.allocator``). It gives a new thread an arena of its own until there are
8 per core, then shares the existing ones in turn: where threads outnumber arenas (16
on 2 cores, and reading a cold disk starts 32 I/O threads), a thread per pass put
each pass's batches in another arena, each of which kept them. On the 2-core VM RSS
grew from 200 to 440 MB over 30 passes of 3 KB rows (3 runs of 3); a kept thread keeps
its arena, and reuses what the passes before it freed.
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable, Iterator

#: Put in the queue after the producer's last item.
END = object()
#: Idle producer threads kept per producer name; more than that end when their producer does.
IDLE_THREADS_KEPT = 4


class BackgroundProducer:
    """Runs ``produce()`` on a producer thread and puts its items in ``queue`` (at most ``depth``
    waiting), then ``END``.

    An exception raised by the producer is put in the queue in place of the
    next item; the consumer re-raises it.
    """

    def __init__(self, produce: Callable[[], Iterator], depth: int, name: str) -> None:
        self.name = name
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self._produce = produce
        self._cancelled = threading.Event()
        self._started = False
        self._done = threading.Event()  # set once its thread is free for the next producer

    def _put(self, item: object) -> bool:
        while not self._cancelled.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def start(self) -> None:
        self._started = True
        _threads.run(self)

    def run(self) -> None:
        items = None
        try:
            items = self._produce()
            for item in items:
                if not self._put(item):
                    return
            self._put(END)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer, which re-raises it
            self._put(exc)
        finally:
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def next_item(self) -> object:
        """The next item, ``END``, or the producer's exception (returned, for the caller to raise after cleanup)."""
        return self.queue.get()

    def cancel(self) -> None:
        self._cancelled.set()
        if self._started:
            self._done.wait(timeout=10)


def producing() -> bool:
    """Whether this is a producer's thread (not its consumer's)."""
    return isinstance(threading.current_thread(), _ProducerThread)


class _ProducerThread(threading.Thread):
    """A daemon thread running producers one after another, kept idle between them (``_IdleThreads``)."""

    def __init__(self, idle: _IdleThreads, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self._idle = idle
        self._next: queue.SimpleQueue[BackgroundProducer] = queue.SimpleQueue()

    def hand(self, producer: BackgroundProducer) -> None:
        self._next.put(producer)

    def run(self) -> None:
        while self._run_next():
            pass

    def _run_next(self) -> bool:
        """Runs the next producer handed over; False when this thread is not kept for another. The
        producer is let go on return: an idle thread must not keep its pipeline (open shards) alive."""
        producer = self._next.get()
        try:
            producer.run()
        except BaseException:
            producer._done.set()
            raise  # from closing its items: this thread ends (threading's excepthook reports it), never kept
        kept = self._idle.keep(self)  # before the producer says it ended: its successor finds this thread
        producer._done.set()
        return kept


class _IdleThreads:
    """Producer threads waiting for their next producer, per producer name, most recently used last.

    A forked process has none of its parent's threads: it starts with none kept.
    """

    def __init__(self) -> None:
        self._forget()
        os.register_at_fork(after_in_child=self._forget)

    def _forget(self) -> None:
        self._lock = threading.Lock()
        self._kept: dict[str, list[_ProducerThread]] = {}

    def run(self, producer: BackgroundProducer) -> None:
        with self._lock:
            kept = self._kept.get(producer.name)
            thread = kept.pop() if kept else None
        if thread is None:
            thread = _ProducerThread(self, producer.name)
            thread.start()
        thread.hand(producer)

    def keep(self, thread: _ProducerThread) -> bool:
        """Keeps ``thread`` for the next producer of its name; False when enough are kept already."""
        with self._lock:
            kept = self._kept.setdefault(thread.name, [])
            if len(kept) >= IDLE_THREADS_KEPT:
                return False
            kept.append(thread)
            return True


_threads = _IdleThreads()


class ProducedIterator:
    """An iterator over what a ``BackgroundProducer`` makes, started on the first ``next``.

    Subclasses say how to start a producer from where the consumer is
    (``_new_producer``) and what the consumer gets for an item (``_received``);
    ``close()`` stops the producer, and a later ``next`` starts a new one from
    the consumer's position.
    """

    _producer: BackgroundProducer | None = None
    _finished: bool = False

    def _new_producer(self) -> BackgroundProducer:
        raise NotImplementedError

    def _received(self, item: object) -> object:
        raise NotImplementedError

    def _ended(self) -> None:
        """Runs once the producer has made its last item, before ``close``."""

    def __iter__(self):
        return self

    def __next__(self):
        if self._finished:
            raise StopIteration
        if self._producer is None:
            self._producer = self._new_producer()
            self._producer.start()
        item = self._producer.next_item()
        if item is END or isinstance(item, BaseException):
            self._finished = True
            if item is END:
                self._ended()
            self.close()
            if item is END:
                raise StopIteration
            raise item
        return self._received(item)

    def _stop_producer(self) -> bool:
        """Stops the producer if one runs; True if it did."""
        if self._producer is None:
            return False
        self._producer.cancel()
        self._producer = None
        return True

    def close(self) -> None:
        self._stop_producer()

    def __del__(self) -> None:
        self.close()


class ItemsOnKeptThread(ProducedIterator):
    """``items``, iterated on a kept producer thread ``depth`` ahead of the consumer: for a consumer whose own
    threads come and go, so that what producing allocates stays in one thread's arena."""

    def __init__(self, items: Iterator, depth: int, name: str) -> None:
        self._items = items
        self._depth = depth
        self._name = name

    def _new_producer(self) -> BackgroundProducer:
        return BackgroundProducer(lambda: self._items, self._depth, self._name)

    def _received(self, item: object) -> object:
        return item
