"""The snapshot runs a service process holds open, keyed by (directory, run id).

``--mode=write`` replaces a snapshot's run under the same directory, so a
directory alone does not say which rows a consumer planned from: consumers
send the run id they opened, and the dispatcher and workers serve exactly that
run. The old run stays on disk until ``gc``, so a server that still holds it
open keeps serving consumers that planned from it; one that does not can only
open the directory's current run, and refuses any other (``protocol.ReplacedRunError``)
rather than send rows of another run.

What is held is bounded (``BoundedCache``): a run let go of closes its shard
files once the last stream reading it ends.
"""

from __future__ import annotations

import collections
import concurrent.futures
import threading
from collections.abc import Callable, Hashable

from reader.core.snapshot import Snapshot, open_snapshot
from reader.core.union import SnapshotUnion
from reader.service import protocol
from reader.service.protocol import ReplacedRunError
from schemas import storage, views
from schemas.errors import SnapfeedError, UsageError


def open_run(directory: str, run_id: str) -> Snapshot | SnapshotUnion:
    """Run ``run_id`` of the snapshot in ``directory``, when it is still that snapshot's run; for a union sent
    (``protocol.members``), each member's run, read as one."""
    folders, run_ids = protocol.members(directory), protocol.members(run_id)
    if len(folders) != len(run_ids):
        raise UsageError(f"{len(folders)} snapshot folders were sent with {len(run_ids)} run ids: send one run each")
    opened = [_open_one(folder, run) for folder, run in zip(folders, run_ids, strict=True)]
    return opened[0] if len(opened) == 1 else SnapshotUnion(tuple(opened))


def _open_one(directory: str, run_id: str) -> Snapshot:
    """The snapshot's current run, or an older one a view holds (a pinned ``VIEW@K`` reads the run it recorded)."""
    snapshot = open_snapshot(directory)
    if snapshot.metadata.run_id == run_id:
        return snapshot
    held = _held_by_a_view(snapshot, run_id)
    if held is None:
        raise ReplacedRunError(replaced_run_message(directory, run_id, snapshot.metadata.run_id))
    return held


def _held_by_a_view(current: Snapshot, run_id: str) -> Snapshot | None:
    """Run ``run_id`` of ``current``'s folder, when a view that left a hold in that run's folder lists it: read
    from the view's copy of the run's manifest, as the local reader reads a view's member
    (``reader.core.union.open_view``). The hold is in the snapshot's own folder, within the allowed roots, and
    names the view; a run no view holds stays refused.
    """
    run_dir = current.paths.run_dir(run_id)
    if not storage.is_dir(run_dir):
        return None
    for view in views.holding_views(run_dir):
        member = views.Member(current.paths.directory, current.snapshot_id, run_id, 0)
        try:
            manifest = views.member_manifest(view, member)
        except SnapfeedError:
            continue  # a view that no longer has its copy holds nothing here
        return Snapshot(current.paths, manifest)
    return None


def replaced_run_message(directory: str, run_id: str, current: str) -> str:
    return (
        f"run {run_id or '(none given)'} is no longer the run of {directory} (it was rewritten; now run "
        f"{current}): open it again (reader.distributed_dataset) to read the new run"
    )


class BoundedCache:
    """At most ``capacity`` values by key, the least recently used dropped first; thread-safe.

    A value is built once per key, outside the cache's lock: a slow build (a
    snapshot on a slow bucket) holds up only the callers asking for that key.
    A build that raises is not remembered, so the next caller tries again.
    """

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._entries: collections.OrderedDict[Hashable, concurrent.futures.Future] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[], object]):
        with self._lock:
            entry = self._entries.get(key)
            building = entry is None
            if building:
                entry = self._entries[key] = concurrent.futures.Future()
                while len(self._entries) > self._capacity:
                    self._entries.popitem(last=False)  # its callers in flight keep their reference
            else:
                self._entries.move_to_end(key)
        if building:
            try:
                entry.set_result(build())
            except BaseException as exc:  # noqa: BLE001 - every caller waiting on this key gets it too
                with self._lock:
                    if self._entries.get(key) is entry:
                        del self._entries[key]
                entry.set_exception(exc)
        return entry.result()
