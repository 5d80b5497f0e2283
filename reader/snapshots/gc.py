"""Reclaiming space: which run directories and snapshots may go, and removing them safely.

Planning is pure over an inventory. gc only ever removes what it can prove is
snapfeed's: a snapshot directory holding nothing but markers, marker temps and
run directories, or a run directory holding nothing but shards and shard temps
(``schemas.paths`` names them). A folder without markers and without such
entries is not snapfeed's and is left alone, whatever its age.

Ages come from real timestamps, never a default of 0: the newest mtime inside
and the times the markers record. A run that is not live may have been the live
one until the current ``metadata.final`` was committed (a forced rewrite swaps
the marker), so its grace period (``older_than``) starts no earlier than that
commit: a reader that opened the old manifest just before the swap keeps it.

Removing re-plans each target from the markers on disk just before deleting
it, and never deletes a file that a finalized manifest lists, nor a run that a
version of a view lists (``schemas.views``: the view left a hold in the run).
"""

from __future__ import annotations

import dataclasses

from reader.snapshots.inventory import (
    ABANDONED,
    EXPIRED,
    FAILED,
    FINAL,
    PENDING,
    UNKNOWN,
    RunDir,
    SnapshotEntry,
    inspect,
    listed_files,
)
from schemas import storage
from schemas.paths import SnapshotPaths
from schemas.state_machine import describe_pending

#: States whose whole snapshot directory may go: nothing was committed and no writer is active.
REMOVABLE_STATES = (EXPIRED, FAILED, ABANDONED)
_WHY = {"superseded": "superseded by a forced rewrite", "orphan": "lost a race or was abandoned"}


@dataclasses.dataclass(frozen=True)
class Removal:
    path: str
    reason: str
    num_bytes: int
    snapshot: SnapshotPaths
    whole_snapshot: bool = False


def run_idle_since(entry: SnapshotEntry, run: RunDir) -> float:
    """When a non-live run of a finalized snapshot was last written or last possibly live.

    The current commit bounds when any older run stopped being live, so it
    counts as well as the run's own newest mtime.
    """
    return max(run.newest_mtime, entry.committed_at)


def _stale_runs(entry: SnapshotEntry, cutoff: float) -> list[Removal]:
    """Superseded and orphan runs of a finalized snapshot, past the grace period, holding only shards."""
    return [
        Removal(run.path, f"run {run.run_id} of {entry.snapshot_id} {_WHY[run.role]}", run.num_bytes, entry.paths)
        for run in entry.runs
        if run.role in _WHY and not run.foreign and not run.listed_by and run_idle_since(entry, run) < cutoff
    ]


def _whole_snapshot(entry: SnapshotEntry, cutoff: float) -> list[Removal]:
    """An expired, failed or abandoned snapshot untouched for the grace period, holding only snapfeed's files."""
    if entry.state not in REMOVABLE_STATES or entry.foreign or entry.newest_mtime >= cutoff:
        return []
    size = sum(run.num_bytes for run in entry.runs)
    reason = f"snapshot {entry.snapshot_id} is {entry.state}"
    return [Removal(entry.paths.directory, reason, size, entry.paths, whole_snapshot=True)]


def plan_removals(entries: list[SnapshotEntry], *, now: float, older_than_seconds: float) -> list[Removal]:
    cutoff = now - older_than_seconds
    removals: list[Removal] = []
    for entry in entries:
        removals += _stale_runs(entry, cutoff) if entry.state == FINAL else _whole_snapshot(entry, cutoff)
    return removals


def _foreign_text(names: tuple[str, ...]) -> str:
    shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
    return f"holds files snapfeed did not write ({shown})"


def _age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{max(seconds, 0):.0f}s"


def _left_alone_snapshot(entry: SnapshotEntry, cutoff: float, now: float) -> list[str]:
    where = entry.paths.directory
    if entry.state == UNKNOWN:
        return [f"left {where} alone: not snapfeed's (no snapshot markers or run directories)"]
    if entry.state == PENDING:
        return [
            f"left {where} alone: pending, {describe_pending(entry.pending)} is writing it; it becomes removable "
            f"once that process is gone or the pending marker expires (--expiry-seconds)"
        ]
    if entry.state in REMOVABLE_STATES and entry.foreign:
        return [f"left {where} alone: {entry.state} but {_foreign_text(entry.foreign)}"]
    if entry.state in REMOVABLE_STATES and entry.newest_mtime >= cutoff:
        return [
            f"left {where} alone: {entry.state}, last written {_age(now - entry.newest_mtime)} ago, within --older-than"
        ]
    return []


def _left_alone_runs(entry: SnapshotEntry, cutoff: float, now: float) -> list[str]:
    notes = []
    for run in entry.runs:
        if run.role not in _WHY:
            continue
        if run.foreign:
            notes.append(f"left {run.path} alone: {run.role} run but {_foreign_text(run.foreign)}")
        elif run.listed_by:
            shown = ", ".join(run.listed_by[:3]) + (
                f" and {len(run.listed_by) - 3} more" if len(run.listed_by) > 3 else ""
            )
            notes.append(f"left {run.path} alone: {run.role} run listed by view version {shown}")
        elif (idle := run_idle_since(entry, run)) >= cutoff:
            notes.append(f"left {run.path} alone: {run.role} run, idle for {_age(now - idle)}, within --older-than")
    return notes


def left_alone(entries: list[SnapshotEntry], *, now: float, older_than_seconds: float) -> list[str]:
    """What gc leaves and why, so a user is never left wondering why space was not freed.

    Live runs of finalized snapshots are not mentioned: keeping them is the point.
    """
    cutoff = now - older_than_seconds
    notes = []
    for entry in entries:
        if entry.state == FINAL:
            notes += _left_alone_runs(entry, cutoff, now)
        else:
            notes += _left_alone_snapshot(entry, cutoff, now)
    return notes


def _still_removable(removal: Removal, *, now: float, older_than_seconds: float, expiry_seconds: float) -> bool:
    """Re-reads the markers and re-plans: a writer may have finalized, started or superseded since the plan."""
    current = inspect(removal.snapshot, now=now, expiry_seconds=expiry_seconds)
    replanned = plan_removals([current], now=now, older_than_seconds=older_than_seconds)
    inside = removal.path.rstrip("/") + "/"
    protected = any(path.startswith(inside) for path in listed_files(current))
    return removal.path in {r.path for r in replanned} and not protected


def remove(
    removals: list[Removal], *, now: float, older_than_seconds: float, expiry_seconds: float
) -> tuple[list[Removal], list[Removal]]:
    """Deletes what is still removable; returns (removed, skipped)."""
    removed, skipped = [], []
    for removal in removals:
        if _still_removable(removal, now=now, older_than_seconds=older_than_seconds, expiry_seconds=expiry_seconds):
            storage.delete_tree(removal.path)
            removed.append(removal)
        else:
            skipped.append(removal)
    return removed, skipped
