"""``--allowed_roots``: the snapshot roots a dispatcher or worker serves, as local folders or URI prefixes.

Paths and roots are compared in ``schemas.paths.canonical`` form: local ones
with ``..`` and symlinks resolved, URIs (``gs://bucket/snapshots``,
``s3://bucket``) with ``..`` resolved inside their bucket. A root is a folder,
not a string prefix: ``/data/snap`` does not admit ``/data/snapshots``.
"""

from __future__ import annotations

from reader.service import protocol
from schemas import paths
from schemas.errors import UsageError


class OutsideRootsError(Exception):
    """A snapshot outside every allowed root; the message names it, the roots, and what to do."""


class AllowedRoots:
    """No roots: every snapshot is served. Otherwise only snapshots within one of them."""

    def __init__(self, roots: list[str], *, server: str) -> None:
        """``server`` ("dispatcher", "worker") names whose ``--allowed_roots`` the messages mean."""
        self._flag = f"the {server}'s --allowed_roots"
        try:
            self.roots = [paths.canonical(root) for root in roots]
        except ValueError as exc:
            raise UsageError(f"{server} --allowed_roots: {exc}") from None

    def resolve(self, snapshot: str) -> str:
        """The canonical path to open for ``snapshot`` (for a union sent, each member's: ``protocol.members``).

        Raises ``ValueError`` for a malformed path (a URI climbing above its
        bucket) and ``OutsideRootsError`` for one outside every root.
        """
        return protocol.joined(self._resolve_one(member) for member in protocol.members(snapshot))

    def _resolve_one(self, snapshot: str) -> str:
        resolved = paths.canonical(snapshot)
        if self.roots and not any(paths.is_within(resolved, root) for root in self.roots):
            shown = snapshot if resolved == snapshot else f"{snapshot} (resolved: {resolved})"
            raise OutsideRootsError(
                f"{shown} is outside {self._flag} ({', '.join(self.roots)}): read a snapshot under one of "
                f"them, or add its root to {self._flag}"
            )
        return resolved
