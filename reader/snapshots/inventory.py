"""What is on disk under a snapshot root: every snapshot's state and every run directory's role.

Reads markers and listings only (no shard is opened), so it is cheap to run
often: ``snapfeed list`` and ``gc`` and the Airflow sensor build on it.
"""

from __future__ import annotations

import dataclasses

from schemas import metadata, paths, storage
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest, PendingMarker, RunState
from schemas.state_machine import is_expired

FINAL, PENDING, EXPIRED, FAILED, ABANDONED = "final", "pending", "expired pending", "failed", "abandoned"
DEFAULT_EXPIRY_SECONDS = 86400.0


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A ``<run_id>/`` directory and why it is there."""

    run_id: str
    path: str
    num_bytes: int
    newest_mtime: float
    role: str  # live (listed by metadata.final) | writing | superseded | orphan (lost a race or abandoned)


@dataclasses.dataclass(frozen=True)
class SnapshotEntry:
    paths: SnapshotPaths
    state: str
    manifest: Manifest | None
    pending: PendingMarker | None
    runs: tuple[RunDir, ...]

    @property
    def snapshot_id(self) -> str:
        return self.paths.snapshot_id

    @property
    def run_id(self) -> str:
        marker = self.manifest or self.pending
        return marker.run_id if marker else ""

    @property
    def created(self) -> float:
        if self.manifest is not None:
            return self.manifest.finalize_time
        return self.pending.start_time if self.pending is not None else 0.0

    @property
    def newest_mtime(self) -> float:
        return max([run.newest_mtime for run in self.runs] + [self.created])

    def summary(self) -> dict:
        manifest = self.manifest
        return {
            "id": self.snapshot_id,
            "name": manifest.snapshot_name if manifest else "",
            "state": self.state,
            "rows": manifest.num_rows if manifest else None,
            "shards": len(manifest.shards) if manifest else None,
            "bytes": manifest.num_bytes if manifest else sum(run.num_bytes for run in self.runs),
            "codec": manifest.compression if manifest else "",
            "created": self.created,
            "run_id": self.run_id,
            "path": self.paths.directory,
        }


def _run_dir(entry: storage.Entry, role: str) -> RunDir:
    files = storage.list_dir(entry.path, include_temp=True)
    return RunDir(
        run_id=entry.name,
        path=entry.path,
        num_bytes=sum(f.size for f in files),
        newest_mtime=max([f.mtime for f in files] + [entry.mtime]),
        role=role,
    )


def _role(run_id: str, manifest: Manifest | None, pending: PendingMarker | None, pending_live: bool) -> str:
    if manifest is not None and run_id == manifest.run_id:
        return "live"
    if pending is not None and run_id == pending.run_id and pending_live:
        return "writing"
    if manifest is not None and run_id == manifest.supersedes_run_id:
        return "superseded"
    return "orphan"


def inspect(snapshot: SnapshotPaths, *, now: float, expiry_seconds: float = DEFAULT_EXPIRY_SECONDS) -> SnapshotEntry:
    manifest = metadata.read_manifest(snapshot)
    pending = metadata.read_pending(snapshot)
    expired = pending is not None and is_expired(pending, now=now, expiry_seconds=expiry_seconds)
    failed = pending is not None and pending.state == RunState.FAILED
    if manifest is not None:
        state = FINAL
    elif pending is None:
        state = ABANDONED
    else:
        state = FAILED if failed else EXPIRED if expired else PENDING
    pending_live = pending is not None and not failed and not expired
    runs = tuple(
        _run_dir(entry, _role(entry.name, manifest, pending, pending_live))
        for entry in storage.list_dir(snapshot.directory)
        if entry.is_dir and paths.is_run_id(entry.name)
    )
    return SnapshotEntry(snapshot, state, manifest, pending, runs)


def scan(root: str, *, now: float, expiry_seconds: float = DEFAULT_EXPIRY_SECONDS) -> list[SnapshotEntry]:
    """Every snapshot directory under ``root``, oldest first."""
    entries = [
        inspect(SnapshotPaths(root, entry.name), now=now, expiry_seconds=expiry_seconds)
        for entry in storage.list_dir(root)
        if entry.is_dir and paths.is_valid_snapshot_id(entry.name)
    ]
    return sorted(entries, key=lambda e: (e.created, e.snapshot_id))


def listed_files(entry: SnapshotEntry) -> set[str]:
    """Files a finalized manifest lists (never deleted by gc)."""
    if entry.manifest is None:
        return set()
    return {entry.paths.absolute(shard.path) for shard in entry.manifest.shards}
