"""Ctrl-C and SIGTERM while a run writes: stop, record why, never leave a lock behind.

Without this, SIGINT raises KeyboardInterrupt wherever the main thread happens
to be (a 50-line traceback through Beam) and SIGTERM kills the driver outright;
either way snapshot.metadata keeps naming a run that will never finish, and
reruns wait for the expiry. Inside ``signals_interrupt_run`` both signals raise
``Interrupted`` in the main thread and are recorded, so the driver marks its run
failed and exits with one line. Further signals during that cleanup are ignored (the
cleanup is a marker write); a rerun would take the run over anyway, because a
pending marker whose process is gone is abandoned (``schemas.writer_process``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading


class Interrupted(BaseException):
    """Raised in the main thread by SIGINT/SIGTERM during a run.

    A BaseException, like KeyboardInterrupt, so ``except Exception`` handlers
    pass it through. A runner that runs DoFns in the main thread (the
    DirectRunner's in_memory mode) may still catch it inside a DoFn and raise
    its own error instead, so the driver asks ``Signals.received``, not the
    exception's type, whether a signal stopped the run.
    """

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number


@dataclasses.dataclass
class Signals:
    """The signal that stopped the run (0: none)."""

    received: int = 0

    @property
    def name(self) -> str:
        return signal.Signals(self.received).name


@contextlib.contextmanager
def signals_interrupt_run():
    """Turns SIGINT and SIGTERM into ``Interrupted`` for the block; yields ``Signals``; restores the handlers after.

    Outside the main thread (signals are delivered only there) it changes nothing.
    """
    signals = Signals()
    if threading.current_thread() is not threading.main_thread():
        yield signals
        return

    def interrupt(signal_number: int, _frame) -> None:
        if signals.received:
            return  # already stopping: let the cleanup finish
        signals.received = signal_number
        raise Interrupted(signal_number)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield signals
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
