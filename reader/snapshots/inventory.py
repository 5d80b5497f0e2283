"""What is on disk under a snapshot root: every snapshot's state and every run directory's role.

Reads markers and listings only (no shard is opened), so it is cheap to run
often: ``snapfeed list`` and ``gc`` and the Airflow sensor build on it.
"""

from __future__ import annotations

import dataclasses

from schemas import metadata, paths, storage, views, writer_process
from schemas.errors import SnapfeedError
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest, PendingMarker

# A pending marker's states are the state machine's, re-exported with FINAL and UNKNOWN as what `snapfeed list` shows.
from schemas.state_machine import ABANDONED, DEFAULT_EXPIRY_SECONDS, EXPIRED, FAILED, PENDING  # noqa: F401

FINAL = "final"
# ABANDONED: a pending marker whose writer process is provably gone (see schemas.writer_process), or run
# directories and marker temps with no marker at all (a writer that died before writing snapshot.metadata).
UNKNOWN = "unknown"  # no markers and nothing snapfeed writes: a folder that is not snapfeed's


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A ``<run_id>/`` directory and why it is there."""

    run_id: str
    path: str
    num_bytes: int
    newest_mtime: float  # of the directory and every file in it: when a writer last touched it
    role: str  # live (listed by metadata.final) | writing | superseded | orphan (lost a race or abandoned)
    foreign: tuple[str, ...] = ()  # entries snapfeed's writer never creates: gc must not delete them
    #: The view versions that list this run ("VIEW@K", from the holds ``schemas.views.add`` left): gc keeps it.
    listed_by: tuple[str, ...] = ()


@dataclasses.dataclass(frozen=True)
class SnapshotEntry:
    paths: SnapshotPaths
    state: str
    manifest: Manifest | None
    pending: PendingMarker | None
    runs: tuple[RunDir, ...]
    newest_mtime: float = 0.0  # newest real timestamp inside (files, run dirs, marker times)
    committed_at: float = 0.0  # when the current metadata.final was committed; 0 if none
    foreign: tuple[str, ...] = ()  # "name" or "run_id/name" of entries snapfeed's writer never creates

    @property
    def snapshot_id(self) -> str:
        return self.paths.snapshot_id

    @property
    def run_id(self) -> str:
        marker = self.manifest or self.pending
        return marker.run_id if marker else ""

    @property
    def created(self) -> float:
        """The marker's time; 0 when there is no marker (nothing records when it was created)."""
        if self.manifest is not None:
            return self.manifest.finalize_time
        return self.pending.start_time if self.pending is not None else 0.0

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
            "created": self.created or None,
            "run_id": self.run_id,
            "path": self.paths.directory,
        }


def _is_writer_file_in_run(entry: storage.Entry) -> bool:
    """A shard, the run's tf.Transform graph, or the temp file either is written under before its rename; or
    a view's hold."""
    if paths.is_transform_entry(entry.name) or paths.is_transform_entry(paths.temp_target(entry.name)):
        return True
    if not entry.is_dir and views.is_hold_name(entry.name):
        return True
    return not entry.is_dir and (paths.is_shard_name(entry.name) or paths.is_shard_name(paths.temp_target(entry.name)))


def _is_writer_entry_in_snapshot(entry: storage.Entry) -> bool:
    """A run directory, a marker, or the temp file a marker is written under."""
    if entry.is_dir:
        return paths.is_run_id(entry.name)
    return paths.is_marker_name(entry.name) or paths.is_marker_name(paths.temp_target(entry.name))


#: What each view's versions list, read once per ``scan``: ``views.listed_runs``, or the error reading it.
ViewListings = dict[str, "dict[tuple[str, str], list[int]] | SnapfeedError"]


def _run_dir(entry: storage.Entry, role: str, snapshot_id: str, listings: ViewListings) -> RunDir:
    files = storage.list_dir(entry.path, include_temp=True)
    held = any(not f.is_dir and views.is_hold_name(f.name) for f in files)
    return RunDir(
        run_id=entry.name,
        path=entry.path,
        num_bytes=sum(f.size for f in files if not f.is_dir),
        newest_mtime=max([f.mtime for f in files] + [entry.mtime]),
        role=role,
        foreign=tuple(f.name for f in files if not _is_writer_file_in_run(f)),
        listed_by=_listed_by(entry.path, snapshot_id, entry.name, listings) if held else (),
    )


def _listed_by(run_dir: str, snapshot_id: str, run_id: str, listings: ViewListings) -> tuple[str, ...]:
    """The versions of the views holding ``run_dir`` that list the run; a view that cannot be read holds it."""
    listed = []
    for view in views.holding_views(run_dir):
        if view not in listings:
            try:
                listings[view] = views.listed_runs(view)
            except SnapfeedError as exc:
                listings[view] = exc
        listing = listings[view]
        if isinstance(listing, SnapfeedError):
            listed.append(f"{view} (unreadable: {listing})")
        else:
            listed += [f"{view}@{number}" for number in listing.get((snapshot_id, run_id), [])]
    return tuple(listed)


def _role(run_id: str, manifest: Manifest | None, pending: PendingMarker | None, pending_live: bool) -> str:
    if manifest is not None and run_id == manifest.run_id:
        return "live"
    if pending is not None and run_id == pending.run_id and pending_live:
        return "writing"
    if manifest is not None and run_id == manifest.supersedes_run_id:
        return "superseded"
    return "orphan"


def _state(manifest: Manifest | None, pending_state: str, listing: list[storage.Entry]) -> str:
    """Markers decide; without them only entries snapfeed's writer makes prove the folder is snapfeed's."""
    if manifest is not None:
        return FINAL
    if pending_state:
        return pending_state
    return ABANDONED if any(_is_writer_entry_in_snapshot(e) for e in listing) else UNKNOWN


def _committed_at(manifest: Manifest | None, listing: list[storage.Entry]) -> float:
    """The later of the manifest's finalize time and metadata.final's mtime (the commit itself)."""
    if manifest is None:
        return 0.0
    mtimes = [e.mtime for e in listing if e.name == paths.FINAL_MARKER and not e.is_dir]
    return max([manifest.finalize_time] + mtimes)


def _newest_mtime(
    manifest: Manifest | None, pending: PendingMarker | None, listing: list[storage.Entry], runs: tuple[RunDir, ...]
) -> float:
    """The newest real timestamp: every entry's mtime, every run's files, and the times in the markers."""
    marker_times = [m.finalize_time for m in [manifest] if m] + [p.start_time for p in [pending] if p]
    return max([e.mtime for e in listing] + [run.newest_mtime for run in runs] + marker_times + [0.0])


def inspect(
    snapshot: SnapshotPaths,
    *,
    now: float,
    expiry_seconds: float = DEFAULT_EXPIRY_SECONDS,
    view_listings: ViewListings | None = None,
) -> SnapshotEntry:
    """``view_listings``: the views' listings read so far in this scan (each view is read once)."""
    view_listings = {} if view_listings is None else view_listings
    listing = storage.list_dir(snapshot.directory, include_temp=True)
    manifest = metadata.read_manifest(snapshot)
    pending = metadata.read_pending(snapshot)
    pending_state = (
        writer_process.run_status(pending, now=now, expiry_seconds=expiry_seconds) if pending is not None else ""
    )
    pending_live = pending_state == PENDING
    runs = tuple(
        _run_dir(entry, _role(entry.name, manifest, pending, pending_live), snapshot.snapshot_id, view_listings)
        for entry in listing
        if entry.is_dir and paths.is_run_id(entry.name)
    )
    foreign = [e.name for e in listing if not _is_writer_entry_in_snapshot(e)]
    foreign += [f"{run.run_id}/{name}" for run in runs for name in run.foreign]
    return SnapshotEntry(
        paths=snapshot,
        state=_state(manifest, pending_state, listing),
        manifest=manifest,
        pending=pending,
        runs=runs,
        newest_mtime=_newest_mtime(manifest, pending, listing, runs),
        committed_at=_committed_at(manifest, listing),
        foreign=tuple(foreign),
    )


def scan(root: str, *, now: float, expiry_seconds: float = DEFAULT_EXPIRY_SECONDS) -> list[SnapshotEntry]:
    """Every directory under ``root`` that could be a snapshot, oldest first; state UNKNOWN if it is not one."""
    view_listings: ViewListings = {}
    entries = [
        inspect(SnapshotPaths(root, entry.name), now=now, expiry_seconds=expiry_seconds, view_listings=view_listings)
        for entry in storage.list_dir(root)
        if entry.is_dir and paths.is_valid_snapshot_id(entry.name)
    ]
    return sorted(entries, key=lambda e: (e.created, e.snapshot_id))


def listed_files(entry: SnapshotEntry) -> set[str]:
    """Files a finalized manifest lists (never deleted by gc)."""
    if entry.manifest is None:
        return set()
    return {entry.paths.absolute(shard.path) for shard in entry.manifest.shards}
