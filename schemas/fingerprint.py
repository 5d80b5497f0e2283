"""The snapshot fingerprint: sha256 of the canonical JSON of its components.

Pure Python (protobuf + hashlib), no Beam, no Python ``hash()``, no pickles,
so it is equal across processes, machines and PYTHONHASHSEED values, and any
tool can recompute it. The components are stored in the metadata so
``snapfeed explain`` can say which one changed.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import sys
from collections.abc import Callable, Iterable
from typing import Any

from schemas.errors import UsageError
from schemas.metadata import FINGERPRINT_FORMAT_VERSION, canonical_json
from schemas.snapshot_pb2 import FingerprintComponents, InputFile

FINGERPRINT_INPUTS = ("stat", "content", "pattern")


def fingerprint(components: FingerprintComponents) -> str:
    return hashlib.sha256(canonical_json(components)).hexdigest()


def canonical_params_json(params: dict[str, Any] | None) -> str:
    if not params:
        return ""
    try:
        return json.dumps(params, sort_keys=True, separators=(",", ":"))
    except TypeError as exc:
        raise UsageError(f"--preprocessing_params must be JSON-serializable: {exc}") from exc


def _unwrap(fn: Callable) -> Callable:
    """The Python function behind a tf.function or functools.wraps chain."""
    fn = getattr(fn, "python_function", fn)
    return inspect.unwrap(fn)


def function_identity(fn: Callable | None) -> tuple[str, str]:
    """``("module:qualname", sha256 of the module source)``; ``("", "")`` for identity.

    Hashing the whole module (not just the function) also catches edits to the
    helpers and constants the function uses.
    """
    if fn is None:
        return "", ""
    target = _unwrap(fn)
    module_name = getattr(target, "__module__", None) or "__main__"
    qualname = getattr(target, "__qualname__", type(target).__qualname__)
    module = sys.modules.get(module_name)
    try:
        source = inspect.getsource(module) if module is not None else inspect.getsource(target)
    except (OSError, TypeError):
        try:
            source = inspect.getsource(target)
        except (OSError, TypeError) as exc:
            raise UsageError(
                f"cannot read the source of preprocessing function {module_name}:{qualname} ({exc}); "
                f"define it in an importable module, or pass --snapshot_name to name the snapshot yourself."
            ) from exc
    return f"{module_name}:{qualname}", hashlib.sha256(source.encode("utf-8")).hexdigest()


def stat_identity(mtime_seconds: float) -> str:
    return f"mtime_ns:{round(mtime_seconds * 1e9)}"


def content_identity(chunks: Iterable[bytes]) -> str:
    digest = hashlib.sha256()
    for chunk in chunks:
        digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"


def build_components(
    *,
    input_format: str,
    input_patterns: list[str],
    fingerprint_inputs: str,
    input_files: list[InputFile],
    schema_text: str = "",
    csv_column_names: list[str] | None = None,
    preprocessing_fn: Callable | None = None,
    preprocessing_params: dict[str, Any] | None = None,
    transform_library: str = "",
) -> FingerprintComponents:
    """The components of a job's fingerprint. ``transform_library`` (``"tensorflow-transform==X"``) marks a
    tf.Transform ``preprocessing_fn``: its analyzers' results depend on that version, not only on the source."""
    if fingerprint_inputs not in FINGERPRINT_INPUTS:
        raise UsageError(f"--fingerprint_inputs={fingerprint_inputs}; choose one of {', '.join(FINGERPRINT_INPUTS)}")
    name, source_sha = function_identity(preprocessing_fn)
    files = [] if fingerprint_inputs == "pattern" else sorted(input_files, key=lambda f: f.path)
    return FingerprintComponents(
        format_version=FINGERPRINT_FORMAT_VERSION,
        input_format=input_format,
        input_patterns=sorted(input_patterns),
        fingerprint_inputs=fingerprint_inputs,
        input_files=files,
        schema_sha256=hashlib.sha256(schema_text.encode("utf-8")).hexdigest() if schema_text else "",
        csv_column_names=list(csv_column_names or []),
        function_name=name,
        function_source_sha256=source_sha,
        function_params_json=canonical_params_json(preprocessing_params),
        transform_library=transform_library,
    )
