"""The tf.Transform graph a snapshot's rows were transformed with: for serving, and for any framework.

A run materialized with ``--tft_preprocessing_fn`` holds its graph beside its
shards (``transform_fn/``, ``transformed_metadata/``, ``metadata/``), listed
with CRC32C in the manifest. ``transform_output`` hands it back as the
``tft.TFTransformOutput`` TFX users know: its ``transform_features_layer()``,
created under a ``tf.distribute`` strategy's ``scope()``, turns raw features
into exactly the rows the snapshot holds, so training and serving never skew.

Every file is checked against the manifest (size and CRC32C) before TensorFlow
opens it, so a damaged or replaced graph is named, never loaded. A graph on
``gs://`` or ``s3://`` is copied, once, into a local directory keyed by the
snapshot and its run (TensorFlow reads no ``s3://``, and loading a SavedModel
reads its files many times); a snapshot rewritten with ``--mode=write`` is
another run, so another copy, never a stale one.

``transform_features`` applies the graph to a dict of NumPy arrays and
returns NumPy arrays, for JAX and PyTorch programs that do not otherwise use
TensorFlow; ``vocabulary`` reads a vocabulary the analyzers computed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import uuid

import numpy as np

from reader.core.snapshot import Snapshot, as_snapshot, shard_problem
from schemas import paths, storage, views
from schemas.errors import CorruptSnapshotError, UsageError
from schemas.snapshot_pb2 import RunFile
from schemas.tft_import import import_tft

#: Where graphs of snapshots on object stores are copied (``SNAPFEED_CACHE_DIR`` overrides the parent).
CACHE_ENV = "SNAPFEED_CACHE_DIR"


def _checked(snapshot: Snapshot) -> None:
    problems = [
        problem
        for graph_file in snapshot.metadata.transform_files
        if (problem := shard_problem(snapshot.paths.absolute(graph_file.path), graph_file))
    ]
    if problems:
        raise CorruptSnapshotError(
            f"the tf.Transform graph of {snapshot.path} is damaged: {'; '.join(problems)}; run `snapfeed verify "
            f"{snapshot.path}` and materialize the snapshot again with --mode=write"
        )


def _local_copy(snapshot: Snapshot, cache_dir: str | None) -> str:
    """The run's graph files under a local directory (copied once per snapshot run), checked as they are copied."""
    parent = cache_dir or os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "snapfeed-cache")
    target = os.path.join(parent, "transform_graphs", f"{snapshot.snapshot_id}-{snapshot.metadata.run_id}")
    if os.path.isdir(target):
        return target
    staging = f"{target}.tmp-{uuid.uuid4().hex[:8]}"
    try:
        for graph_file in snapshot.metadata.transform_files:
            data = storage.read_bytes(snapshot.paths.absolute(graph_file.path))
            local = os.path.join(staging, *graph_file.path.split("/")[1:])  # the path below the run directory
            os.makedirs(os.path.dirname(local), exist_ok=True)
            with open(local, "wb") as out:
                out.write(data)
            if problem := shard_problem(local, graph_file):
                raise CorruptSnapshotError(
                    f"the tf.Transform graph of {snapshot.path} is damaged: {problem}; run `snapfeed verify "
                    f"{snapshot.path}` and materialize the snapshot again with --mode=write"
                )
        os.makedirs(parent, exist_ok=True)
        try:
            os.rename(staging, target)
        except OSError:
            if not os.path.isdir(target):  # another process copied it first: theirs is as good
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _view_graph(source: str, cache_dir: str | None):
    """The window graph of view version ``VIEW@K`` (or the latest), checked against the version's list of files."""
    view, number = views.split_pinned(source)
    version = views.read_version(view, number)
    graph = version.transform_graph
    if not graph:
        raise UsageError(
            f"{view}@{version.number} has no tf.Transform graph: its days were not materialized with "
            f"--tft_preprocessing_fn and --view={view} (a version made by `snapfeed view add` has none)"
        )
    tft = import_tft(f"reading the tf.Transform graph of {view}@{version.number}")
    folder = paths.join(view, *graph["directory"].split("/"))
    local = storage.local_path(folder)
    if local is None:
        parent = cache_dir or os.environ.get(CACHE_ENV) or os.path.join(tempfile.gettempdir(), "snapfeed-cache")
        digest = hashlib.sha256(paths.canonical(view).encode()).hexdigest()[:16]
        local = os.path.join(parent, "transform_graphs", f"view-{digest}-{graph['directory'].replace('/', '-')}")
    problems = []
    for listed in graph["files"]:
        target = os.path.join(local, *listed["path"].split("/"))
        if not os.path.exists(target) and storage.local_path(folder) is None:
            data = storage.read_bytes(paths.join(folder, *listed["path"].split("/")))
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with open(f"{target}.tmp-{uuid.uuid4().hex[:8]}", "wb") as out:
                out.write(data)
            os.replace(out.name, target)
        expected = RunFile(path=listed["path"], num_bytes=int(listed["num_bytes"]), crc32c=int(listed["crc32c"]))
        if problem := shard_problem(target, expected):
            problems.append(problem)
    if problems:
        raise CorruptSnapshotError(
            f"the tf.Transform window graph of {view}@{version.number} is damaged: {'; '.join(problems)}; "
            f"materialize the newest day again with --mode=write to make a new version"
        )
    return tft.TFTransformOutput(local)


def transform_output(source, *, cache_dir: str | None = None):
    """The ``tft.TFTransformOutput`` of the snapshot's run: ``transform_features_layer()``,
    ``transformed_feature_spec()``, ``raw_feature_spec()``, ``vocabulary_by_name()``.

    A view (``"VIEW"``, ``"VIEW@K"``) whose days were materialized with ``--tft_preprocessing_fn`` and ``--view``
    gives its version's window graph: the analyzers over all its days, to apply to the days' raw rows.

    Args:
        source: a snapshot path as for ``reader.open_snapshot``, a view's, or an opened ``Snapshot``.
        cache_dir: where a graph on an object store is copied (default: the temp dir).
    """
    if isinstance(source, (str, os.PathLike)) and views.is_view(views.split_pinned(str(source))[0]):
        return _view_graph(str(source), cache_dir)
    snapshot = as_snapshot(source)
    if not snapshot.has_transform_graph:
        raise UsageError(
            f"{snapshot.path} (run {snapshot.metadata.run_id}) has no tf.Transform graph: it was materialized "
            f"without --tft_preprocessing_fn"
        )
    tft = import_tft(f"reading the tf.Transform graph of {snapshot.path}")
    local = storage.local_path(snapshot.run_dir)
    if local is not None:
        _checked(snapshot)
        return tft.TFTransformOutput(local)
    return tft.TFTransformOutput(_local_copy(snapshot, cache_dir))


def transform_features(graph, features: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The graph applied to raw features given as NumPy arrays, as NumPy arrays: what the snapshot holds for those rows.

    Args:
        graph: a ``TFTransformOutput``, or what ``transform_output`` takes.
        features: ``[batch, *shape]`` per raw feature, cast to the raw feature's dtype.
    """
    import tensorflow as tf

    output = graph if hasattr(graph, "transform_raw_features") else transform_output(graph)
    raw_spec = output.raw_feature_spec()
    tensors = {
        name: tf.constant(values, dtype=raw_spec[name].dtype if name in raw_spec else None)
        for name, values in features.items()
    }
    transformed = output.transform_raw_features(tensors, drop_unused_features=True)
    return {name: np.asarray(value) for name, value in transformed.items()}


def vocabulary(graph, name: str) -> list[str]:
    """A vocabulary the analyzers computed, most frequent entry first.

    Args:
        graph: a ``TFTransformOutput``, or what ``transform_output`` takes.
        name: the ``vocab_filename`` the preprocessing function gave the analyzer.
    """
    output = graph if hasattr(graph, "vocabulary_by_name") else transform_output(graph)
    return [entry.decode("utf-8", errors="replace") for entry in output.vocabulary_by_name(name)]
