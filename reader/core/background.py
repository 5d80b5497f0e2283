"""A bounded producer thread: items made ahead of their consumer, errors handed over, cancellable.

The reader's iterator runs the pipeline on one (``reader.core.iterator``), and the
device stage runs host-to-device transfers on another
(``reader.outputs.device_prefetch``); both need the same things: a queue that
bounds how far ahead the producer runs, the producer's exception re-raised on
the consumer's thread, a stop that does not leave the producer blocked on
a full queue, and a consumer that never waits on a producer that is gone.

A consumer dropped without ``close()`` (``next(iter(dataset))`` to peek, an
evaluation loop that breaks early) only *signals* its producer from its
finalizer (``ProducedIterator.__del__``): the finalizer may run inside any
code of any thread, so it must not lock, join or submit
(``reader.core.reaper``). The producer holds nothing of its consumer (else
the consumer would never be collected and its threads would live for the
process's life); it sees the flag within ``POLL_SECONDS`` of its next hand-over,
ends, and closes what it produced from on its own thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

from schemas.errors import SnapfeedError

#: Put in the queue after the producer's last item.
END = object()
#: How often a producer blocked on a full queue checks whether it was stopped, and how often a waiting
#: consumer checks that its producer still runs.
POLL_SECONDS = 0.1


class BackgroundProducer(threading.Thread):
    """Runs ``produce()`` and puts its items in ``queue`` (at most ``depth`` waiting), then ``END``.

    An exception raised by the producer (also by ``produce()`` itself) is put
    in the queue in place of the next item; the consumer re-raises it.
    ``produce`` must not refer to the consumer (see the module docstring).
    """

    def __init__(self, produce: Callable[[], Iterator], depth: int, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self._produce = produce
        #: A plain flag, not an Event: setting it takes no lock, so a finalizer may (``stop_soon``).
        self._stopped = False

    def _put(self, item: object) -> bool:
        while not self._stopped:
            try:
                self.queue.put(item, timeout=POLL_SECONDS)
                return True
            except queue.Full:
                continue
        return False

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
            self._produce = None  # what it closed over goes with the thread's last item
            close = getattr(items, "close", None)
            if close is not None:
                close()

    def next_item(self) -> object:
        """The next item, ``END``, or the producer's exception (returned, for the caller to raise after cleanup).

        A producer thread that ended (or never ran) without putting its last
        item is an error here, not a wait forever.
        """
        while True:
            try:
                return self.queue.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if self.is_alive():
                    continue
            try:  # it may have put its last item just before it ended
                return self.queue.get_nowait()
            except queue.Empty:
                return SnapfeedError(
                    f"snapfeed's {self.name} thread ended without handing over its next item or an error "
                    f"({'stopped' if self._stopped else 'never started' if self.ident is None else 'died'}); "
                    f"this is a bug: please report it with the log, and start a new iterator to go on"
                )

    def stop_soon(self) -> None:
        """Asks the thread to end at its next hand-over, and returns at once (safe in a finalizer)."""
        self._stopped = True

    def cancel(self) -> None:
        """Stops the thread and waits (up to 10 s) for it to end."""
        self._stopped = True
        if self.ident is not None and self is not threading.current_thread():
            self.join(timeout=10)


class ProducedIterator:
    """An iterator over what a ``BackgroundProducer`` makes, started on the first ``next``.

    Subclasses say how to start a producer from where the consumer is
    (``_new_producer``, which must not refer to ``self``) and what the
    consumer gets for an item (``_received``); ``close()`` stops the
    producer, and a later ``next`` starts a new one from the consumer's
    position.
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
        # A signal only: the thread ends by itself and closes what it produced from (module docstring).
        producer = self._producer
        if producer is not None:
            producer.stop_soon()
