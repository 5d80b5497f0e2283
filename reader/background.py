"""A bounded producer thread: items made ahead of their consumer, errors handed over, cancellable.

The reader's iterator runs the pipeline on one (``reader.iterator``), and the
device stage runs host-to-device transfers on another
(``reader.device_prefetch``); both need the same three things: a queue that
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
