"""The envelope of an iterator's saved state, shared by the local reader and the reader service.

A state is JSON: ``version``, ``kind`` (which iterator saved it), ``config``
(a digest of what must match for the state to mean the same rows) and the
iterator's own fields. Both iterators seal and check their states here, so a
state given to the wrong kind of iterator, or to one built with other
options, is refused with the same clear line wherever it is restored.

Version 1 states (saved before ``kind`` existed; a service state then said
``"service": true``) are still read: their fields and digests are unchanged,
except a distributed_epoch one's, whose digest names its splits' size since
splits grew from 16 to 32 blocks (a state of 16-block splits is refused).
Version 3 local states record the topology they were saved on in their fields
(``reader.core.elastic``) instead of their digest, so they restore on another
one; a local state of version 1 or 2 is checked against the digest it was
sealed with, topology included, and restores only into the same pipelines.
A state of a newer version than this snapfeed reads is refused as such.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from schemas.errors import UsageError

STATE_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)

LOCAL = "local"
SERVICE = "service"
_SAVED_BY = {LOCAL: "the local reader", SERVICE: "a reader-service consumer"}
_RESTORE_WITH = {LOCAL: "a dataset built without service=", SERVICE: "a dataset built with service="}


def rows_config(snapshot, options, columns: list[str]) -> dict:
    """What every kind of state must match to mean the same rows: the snapshot run, the global batch,
    the input context, ``drop_remainder`` and the columns (a ``Snapshot`` or ``SnapshotUnion`` and ``ReaderOptions``)."""
    context = options.context
    return {
        "snapshot": snapshot.identity,
        "batch": options.global_batch_size,
        "context": [context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync],
        "drop_remainder": options.drop_remainder,
        "columns": columns,
    }


def _kind_of(state: dict) -> str | None:
    """A version 1 state has no ``kind``: a service one is marked ``"service": true``."""
    if state.get("version") == 1:
        return SERVICE if state.get("service") else LOCAL
    return state.get("kind")


def _digest(must_match: dict) -> str:
    return hashlib.sha256(json.dumps(must_match, sort_keys=True).encode()).hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class StateEnvelope:
    """What an iterator's state must match: its ``kind`` and ``must_match`` (options that change the rows);
    ``before_v3``: what a state of version 1 or 2 had to match, where that differs (None: ``must_match``)."""

    kind: str
    must_match: dict
    before_v3: dict | None = None

    @property
    def digest(self) -> str:
        return _digest(self.must_match)

    @property
    def _label(self) -> str:
        return f"{self.kind} reader state" if self.kind == LOCAL else "reader-service state"

    def seal(self, fields: dict) -> dict:
        """The state to save: the envelope around the iterator's ``fields``."""
        return {"version": STATE_VERSION, "kind": self.kind, "config": self.digest, **fields}

    def check(self, state: object, fields: tuple[str, ...]) -> None:
        """Refuses, with one UsageError line, a ``state`` not of this kind, lacking ``fields`` or saved with
        other options."""
        self.check_header(state, fields)
        self.check_digest(state)

    def check_header(self, state: object, fields: tuple[str, ...]) -> int:
        """Refuses a ``state`` of a newer version, not of this kind or lacking ``fields``; its version."""
        label = self._label
        version = state.get("version") if isinstance(state, dict) else None
        if isinstance(version, int) and version > STATE_VERSION:
            raise UsageError(
                f"this {label} was saved by a newer snapfeed (state version {version}; this one reads versions up "
                f"to {STATE_VERSION}); upgrade snapfeed to restore it"
            )
        if version not in READABLE_VERSIONS:
            raise UsageError(
                f"not a snapfeed {label} (version {' or '.join(map(str, READABLE_VERSIONS))}): {state!r:.200}; "
                f"pass what get_state() returned"
            )
        kind = _kind_of(state)
        if kind != self.kind:
            raise UsageError(
                f"not a {label}: this state was saved by {_SAVED_BY.get(kind, f'an unknown kind {kind!r}')}; "
                f"restore it into {_RESTORE_WITH.get(kind, 'the iterator that saved it')}"
            )
        if missing := [name for name in ("config", *fields) if name not in state]:
            raise UsageError(f"this {label} lacks {missing}: {state!r:.200}; pass what get_state() returned")
        return version

    def check_digest(self, state: dict) -> None:
        """Refuses a state sealed with other options than this iterator's."""
        if state["version"] < 3 and self.before_v3 is not None:
            if state["config"] != _digest(self.before_v3):
                raise UsageError(
                    f"this {self._label} was saved by an older snapfeed (version {state['version']}): it restores "
                    f"only into the same pipelines/batch and options (all of: {', '.join(self.before_v3)}); build the "
                    f"dataset with the same arguments to restore it, or save a state with this snapfeed"
                )
        elif state["config"] != self.digest:
            raise UsageError(
                f"this {self._label} was saved by a reader over another snapshot run or with other options "
                f"(one of: {', '.join(self.must_match)}); build the dataset with the same arguments to restore it"
            )
