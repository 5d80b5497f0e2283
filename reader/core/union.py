"""Several snapshots read as one: a union lists its members' shards one after another.

Shard ``i`` of a union is shard ``i - offset`` of the member that holds it
(``locate``), so every plan the reader makes over one snapshot's block row
counts (autoshard, the epoch order, elastic resume, the service's splits) is
made over the union's the same way, unchanged: every row of every member once
per epoch, shuffled across members because the epoch order permutes all
blocks of the union together, equal steps per pipeline. The block reader asks
``locate`` for the member's manifest, path, cache entry and layout of a shard.

Members must agree on the columns read: the same name with the same dtype and
shape in every member (``readable_columns``); a union whose members differ is
read with ``columns=`` naming shared ones. A union opened from a view
(``schemas.views``) remembers the view and version, so a state saved on it
names them (``identity``) and is refused by any other set of snapshots.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
from collections.abc import Sequence

import pyarrow as pa

from reader.core.snapshot import Snapshot, TensorSpec, folder_paths, open_snapshot
from schemas import views
from schemas.errors import SnapshotNotFoundError, UsageError
from schemas.snapshot_pb2 import ShardInfo

#: Members named in a message before "and N more".
_SHOWN = 3


@dataclasses.dataclass(frozen=True)
class ViewVersion:
    """The view version a union was resolved from: ``path`` and ``version`` (``schemas.views``)."""

    path: str
    version: int

    def __str__(self) -> str:
        return f"{self.path}@{self.version}"


def _spec_text(spec: TensorSpec) -> str:
    return f"{spec.dtype}{list(spec.shape[1:])}"


@dataclasses.dataclass(frozen=True)
class SnapshotUnion:
    """Snapshots read as one dataset: what the reader reads of one ``Snapshot``, over all of them."""

    members: tuple[Snapshot, ...]
    view: ViewVersion | None = None

    def __post_init__(self) -> None:
        if not self.members:
            where = f"view {self.view} lists no snapshot" if self.view else "an empty list of snapshots"
            raise UsageError(f"{where}: give at least one snapshot to read")
        seen: dict[tuple[str, str], int] = {}
        for index, member in enumerate(self.members):
            key = (member.path, member.metadata.run_id)
            if key in seen:
                raise UsageError(
                    f"snapshot {member.path} (run {key[1]}) is listed twice (at {seen[key]} and {index}): a union "
                    f"reads every row of each snapshot once per epoch; list it once"
                )
            seen[key] = index

    @functools.cached_property
    def _first_shards(self) -> list[int]:
        """The union's index of each member's first shard."""
        return list(itertools.accumulate((member.num_shards for member in self.members), initial=0))[:-1]

    def locate(self, shard: int) -> tuple[Snapshot, int]:
        """The member holding the union's shard ``shard``, and the shard's index in that member."""
        member = bisect.bisect_right(self._first_shards, shard) - 1
        return self.members[member], shard - self._first_shards[member]

    @property
    def path(self) -> str:
        """The members' folders, for messages (the view version, when read from one)."""
        if self.view is not None:
            return f"view {self.view}"
        shown = ", ".join(member.path for member in self.members[:_SHOWN])
        more = f" and {len(self.members) - _SHOWN} more" if len(self.members) > _SHOWN else ""
        return f"the union of {shown}{more}"

    @property
    def snapshot_id(self) -> str:
        """A label for metrics: the view version, else the members' ids."""
        if self.view is not None:
            return str(self.view)
        return "+".join(member.snapshot_id[:12] for member in self.members)

    @property
    def num_rows(self) -> int:
        return sum(member.num_rows for member in self.members)

    @property
    def num_bytes(self) -> int:
        return sum(member.num_bytes for member in self.members)

    @property
    def num_shards(self) -> int:
        return sum(member.num_shards for member in self.members)

    @property
    def block_rows(self) -> list[list[int]]:
        return [rows for member in self.members for rows in member.block_rows]

    def shard_path(self, index: int) -> str:
        member, shard = self.locate(index)
        return member.shard_path(shard)

    def shard_info(self, index: int) -> ShardInfo:
        member, shard = self.locate(index)
        return member.shard_info(shard)

    def shard_codec(self, index: int) -> str:
        member, shard = self.locate(index)
        return member.shard_codec(shard)

    @functools.cached_property
    def element_spec(self) -> dict[str, TensorSpec]:
        """The columns every member has with the same dtype and shape (in the first member's order)."""
        first, *others = self.members
        return {
            name: spec
            for name, spec in first.element_spec.items()
            if all(other.element_spec.get(name) == spec for other in others)
        }

    @property
    def column_names(self) -> list[str]:
        return list(self.element_spec)

    @property
    def schema(self) -> pa.Schema:
        """The shared columns' fields, as the first member stores them."""
        schema = self.members[0].schema
        return pa.schema([schema.field(name) for name in self.element_spec])

    @property
    def identity(self) -> dict:
        """What a saved state records of the rows it read: every member's snapshot id and run, and the view
        version it was resolved from."""
        return {
            "union": [[member.snapshot_id, member.metadata.run_id] for member in self.members],
            "view": None if self.view is None else [self.view.path, self.view.version],
        }

    def readable_columns(self, wanted: Sequence[str] | None) -> list[str]:
        """``wanted`` (None: every column) when every member has each with the same dtype and shape; else one
        line naming the members and columns that differ."""
        names = list(wanted) if wanted is not None else _all_names(self.members)
        differ = [_difference(name, self.members) for name in names if name not in self.element_spec]
        if differ:
            shared = ", ".join(repr(name) for name in self.element_spec) or "none"
            advice = f"pass columns= with shared ones ({shared})" if self.element_spec else "they share no column"
            raise UsageError(f"the snapshots of {self.path} differ in the columns read: {'; '.join(differ)}; {advice}")
        return names


#: What the reader reads: one snapshot, or several as one.
Readable = Snapshot | SnapshotUnion


def _all_names(members: Sequence[Snapshot]) -> list[str]:
    """Every column of any member, the first member's first."""
    return list(dict.fromkeys(name for member in members for name in member.element_spec))


def _difference(name: str, members: Sequence[Snapshot]) -> str:
    """How the members differ in column ``name``: which lack it, or the specs each has."""
    lacking = [member.path for member in members if name not in member.element_spec]
    if lacking:
        return f"{name!r} is missing from {', '.join(lacking)}"
    specs = {}
    for member in members:
        specs.setdefault(_spec_text(member.element_spec[name]), []).append(member.path)
    return f"{name!r} is " + " but ".join(f"{spec} in {', '.join(paths)}" for spec, paths in specs.items())


def refusal(saved: object, reading: Snapshot | SnapshotUnion) -> str:
    """Why a state that recorded ``saved`` (an ``identity``) cannot restore into a dataset reading ``reading``;
    '' when it records the same rows."""
    current = reading.identity
    if saved == current:
        return ""
    if isinstance(saved, list) and isinstance(current, list):  # one snapshot each
        (saved_id, saved_run), (now_id, now_run) = saved, current
        if saved_id != now_id:
            return (
                f"this reader state was saved reading another snapshot ({saved_id}); this dataset reads "
                f"{now_id} ({reading.path}): restore it into a dataset over the snapshot it was saved from"
            )
        return (
            f"this reader state was saved reading run {saved_run} of {reading.path}, which has been "
            f"rewritten since (now run {now_run}): its positions mean other rows; start a fresh "
            f"iterator (no set_state) to read the new run"
        )
    return f"this reader state was saved on {_described(saved)}; this dataset reads {_described(current)}: " + (
        _advice(saved)
    )


def _described(identity: object) -> str:
    if isinstance(identity, dict) and identity.get("view"):
        path, version = identity["view"]
        return f"view {path}@{version} ({len(identity['union'])} snapshots)"
    if isinstance(identity, dict):
        ids = [snapshot_id[:12] for snapshot_id, _ in identity.get("union", [])]
        shown = ", ".join(ids[:_SHOWN]) + (f" and {len(ids) - _SHOWN} more" if len(ids) > _SHOWN else "")
        return f"a union of {len(ids)} snapshots ({shown})"
    if isinstance(identity, list) and len(identity) == 2:
        return f"snapshot {identity[0][:12]} (run {identity[1]})"
    return f"{identity!r:.100}"


def _advice(saved: object) -> str:
    if isinstance(saved, dict) and saved.get("view"):
        path, version = saved["view"]
        return f"build the dataset on {path}@{version} to restore it, or start a fresh iterator (no set_state)"
    return "build the dataset over the same snapshots, in the same order, or start a fresh iterator (no set_state)"


def open_view(path: str) -> SnapshotUnion:
    """The union a view's version lists (``VIEW``: its latest, resolved now; ``VIEW@K``: version K), each member
    read at the run the version recorded, from the view's copy of its manifest."""
    view, number = views.split_pinned(path)
    version = views.read_version(view, number)
    members = tuple(
        Snapshot(folder_paths(member.directory), views.member_manifest(view, member)) for member in version.members
    )
    return SnapshotUnion(members, ViewVersion(view, version.number))


def as_readable(source: object) -> Snapshot | SnapshotUnion:
    """What an entry point reads: a snapshot folder or handle, a view (``VIEW`` or ``VIEW@K``), or a list or
    tuple of these read as their union (a view in a list adds its members)."""
    if isinstance(source, Snapshot | SnapshotUnion):
        return source
    if isinstance(source, list | tuple):
        members: list[Snapshot] = []
        for item in source:
            readable = as_readable(item)
            members += readable.members if isinstance(readable, SnapshotUnion) else [readable]
        return SnapshotUnion(tuple(members))
    path = str(source)
    if views.split_pinned(path)[1] is not None:
        return open_view(path)
    try:
        return open_snapshot(path)
    except SnapshotNotFoundError:
        if views.is_view(path):
            return open_view(path)
        raise
