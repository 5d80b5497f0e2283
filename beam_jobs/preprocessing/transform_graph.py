"""A run's tf.Transform graph: published into the run directory, listed for the manifest, and summarized.

tf.Transform writes the transform function (a SavedModel and its assets, e.g.
vocabulary files) and the transformed features' metadata under its temp
directory. ``publish`` copies both into ``<run_id>/transform_fn/`` and
``<run_id>/transformed_metadata/`` through the store (local disk, ``gs://``,
``s3://``: TensorFlow's own file system cannot write ``s3://``), writes
``<run_id>/transform_summary.json`` (what the analyzers found), and returns
every file as a ``RunFile`` with its size and CRC32C. The finalize that
commits the shards lists them in the manifest, so a committed run has the
graph it was transformed with, and a run that fails or is interrupted is
deleted with whatever it had copied.

The summary is read from the SavedModel itself: tf.Transform bakes each
analyzer's result into the graph as a constant fed to the transform function,
and that function names its inputs after the ops that use them
(``scale_to_z_score_sub_y`` is the mean a z-score subtracts). Results of the
analyzers people look at are labelled (mean, variance, min, max, bucket
boundaries); any other constant is listed under its input's name.
Vocabularies are the asset files, most frequent entry first.
"""

from __future__ import annotations

import json
import re

import google_crc32c
import numpy as np

from schemas import paths, storage
from schemas.snapshot_pb2 import RunFile

#: Entries of a vocabulary the summary keeps (the file holds them all).
TOP_ENTRIES = 10
#: Analyzer results with more values than this are summarized by their count, first and last values.
LISTED_VALUES = 32
_CALLS = ("StatefulPartitionedCall", "PartitionedCall")
#: (pattern of the transform function's input name, label, how to read the value): tf.Transform 1.x's names.
_LABELS = (
    (re.compile(r"scale_to_z_score.*_sub_y$"), "mean", lambda v: v),
    (re.compile(r"scale_to_z_score.*_sqrt_x$"), "variance", lambda v: v),
    (re.compile(r"min_and_max_sub_1_y$"), "min", lambda v: -v),  # min_and_max keeps -min, to reduce with max
    (re.compile(r"scale_to_0_1.*_less_y$"), "max", lambda v: v),
    (re.compile(r"apply_buckets"), "bucket boundaries", lambda v: v.ravel()),
)


def _copy_tree(source: str, destination: str, gfile) -> list[tuple[str, bytes]]:
    """Every file under ``source`` (tf.io.gfile: what tf.Transform wrote) as (path under ``destination``, bytes)."""
    copied = []
    for directory, _, names in gfile.walk(source):
        relative = directory[len(source) :].strip("/")
        for name in sorted(names):
            with gfile.GFile(f"{directory}/{name}", "rb") as stream:
                target = paths.join(destination, *(part for part in relative.split("/") if part), name)
                copied.append((target, stream.read()))
    return copied


def publish(
    _,
    run_dir: str,
    snapshot: paths.SnapshotPaths,
    raw_schema_text: str,
    transform_fn_dir: str,
    metadata_dir: str,
) -> list[RunFile]:
    """Copies the graph tf.Transform wrote into ``run_dir`` with the raw features' schema (``raw_schema_text``, a
    TFMD text proto: ``TFTransformOutput.raw_feature_spec()`` reads it), writes the summary; returns the files,
    for the manifest. A Beam step (runs once per pipeline; a retry writes the same bytes again).
    """
    import tensorflow as tf

    transform_dir, metadata_name, raw_metadata_name = paths.TRANSFORM_DIRS
    files = _copy_tree(transform_fn_dir, paths.join(run_dir, transform_dir), tf.io.gfile)
    files += _copy_tree(metadata_dir, paths.join(run_dir, metadata_name), tf.io.gfile)
    files.append((paths.join(run_dir, raw_metadata_name, "schema.pbtxt"), raw_schema_text.encode()))
    summary = summarize({path[len(run_dir) :].strip("/"): data for path, data in files})
    files.append((paths.join(run_dir, paths.TRANSFORM_SUMMARY), json.dumps(summary, indent=1, sort_keys=True).encode()))
    listed = []
    for path, data in files:
        storage.atomic_write(path, data)
        listed.append(RunFile(path=snapshot.relative(path), num_bytes=len(data), crc32c=google_crc32c.value(data)))
    return sorted(listed, key=lambda f: f.path)


def summarize(files: dict[str, bytes]) -> dict:
    """What the analyzers found: ``{"analyzers": [...], "vocabularies": [...]}``, from the graph's files by
    path relative to the run directory."""
    transform_dir = paths.TRANSFORM_DIRS[0]
    vocabularies = []
    for path, data in sorted(files.items()):
        if path.startswith(f"{transform_dir}/assets/"):
            entries = data.decode("utf-8", errors="replace").splitlines()
            vocabularies.append({"name": path.rsplit("/", 1)[-1], "size": len(entries), "top": entries[:TOP_ENTRIES]})
    saved_model = files.get(f"{transform_dir}/saved_model.pb")
    analyzers = _analyzer_results(saved_model) if saved_model is not None else []
    return {"analyzers": analyzers, "vocabularies": vocabularies}


def _analyzer_results(saved_model: bytes) -> list[dict]:
    """The constants the serving signature feeds the transform function, named by that function's inputs."""
    from tensorflow.core.protobuf import saved_model_pb2
    from tensorflow.python.framework import tensor_util

    model = saved_model_pb2.SavedModel()
    model.ParseFromString(saved_model)
    graph = model.meta_graphs[0].graph_def
    constants = {node.name: node for node in graph.node if node.op == "Const"}
    functions = {function.signature.name: function for function in graph.library.function}
    calls = [node for node in graph.node if node.op in _CALLS and "signature_wrapper" in node.attr["f"].func.name]
    if not calls:
        return []
    # Follow the call chain down to the function that uses the values, renaming each value after the input
    # it feeds at every level.
    bound = {}
    call, inputs = calls[0], list(calls[0].input)
    for _ in range(8):
        function = functions.get(call.attr["f"].func.name)
        if function is None:
            break
        names = [arg.name for arg in function.signature.input_arg]
        sources = [value.split(":")[0] for value in inputs]
        bound = {name: bound.get(source, source) for name, source in zip(names, sources, strict=False)}
        inner = [node for node in function.node_def if node.op in _CALLS]
        if len(inner) != 1:
            break
        call, inputs = inner[0], list(inner[0].input)
    results = []
    for name, source in bound.items():
        node = constants.get(source)
        if node is None:
            continue
        value = tensor_util.MakeNdarray(node.attr["value"].tensor)
        if value.dtype == object or not np.issubdtype(value.dtype, np.number):
            continue
        label, read = next(((lab, rd) for pattern, lab, rd in _LABELS if pattern.search(name)), (None, None))
        if label is None:
            if "vocab" in name:
                continue  # a vocabulary's size and lookup defaults: the vocabulary's own entry says more
            label, read = name, np.asarray
        results.append({"input": name, "label": label, "value": _listed(read(value))})
    return results


def _listed(value: np.ndarray) -> float | int | list | dict:
    value = np.asarray(value)
    if value.size == 1:
        return value.reshape(()).item()
    flat = value.ravel().tolist()
    if len(flat) <= LISTED_VALUES:
        return flat
    return {"count": len(flat), "first": flat[:5], "last": flat[-5:]}
