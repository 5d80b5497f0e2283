"""Whether a pending marker's writer is provably gone: real processes, real /proc."""

import dataclasses
import subprocess
import sys

from schemas import writer_process
from schemas.snapshot_pb2 import PendingMarker, WriterInfo


def _finished_process() -> writer_process.ProcessIdentity:
    """The identity a child recorded of itself before it exited."""
    code = "from schemas import writer_process as w; i = w.current(); print(i.pid, i.start_ticks)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    pid, ticks = map(int, out.split())
    return dataclasses.replace(writer_process.current(), pid=pid, start_ticks=ticks)


def test_this_process_is_not_gone():
    here = writer_process.current()
    assert here.boot_id and here.pid_namespace and here.start_ticks > 0
    assert not writer_process.is_gone(here)


def test_a_process_that_exited_is_gone():
    assert writer_process.is_gone(_finished_process())


def test_a_reused_pid_is_gone():
    """Our own pid with another start time: the pid now belongs to a different process."""
    here = writer_process.current()
    assert writer_process.is_gone(dataclasses.replace(here, start_ticks=here.start_ticks - 1))


def test_a_writer_that_cannot_be_compared_is_never_gone():
    """Another boot (maybe another host with the same name), another PID namespace, or an old marker."""
    dead = _finished_process()
    assert not writer_process.is_gone(dataclasses.replace(dead, boot_id="another-boot"))
    assert not writer_process.is_gone(dataclasses.replace(dead, pid_namespace="pid:[1]"))
    assert not writer_process.is_gone(dataclasses.replace(dead, boot_id="", pid_namespace="", start_ticks=0))


def test_pending_writer_gone_reads_the_marker():
    dead = _finished_process()
    marker = PendingMarker(
        writer=WriterInfo(
            hostname=dead.hostname,
            pid=dead.pid,
            boot_id=dead.boot_id,
            pid_namespace=dead.pid_namespace,
            process_start_ticks=dead.start_ticks,
        )
    )
    assert writer_process.pending_writer_gone(marker)
    marker.writer.process_start_ticks = 0  # written by a snapfeed that did not record it: the expiry decides
    assert not writer_process.pending_writer_gone(marker)
