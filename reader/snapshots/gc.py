"""Reclaiming space: which run directories and snapshots may go, and removing them safely.

Planning is pure over an inventory. Removing re-checks each target just before
deleting it and never deletes a file that a finalized manifest lists, so a
reader that opened the current manifest keeps working; a superseded run stays
for the grace period (``older_than``) for readers that opened the old one.
"""

from __future__ import annotations

import dataclasses

from reader.snapshots.inventory import ABANDONED, EXPIRED, FAILED, FINAL, SnapshotEntry, inspect, listed_files
from schemas import storage


@dataclasses.dataclass(frozen=True)
class Removal:
    path: str
    reason: str
    num_bytes: int
    whole_snapshot: bool = False


def plan_removals(entries: list[SnapshotEntry], *, now: float, older_than_seconds: float) -> list[Removal]:
    cutoff = now - older_than_seconds
    removals: list[Removal] = []
    for entry in entries:
        if entry.state == FINAL:
            for run in entry.runs:
                if run.role in ("superseded", "orphan") and run.newest_mtime < cutoff:
                    why = (
                        "superseded by a forced rewrite" if run.role == "superseded" else "lost a race or was abandoned"
                    )
                    removals.append(Removal(run.path, f"run {run.run_id} of {entry.snapshot_id} {why}", run.num_bytes))
        elif entry.state in (EXPIRED, FAILED, ABANDONED) and entry.newest_mtime < cutoff:
            removals.append(
                Removal(
                    entry.paths.directory,
                    f"snapshot {entry.snapshot_id} is {entry.state}",
                    sum(run.num_bytes for run in entry.runs),
                    whole_snapshot=True,
                )
            )
    return removals


def _still_removable(removal: Removal, entry: SnapshotEntry, *, now: float, expiry_seconds: float) -> bool:
    """Re-reads the markers: a writer may have finalized or started since the plan was made."""
    current = inspect(entry.paths, now=now, expiry_seconds=expiry_seconds)
    if removal.whole_snapshot:
        return current.state in (EXPIRED, FAILED, ABANDONED)
    protected = listed_files(current)
    roles = {run.path: run.role for run in current.runs}
    return roles.get(removal.path) in ("superseded", "orphan") and not any(
        path.startswith(removal.path.rstrip("/") + "/") for path in protected
    )


def remove(
    removals: list[Removal], entries: list[SnapshotEntry], *, now: float, expiry_seconds: float
) -> tuple[list[Removal], list[Removal]]:
    """Deletes what is still removable; returns (removed, skipped)."""
    by_dir = {entry.paths.directory: entry for entry in entries}
    removed, skipped = [], []
    for removal in removals:
        entry = by_dir.get(removal.path) or by_dir[removal.path.rstrip("/").rsplit("/", 1)[0]]
        if _still_removable(removal, entry, now=now, expiry_seconds=expiry_seconds):
            storage.delete_tree(removal.path)
            removed.append(removal)
        else:
            skipped.append(removal)
    return removed, skipped
