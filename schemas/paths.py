"""The one module that builds snapshot paths (docs/architecture.md §2.1).

Layout::

    <root>/<snapshot_id>/snapshot.metadata      pending marker
    <root>/<snapshot_id>/metadata.final         commit marker + manifest
    <root>/<snapshot_id>/<run_id>/shard-*.arrow shards, immutable once renamed
    <root>/<snapshot_id>/<run_id>/transform_fn/, transformed_metadata/, metadata/, transform_summary.json
                                                the run's tf.Transform graph, when it has one

Paths are plain strings so local paths and ``gs://``/``s3://`` URIs work the
same way; URIs are joined with ``/`` and local paths with ``os.path``.
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
import re

PENDING_MARKER = "snapshot.metadata"
FINAL_MARKER = "metadata.final"
TEMP_PREFIX = ".tmp-"
SHARD_SUFFIX = ".arrow"
#: A run's tf.Transform graph: what ``tft.TFTransformOutput(<run_dir>)`` opens (the SavedModel with its assets,
#: the transformed features' schema, the raw features' schema), and what its analyzers found, for ``snapfeed show``.
TRANSFORM_DIRS = ("transform_fn", "transformed_metadata", "metadata")
TRANSFORM_SUMMARY = "transform_summary.json"
#: A run's tf.Transform analyzer cache (``--tft_preprocessing_fn`` with ``--view``): a view's window graph reads it.
TFT_CACHE = "tft_cache"

_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")
_SNAPSHOT_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_RUN_ID = re.compile(r"^run-[0-9a-f]{12,32}$")
_SHARD = re.compile(r"^shard-[A-Za-z0-9_]+-[0-9]{5,}" + re.escape(SHARD_SUFFIX) + "$")
_TEMP = re.compile(r"^" + re.escape(TEMP_PREFIX) + r"[A-Za-z0-9_]+-(?P<target>.+)$")


def scheme(path: str) -> str:
    """``"gs"`` for ``gs://b/x``, ``""`` for a local path."""
    match = _SCHEME.match(path)
    return match.group(0)[:-3].lower() if match else ""


def join(base: str, *parts: str) -> str:
    if scheme(base):
        return posixpath.join(base, *parts)
    return os.path.join(base, *parts)


def absolute(path: str) -> str:
    """A local path made absolute against this process's working directory (``~`` expanded); URIs as given.

    The driver resolves every path before it is fingerprinted or shipped to
    workers: a worker's working directory is not the driver's, and
    ``data/x``, ``./data/x`` and ``/abs/data/x`` must name one snapshot.
    Glob characters pass through untouched.
    """
    return path if scheme(path) else os.path.abspath(os.path.expanduser(path))


def canonical(path: str) -> str:
    """The one spelling of ``path`` that access checks compare (``is_within``) and servers open.

    A local path (or ``file://``, which names one) is made absolute with ``~``
    expanded, then ``..`` and symlinks are resolved: a link inside a root that
    points outside it is outside. A URI keeps its bucket; its scheme is
    lower-cased, ``.``/``..`` segments and duplicate slashes are resolved and a
    trailing slash dropped (a query string, e.g. ``?region=``, is kept as is).
    Raises ``ValueError`` for a URI without a bucket or one whose ``..``
    climbs above its bucket: an object store has no parent of a bucket.
    """
    uri_scheme = scheme(path)
    if not uri_scheme or uri_scheme == "file":
        local = path[len("file://") :] if uri_scheme else path
        return os.path.realpath(os.path.abspath(os.path.expanduser(local)))
    rest, query = _split_query(path[len(uri_scheme) + 3 :])
    bucket, _, key = rest.partition("/")
    if bucket in ("", ".", ".."):
        raise ValueError(f"{path} names no bucket: give {uri_scheme}://BUCKET/path")
    if _climbs(key):
        raise ValueError(f"{path} climbs above its bucket {uri_scheme}://{bucket} with '..': give a path inside it")
    normalized = posixpath.normpath("/" + key).strip("/")
    return f"{uri_scheme}://{bucket}" + (f"/{normalized}" if normalized else "") + query


def _climbs(key: str) -> bool:
    """Whether the ``..`` segments of a bucket's key go above the bucket at any point."""
    depth = 0
    for segment in key.split("/"):
        if segment == "..":
            depth -= 1
            if depth < 0:
                return True
        elif segment not in ("", "."):
            depth += 1
    return False


def is_within(path: str, root: str) -> bool:
    """Whether ``path`` is ``root`` or inside it, both made ``canonical``: a folder, not a string prefix.

    ``/data/snapshots`` is not within ``/data/snap``; ``gs://bucket-2/x`` is not
    within ``gs://bucket``; ``s3://b/x`` is not within ``gs://b``; a local path is
    never within a URI root. With query strings, both must carry the same one.
    Raises ``ValueError`` as ``canonical`` does.
    """
    path, root = canonical(path), canonical(root)
    if scheme(root):
        (path, path_query), (root, root_query) = _split_query(path), _split_query(root)
        if path_query != root_query:
            return False
        separator = "/"
    else:
        separator = os.sep
    return path == root or path.startswith(root.rstrip(separator) + separator)


def _split_query(uri: str) -> tuple[str, str]:
    cut = min((i for i in (uri.find("?"), uri.find("#")) if i >= 0), default=len(uri))
    return uri[:cut], uri[cut:]


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if scheme(path) else os.path.basename(path.rstrip(os.sep))


def dirname(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) if scheme(path) else os.path.dirname(path.rstrip(os.sep))


def is_temp_name(name: str) -> bool:
    """Temp files are never listed, read or trusted."""
    return basename(name).startswith(TEMP_PREFIX)


def temp_name_for(path: str, token: str) -> str:
    """A temp sibling of ``path``: same directory, so the final rename is atomic."""
    return join(dirname(path), f"{TEMP_PREFIX}{token}-{basename(path)}")


def temp_target(name: str) -> str:
    """The name a temp file from ``temp_name_for`` is renamed to; "" for any other name."""
    match = _TEMP.match(basename(name))
    return match.group("target") if match else ""


def is_shard_name(name: str) -> bool:
    """Names ``shard_name`` builds; gc only deletes a run directory holding nothing else (and temps of them)."""
    return bool(_SHARD.match(basename(name)))


def is_transform_entry(name: str) -> bool:
    """A top-level entry of a run's tf.Transform graph (``TRANSFORM_DIRS``, ``TRANSFORM_SUMMARY``) or cache."""
    return basename(name) in (*TRANSFORM_DIRS, TRANSFORM_SUMMARY, TFT_CACHE)


def is_marker_name(name: str) -> bool:
    """``snapshot.metadata`` or ``metadata.final``: a folder holding one is snapfeed's."""
    return basename(name) in (PENDING_MARKER, FINAL_MARKER)


def is_valid_snapshot_id(snapshot_id: str) -> bool:
    return bool(_SNAPSHOT_ID.match(snapshot_id)) and snapshot_id not in (".", "..")


def is_run_id(name: str) -> bool:
    return bool(_RUN_ID.match(name))


@dataclasses.dataclass(frozen=True)
class SnapshotPaths:
    """Every path of one snapshot, derived from ``root`` and ``snapshot_id``."""

    root: str
    snapshot_id: str

    @property
    def directory(self) -> str:
        return join(self.root, self.snapshot_id)

    @property
    def pending_marker(self) -> str:
        return join(self.directory, PENDING_MARKER)

    @property
    def final_marker(self) -> str:
        return join(self.directory, FINAL_MARKER)

    def run_dir(self, run_id: str) -> str:
        return join(self.directory, run_id)

    def shard(self, run_id: str, shard_name: str) -> str:
        return join(self.run_dir(run_id), shard_name)

    def relative(self, path: str) -> str:
        """``<run_id>/<shard>`` as stored in the manifest."""
        prefix = self.directory.rstrip("/" if scheme(self.directory) else os.sep)
        if not path.startswith(prefix):
            raise ValueError(f"{path} is not inside snapshot directory {self.directory}")
        return path[len(prefix) :].lstrip("/" + os.sep).replace(os.sep, "/")

    def absolute(self, relative_path: str) -> str:
        return join(self.directory, *relative_path.split("/"))


def shard_name(writer_token: str, index: int) -> str:
    """Shard names are unique per writer bundle so retried bundles never collide."""
    return f"shard-{writer_token}-{index:05d}{SHARD_SUFFIX}"
