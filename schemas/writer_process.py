"""Who a pending marker's writer process is, and whether it is provably gone.

The RFC takes over a pending snapshot only after an expiry (24 hours by
default), since a writer elsewhere may still be working. But a writer on *this*
host can be checked: if its process no longer exists, or its pid now belongs
to another process, nobody will ever finish that run, and a rerun may take it
over at once (an interrupted or killed job must not lock the snapshot for a day).

A pid alone proves nothing: it is reused, it is per PID namespace (containers
sharing a hostname see different processes under one number), and it is
meaningless after a reboot. So the marker also records the boot id, the PID
namespace and the process start time (``/proc/PID/stat`` field 22, clock ticks
since boot), and a writer is called gone only when all of them can be compared.
Anywhere that cannot be checked (another host or boot, another namespace, no ``/proc``),
the answer is "not provably gone" and the expiry decides, as the RFC says.
"""

from __future__ import annotations

import dataclasses
import os
import socket

from schemas.snapshot_pb2 import PendingMarker
from schemas.state_machine import DEFAULT_EXPIRY_SECONDS, pending_status

_PROC = "/proc"


@dataclasses.dataclass(frozen=True)
class ProcessIdentity:
    hostname: str
    pid: int
    boot_id: str = ""
    pid_namespace: str = ""
    start_ticks: int = 0


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii") as handle:
            return handle.read().strip()
    except OSError:
        return ""


def _pid_namespace(pid: int | str) -> str:
    try:
        return os.readlink(f"{_PROC}/{pid}/ns/pid")
    except OSError:
        return ""


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks since boot), or None if there is no such process."""
    stat = _read(f"{_PROC}/{pid}/stat")
    if not stat:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its last ")".
    fields = stat.rpartition(")")[2].split()
    try:
        return int(fields[19])  # field 22 overall: fields[0] here is field 3
    except (IndexError, ValueError):
        return None


def current() -> ProcessIdentity:
    """This process, as a pending marker records its writer."""
    pid = os.getpid()
    return ProcessIdentity(
        hostname=socket.gethostname(),
        pid=pid,
        boot_id=_read(f"{_PROC}/sys/kernel/random/boot_id"),
        pid_namespace=_pid_namespace("self"),
        start_ticks=start_ticks(pid) or 0,
    )


def is_gone(writer: ProcessIdentity, *, here: ProcessIdentity | None = None) -> bool:
    """True only when ``writer`` ran under this kernel boot and PID namespace and provably no longer runs.

    Gone: no process has its pid, or the process with its pid started at
    another time (the pid was reused). Never gone when the writer ran under
    another boot (another host with the same name looks exactly like this host
    before a reboot) or PID namespace, or when either side lacks what it takes
    to compare (an old marker, no ``/proc``): then the expiry decides.
    """
    here = here or current()
    same_process_table = (
        writer.pid > 0
        and writer.start_ticks > 0
        and bool(writer.boot_id)
        and writer.boot_id == here.boot_id
        and bool(writer.pid_namespace)
        and writer.pid_namespace == here.pid_namespace
    )
    return same_process_table and start_ticks(writer.pid) != writer.start_ticks


def pending_writer_gone(pending: PendingMarker) -> bool:
    """Whether the process named by a pending marker provably no longer runs (see ``is_gone``)."""
    writer = pending.writer
    recorded = ProcessIdentity(
        hostname=writer.hostname,
        pid=writer.pid,
        boot_id=writer.boot_id,
        pid_namespace=writer.pid_namespace,
        start_ticks=writer.process_start_ticks,
    )
    return is_gone(recorded)


def run_status(pending: PendingMarker, *, now: float, expiry_seconds: float = DEFAULT_EXPIRY_SECONDS) -> str:
    """``state_machine.pending_status`` of a pending marker, its writer's liveness checked from this host."""
    return pending_status(pending, now=now, expiry_seconds=expiry_seconds, writer_gone=pending_writer_gone(pending))
