"""Ctrl-C and SIGTERM while a run writes: stop, record why, never leave a lock behind.

Without this, SIGINT raises KeyboardInterrupt wherever the main thread happens
to be (a 50-line traceback through Beam) and SIGTERM kills the driver outright;
either way snapshot.metadata keeps naming a run that will never finish, and
reruns wait for the expiry. Inside ``signals_interrupt_run`` both signals raise
``Interrupted`` in the main thread, so the driver marks its run failed and
exits with one line. Further signals during that cleanup are ignored (the
cleanup is a marker write); a rerun would take the run over anyway, because a
pending marker whose process is gone is abandoned (``schemas.writer_process``).
"""

from __future__ import annotations

import contextlib
import signal
import threading


class Interrupted(BaseException):
    """Raised in the main thread by SIGINT/SIGTERM during a run.

    A BaseException, like KeyboardInterrupt, so the runner's ``except
    Exception`` handlers pass it through instead of wrapping and retrying it.
    """

    def __init__(self, signal_number: int) -> None:
        super().__init__(signal_number)
        self.signal_number = signal_number

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signal_number).name


@contextlib.contextmanager
def signals_interrupt_run():
    """Turns SIGINT and SIGTERM into ``Interrupted`` for the block; restores the handlers after it.

    Outside the main thread (signals are delivered only there) it changes nothing.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    raised = threading.Event()

    def interrupt(signal_number: int, _frame) -> None:
        if raised.is_set():
            return  # already stopping: let the cleanup finish
        raised.set()
        raise Interrupted(signal_number)

    previous = {sig: signal.signal(sig, interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
