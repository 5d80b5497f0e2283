"""Views: numbered versions of a list of snapshots, committed atomically (the daily window of a scheduled job).

A view is a folder (local, ``gs://``, ``s3://``)::

    VIEW/snapfeed-view.json           what marks the folder as a view
    VIEW/versions/00000001.json       version 1: its snapshots, oldest first
    VIEW/versions/00000002.json       ...
    VIEW/manifests/<id>-<run>.json    the manifest of each snapshot run a version lists

A version is written once, with ``storage.create_exclusive`` (a conditional
write on buckets), never changed: ``add`` reads the latest version K and
creates K+1; when another ``add`` created K+1 first, it reads again and tries
K+2, so two racing adds both land, in some order, and none is lost.

A version records each snapshot's folder, id and run, and ``add`` keeps a copy
of that run's manifest in the view: a later ``--mode=write`` of the same
folder makes a new run (and a new version, once added) but never changes what
an existing version reads. The run's shards stay on disk while a version lists
them: ``add`` leaves a hold file in the run's folder naming the view, and
``snapfeed gc`` keeps every run that a version of a view holding it lists.

``VIEW`` reads the latest version, resolved once when a dataset is opened;
``VIEW@K`` pins version K.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import re
import time
from collections.abc import Callable

from schemas import metadata, paths, storage
from schemas.errors import CorruptSnapshotError, SnapshotNotFoundError, UsageError
from schemas.paths import SnapshotPaths
from schemas.snapshot_pb2 import Manifest

MARKER = "snapfeed-view.json"
VERSIONS = "versions"
MANIFESTS = "manifests"
VIEW_FORMAT = 1
#: A hold file in a run's folder: ``view-hold-<digest of the view's path>.json``.
HOLD_PREFIX = "view-hold-"
_HOLD = re.compile(r"^" + re.escape(HOLD_PREFIX) + r"[0-9a-f]{16}\.json$")
_VERSION_FILE = re.compile(r"^(?P<number>[0-9]{8,})\.json$")
_PINNED = re.compile(r"^(?P<view>.+)@(?P<version>[0-9]+)$")
#: How many times ``add`` tries again after losing the race for the next version number.
_ATTEMPTS = 100


@dataclasses.dataclass(frozen=True)
class Member:
    """One snapshot run a version lists."""

    directory: str
    snapshot_id: str
    run_id: str
    num_rows: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, fields: dict) -> Member:
        return cls(str(fields["directory"]), str(fields["snapshot_id"]), str(fields["run_id"]), int(fields["num_rows"]))

    @property
    def key(self) -> tuple[str, str]:
        return self.snapshot_id, self.run_id


@dataclasses.dataclass(frozen=True)
class Version:
    """Version ``number`` of the view at ``view``: its snapshots, oldest first."""

    view: str
    number: int
    members: tuple[Member, ...]
    created: float
    keep: int | None = None
    #: A tf.Transform window graph over the members (``beam_jobs.preprocessing.tft_window``): its folder
    #: (relative to the view), files with size and CRC32C, and what its analysis read; None for most views.
    transform_graph: dict | None = None

    def to_json(self) -> bytes:
        fields = {
            "format": VIEW_FORMAT,
            "version": self.number,
            "created": self.created,
            "keep": self.keep,
            "snapshots": [member.to_json() for member in self.members],
        }
        if self.transform_graph is not None:
            fields["transform_graph"] = self.transform_graph
        return (json.dumps(fields, indent=1, sort_keys=True) + "\n").encode()

    @property
    def num_rows(self) -> int:
        return sum(member.num_rows for member in self.members)

    def summary(self) -> dict:
        """What ``snapfeed view show`` prints: the version, its snapshots, and its window graph's folder, if any."""
        return {
            "view": self.view,
            "version": self.number,
            "created": self.created,
            "rows": self.num_rows,
            "snapshots": [member.to_json() for member in self.members],
            "transform_graph": None if self.transform_graph is None else self.transform_graph["directory"],
        }


def split_pinned(path: str) -> tuple[str, int | None]:
    """``VIEW@K`` as ``(VIEW, K)``; a path without ``@K`` as ``(path, None)``."""
    match = _PINNED.match(str(path))
    if match is None:
        return str(path), None
    return match["view"], int(match["version"])


def is_view(path: str) -> bool:
    """Whether ``path`` (without ``@K``) is a view's folder."""
    return storage.exists(paths.join(path, MARKER))


def is_hold_name(name: str) -> bool:
    return bool(_HOLD.match(name))


def _version_path(view: str, number: int) -> str:
    return paths.join(view, VERSIONS, f"{number:08d}.json")


def _manifest_path(view: str, member: Member) -> str:
    return paths.join(view, MANIFESTS, f"{member.snapshot_id}-{member.run_id}.json")


def hold_path(snapshot: SnapshotPaths, run_id: str, view: str) -> str:
    digest = hashlib.sha256(paths.canonical(view).encode()).hexdigest()[:16]
    return paths.join(snapshot.run_dir(run_id), f"{HOLD_PREFIX}{digest}.json")


def version_numbers(view: str) -> list[int]:
    """The view's version numbers, oldest first (none: a view with no version yet)."""
    folder = paths.join(view, VERSIONS)
    if not storage.is_dir(folder):
        return []
    found = (_VERSION_FILE.match(entry.name) for entry in storage.list_dir(folder) if not entry.is_dir)
    return sorted(int(match["number"]) for match in found if match)


def read_version(view: str, number: int | None = None) -> Version:
    """Version ``number`` of ``view`` (None: the latest); one line naming the view and what to do otherwise."""
    if not is_view(view):
        raise SnapshotNotFoundError(
            f"no view at {view} (no {MARKER}): create one with `snapfeed view add {view} SNAPSHOT`, or check the path"
        )
    numbers = version_numbers(view)
    if not numbers:
        raise SnapshotNotFoundError(f"view {view} has no version yet: `snapfeed view add {view} SNAPSHOT` adds one")
    if number is None:
        number = numbers[-1]
    elif number not in numbers:
        raise SnapshotNotFoundError(
            f"view {view} has no version {number} (it has {numbers[0]}..{numbers[-1]}); "
            f"`snapfeed view show {view}` shows the latest"
        )
    where = _version_path(view, number)
    try:
        fields = json.loads(storage.read_bytes(where))
        if fields.get("format") != VIEW_FORMAT:
            raise UsageError(f"{where} is view format {fields.get('format')!r}; this snapfeed reads {VIEW_FORMAT}")
        members = tuple(Member.from_json(member) for member in fields["snapshots"])
        return Version(
            view,
            int(fields["version"]),
            members,
            float(fields["created"]),
            fields.get("keep"),
            fields.get("transform_graph"),
        )
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptSnapshotError(f"{where} is not a view version ({exc}); the file is damaged") from exc


def member_manifest(view: str, member: Member) -> Manifest:
    """The manifest of ``member``'s run, as the view copied it when the run was added."""
    where = _manifest_path(view, member)
    try:
        data = storage.read_bytes(where)
    except FileNotFoundError:
        raise CorruptSnapshotError(
            f"view {view} lists {member.directory} (run {member.run_id}) but its copy of that run's manifest, "
            f"{where}, is missing; add the snapshot again with `snapfeed view add {view} {member.directory}`"
        ) from None
    return metadata.from_json(data, Manifest, where)


def add(
    view: str,
    snapshot: SnapshotPaths,
    manifest: Manifest,
    *,
    keep: int | None = None,
    now: float | None = None,
    attach: Callable[[int, tuple[Member, ...]], dict] | None = None,
) -> tuple[Version, bool]:
    """Adds the finalized run ``manifest`` of ``snapshot`` as the newest member of a new version of ``view``,
    keeping the newest ``keep`` members (None: all). Returns the version and whether it is new: a run the
    latest version lists already adds nothing (a rerun of the same day).

    ``attach(number, members)``, when given, makes what the version records as its ``transform_graph`` (the
    window graph over exactly those members) before the version is created; a lost race calls it again for the
    next number and its members.

    A run of a folder the latest version lists under an older run replaces that one (the snapshot was
    rewritten); the older stays in the versions that listed it.
    """
    if keep is not None and keep < 1:
        raise UsageError(f"keep={keep}; keep at least the newest snapshot (keep=1), or give none to keep all")
    member = Member(snapshot.directory, snapshot.snapshot_id, manifest.run_id, manifest.num_rows)
    storage.make_dirs(paths.join(view, VERSIONS))
    storage.make_dirs(paths.join(view, MANIFESTS))
    storage.create_exclusive(paths.join(view, MARKER), json.dumps({"format": VIEW_FORMAT}).encode())
    storage.create_exclusive(_manifest_path(view, member), metadata.to_json(manifest))
    storage.create_exclusive(hold_path(snapshot, manifest.run_id, view), json.dumps({"view": view}).encode())
    for _ in range(_ATTEMPTS):
        numbers = version_numbers(view)
        latest = read_version(view, numbers[-1]) if numbers else None
        listed = latest.members if latest else ()
        if any(existing.key == member.key for existing in listed):
            return latest, False
        members = [existing for existing in listed if existing.directory != member.directory] + [member]
        if keep is not None:
            members = members[-keep:]
        number = (numbers[-1] if numbers else 0) + 1
        graph = attach(number, tuple(members)) if attach is not None else None
        version = Version(view, number, tuple(members), time.time() if now is None else now, keep, graph)
        if storage.create_exclusive(_version_path(view, number), version.to_json()):
            return version, True
        # Another add took this number first (or our own create's reply was lost): read it and go on from it.
        _drop_unnamed_graph(view, number, graph)
    raise UsageError(f"could not commit a version of {view} after {_ATTEMPTS} tries: too many writers at once")


def _drop_unnamed_graph(view: str, number: int, graph: dict | None) -> None:
    """Deletes the graph ``attach`` made for a version number another add took, unless that version names it (our
    own create landed though its reply was lost): no version will ever name it, and the next try makes another."""
    if graph is None:
        return
    taken = read_version(view, number).transform_graph
    if taken is None or taken.get("directory") != graph["directory"]:
        storage.delete_tree(paths.join(view, *graph["directory"].split("/")))


def describe_add(version: Version, added: bool, directory: str, run_id: str, num_rows: int) -> str:
    """What ``add`` did with run ``run_id`` of the snapshot at ``directory``, in one line: what ``snapfeed view
    add`` and the job's ``--view`` print."""
    what = f"{directory} (run {run_id}, {num_rows} rows)"
    if added:
        return (
            f"added {what} to {version.view} as version {version.number}: {len(version.members)} snapshots, "
            f"{version.num_rows} rows"
        )
    return f"{version.view}@{version.number} already lists {what}: nothing added"


def listed_runs(view: str) -> dict[tuple[str, str], list[int]]:
    """Every (snapshot id, run id) any version of ``view`` lists, with the versions listing it."""
    listed: dict[tuple[str, str], list[int]] = {}
    for number in version_numbers(view):
        for member in read_version(view, number).members:
            listed.setdefault(member.key, []).append(number)
    return listed


def holding_views(run_dir: str) -> list[str]:
    """The views that left a hold in ``run_dir`` (``add``)."""
    views = []
    for entry in storage.list_dir(run_dir):
        if not entry.is_dir and is_hold_name(entry.name):
            try:
                views.append(str(json.loads(storage.read_bytes(entry.path))["view"]))
            except (ValueError, KeyError, FileNotFoundError):
                continue  # a damaged hold holds nothing: the view's own versions are what count
    return views


def find_views(root: str) -> list[str]:
    """The views directly under ``root`` (``snapfeed view list``)."""
    return sorted(entry.path for entry in storage.list_dir(root) if entry.is_dir and is_view(entry.path))


def difference(older: Version, newer: Version) -> tuple[list[Member], list[Member]]:
    """The members ``newer`` lists that ``older`` does not (added), and those it no longer lists (dropped)."""
    old_keys = {member.key for member in older.members}
    new_keys = {member.key for member in newer.members}
    added = [member for member in newer.members if member.key not in old_keys]
    dropped = [member for member in older.members if member.key not in new_keys]
    return added, dropped
