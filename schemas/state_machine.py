"""The snapshot state machine (RFC "Standard Kernel Workflow"), pure logic.

One implementation shared by the Beam job (write or reuse?) and the reader
(read or wait?). It only looks at the two markers and the clock, so it is
tested directly without files.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum

from schemas.errors import UsageError
from schemas.snapshot_pb2 import Manifest, PendingMarker, RunState


class Mode(str, enum.Enum):
    AUTO = "auto"
    WRITE = "write"
    READ = "read"
    PASSTHROUGH = "passthrough"

    @classmethod
    def parse(cls, value: str) -> Mode:
        try:
            return cls(value.lower())
        except ValueError:
            choices = ", ".join(m.value for m in cls)
            raise UsageError(f"unknown mode {value!r}; choose one of: {choices}") from None


class Action(str, enum.Enum):
    WRITE = "write"  # start a new run
    READ = "read"  # a finalized snapshot exists: use it
    PASSTHROUGH = "passthrough"  # another writer is in progress


@dataclasses.dataclass(frozen=True)
class Decision:
    action: Action
    reason: str
    supersedes_run_id: str = ""  # a forced write replacing this finalized run


def format_time(unix_seconds: float) -> str:
    return datetime.datetime.fromtimestamp(unix_seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


#: The RFC's default for ``--pending_snapshot_expiry_seconds``: a pending run older than this is abandoned.
DEFAULT_EXPIRY_SECONDS = 86400.0

# What a pending marker says about its run (``pending_status``), in the words `snapfeed list` shows.
PENDING, EXPIRED, FAILED, ABANDONED = "pending", "expired pending", "failed", "abandoned"


def describe_pending(pending: PendingMarker) -> str:
    """'run X since T' (or 'failed at T') in the words the CLI and errors use."""
    where = f" on {pending.writer.hostname} (pid {pending.writer.pid})" if pending.writer.hostname else ""
    if pending.state == RunState.FAILED:
        # Markers written before failed_time existed only say when the run started.
        when = (
            f"at {format_time(pending.failed_time)}"
            if pending.failed_time
            else f"(started {format_time(pending.start_time)})"
        )
        return f"run {pending.run_id} failed {when}{where}: {pending.error or 'no reason recorded'}"
    return f"run {pending.run_id} since {format_time(pending.start_time)}{where}"


def is_expired(pending: PendingMarker, *, now: float, expiry_seconds: float) -> bool:
    return now - pending.start_time > expiry_seconds


def pending_status(pending: PendingMarker, *, now: float, expiry_seconds: float, writer_gone: bool) -> str:
    """FAILED, ABANDONED (``writer_gone``: its process provably no longer runs), EXPIRED, or PENDING.

    Only PENDING has a writer that may still finalize the run: it is the one
    state worth waiting on (the reader's ``wait_seconds``); the others are
    taken over by the next run of the job (``decide``).
    """
    if pending.state == RunState.FAILED:
        return FAILED
    if writer_gone:
        return ABANDONED
    return EXPIRED if is_expired(pending, now=now, expiry_seconds=expiry_seconds) else PENDING


def decide(
    *,
    mode: Mode,
    pending: PendingMarker | None,
    manifest: Manifest | None,
    now: float,
    expiry_seconds: float,
    writer_gone: bool = False,
    lost_race: bool = False,
) -> Decision:
    """What a writer should do given the markers found on disk.

    ``writer_gone``: the pending marker's writer process provably no longer
    runs (``schemas.writer_process``). Its run can never finish, so it is taken
    over at once instead of after ``expiry_seconds``: the expiry exists for
    writers whose liveness cannot be checked.

    ``lost_race``: the writer's own run lost the race to another writer, whom it
    reports: ``mode`` is ignored (a loser forces nothing) and the ``auto`` rules
    apply, with one difference. A forced write that beat it may still be
    replacing a finalized run; the ``auto`` rule would read the old run and hand
    back the very data the winner is replacing, so while the pending marker
    names a live run that supersedes the finalized one, that run is in progress,
    which is what a loser of a non-forced race reports.
    """
    if lost_race:
        mode = Mode.AUTO  # a loser never forces anything: it reports the winner
    if mode is Mode.WRITE:
        supersedes = manifest.run_id if manifest is not None else ""
        reason = f"forced write (replaces finalized run {supersedes})" if supersedes else "forced write"
        return Decision(Action.WRITE, reason, supersedes_run_id=supersedes)
    if mode is Mode.READ:
        return Decision(Action.READ, "forced read")
    if mode is Mode.PASSTHROUGH:
        return Decision(Action.PASSTHROUGH, "forced passthrough")
    status = (
        ""
        if pending is None
        else pending_status(pending, now=now, expiry_seconds=expiry_seconds, writer_gone=writer_gone)
    )
    # A loser reports a live forced write that replaces the finalized run as in progress, not the old run as read.
    replaced = lost_race and status == PENDING and manifest is not None and pending.supersedes_run_id == manifest.run_id
    if manifest is not None and not replaced:
        return Decision(Action.READ, f"finalized by run {manifest.run_id}")
    if pending is None:
        return Decision(Action.WRITE, "no snapshot yet")
    if status == FAILED:
        return Decision(Action.WRITE, f"previous {describe_pending(pending)}")
    if status == ABANDONED:
        return Decision(Action.WRITE, f"taking over abandoned {describe_pending(pending)}: that process is gone")
    if status == EXPIRED:
        return Decision(Action.WRITE, f"taking over expired {describe_pending(pending)}")
    return Decision(Action.PASSTHROUGH, f"in progress by {describe_pending(pending)}")
