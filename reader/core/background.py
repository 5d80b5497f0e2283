"""A bounded producer thread: items made ahead of their consumer, errors handed over, cancellable.

The reader's iterator runs the pipeline on one (``reader.core.iterator``), and the
device stage runs host-to-device transfers on another
(``reader.outputs.device_prefetch``); both need the same three things: a queue that
bounds how far ahead the producer runs, the producer's exception re-raised on
the consumer's thread, and a stop that does not leave the producer blocked on
a full queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator

#: Put in the queue after the producer's last item.
END = object()


class BackgroundProducer(threading.Thread):
    """Runs ``produce()`` and puts its items in ``queue`` (at most ``depth`` waiting), then ``END``.

    An exception raised by the producer is put in the queue in place of the
    next item; the consumer re-raises it.
    """

    def __init__(self, produce: Callable[[], Iterator], depth: int, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.queue: queue.Queue = queue.Queue(maxsize=depth)
        self._produce = produce
        self._cancelled = threading.Event()

    def _put(self, item: object) -> bool:
        while not self._cancelled.is_set():
            try:
                self.queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def run(self) -> None:
        items = self._produce()
        try:
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
        self.join(timeout=10)


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
