"""Running the user's preprocessing function on each RecordBatch.

The function is named by ``module:function`` and loaded on each worker in
``setup`` (never pickled). It receives a ``pyarrow.RecordBatch`` (plus the
params dict when its signature takes a second argument) and returns a
RecordBatch (or Table) or a dict of NumPy arrays ``[batch, ...]``. A
``tf.function`` receives a dict of tensors instead and may return tensors. An
empty result (a filter that kept no row of the batch) adds no rows.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Mapping
from typing import Any

import apache_beam as beam
import pyarrow as pa

from schemas import columns
from schemas.errors import PreprocessingError, UsageError


def load_function(spec: str, flag: str = "--preprocessing_fn") -> Callable:
    """The function ``module:function`` names; ``flag`` is the flag that gave it, for the error line."""
    module_name, sep, attr_path = spec.partition(":")
    if not sep or not module_name or not attr_path:
        raise UsageError(f"{flag}={spec!r}: expected module:function, e.g. my_pkg.prep:preprocess")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise UsageError(
            f"{flag}={spec}: cannot import module {module_name!r} ({exc}). "
            f'Make it importable here (PYTHONPATH); remote workers need it packaged (docs/engines-and-stores.md "Your function as a package").'
        ) from exc
    for part in attr_path.split("."):
        if not hasattr(target, part):
            raise UsageError(f"{flag}={spec}: module {module_name!r} has no attribute {attr_path!r}")
        target = getattr(target, part)
    if not callable(target):
        raise UsageError(f"{flag}={spec}: {attr_path!r} is not callable")
    return target


def is_tf_function(fn: Callable) -> bool:
    return hasattr(fn, "get_concrete_function") and hasattr(fn, "python_function")


def takes_params(fn: Callable) -> bool:
    target = getattr(fn, "python_function", fn)
    try:
        parameters = inspect.signature(target).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in positional)


def check_params(spec: str, fn: Callable, params: dict[str, Any]) -> None:
    """Params for a function that cannot take them are a mistake, not something to fingerprint and drop."""
    if params and not takes_params(fn):
        raise UsageError(
            f"--preprocessing_params given, but {spec} takes only the batch: add a second parameter "
            f"(def fn(batch, params)) or drop --preprocessing_params"
        )


def _to_tensors(batch: pa.RecordBatch) -> dict[str, Any]:
    import tensorflow as tf

    tensors = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            tensors[name] = tf.RaggedTensor.from_row_splits(
                columns.column_to_numpy(column.flatten()), column.offsets.to_numpy().astype("int64")
            )
        else:
            tensors[name] = tf.constant(columns.column_to_numpy(column))
    return tensors


def table_to_batch(table: pa.Table) -> pa.RecordBatch:
    """The whole table as one batch, even when it has no rows.

    A filter that drops every row of a batch is a legitimate result, but Arrow
    gives such a table no batches at all (``to_batches()`` is ``[]``), so the
    empty batch is built from the schema: it keeps the schema check across
    batches meaningful and adds no rows downstream.
    """
    batches = table.combine_chunks().to_batches()
    return batches[0] if batches else pa.RecordBatch.from_pylist([], schema=table.schema)


def to_record_batch(output: object, spec: str) -> pa.RecordBatch:
    """Normalizes what the function returned; anything else is a clear error."""
    if isinstance(output, pa.RecordBatch):
        return output
    if isinstance(output, pa.Table):
        return table_to_batch(output)
    if isinstance(output, Mapping):
        arrays = {str(k): (v.numpy() if hasattr(v, "numpy") else v) for k, v in output.items()}
        try:
            return columns.record_batch_from_arrays(arrays)
        except (TypeError, ValueError, pa.ArrowException) as exc:
            raise PreprocessingError(f"preprocessing_fn {spec} returned a dict that is not a batch: {exc}") from exc
    raise PreprocessingError(
        f"preprocessing_fn {spec} returned {type(output).__name__}; return a pyarrow.RecordBatch "
        f"or a dict of column name -> NumPy array with one row per input row ([batch, ...])."
    )


class PreprocessFn(beam.DoFn):
    """Applies the function batch by batch and checks every output has one schema."""

    def __init__(self, spec: str, params: dict[str, Any]) -> None:
        self._spec = spec
        self._params = dict(params)
        self._fn: Callable | None = None
        self._schema: pa.Schema | None = None

    def setup(self) -> None:
        self._fn = load_function(self._spec)
        self._tf = is_tf_function(self._fn)
        self._with_params = takes_params(self._fn)

    def process(self, batch: pa.RecordBatch):
        argument = _to_tensors(batch) if self._tf else batch
        try:
            output = self._fn(argument, self._params) if self._with_params else self._fn(argument)
        except (Exception, SystemExit) as exc:  # the user's code: re-raised with its name, never swallowed
            raise PreprocessingError(
                f"preprocessing_fn {self._spec} raised {type(exc).__name__}: {exc} "
                f"(input batch of {batch.num_rows} rows, columns {batch.schema.names}). "
                f"Fix the function and rerun; nothing was committed."
            ) from exc
        result = to_record_batch(output, self._spec)
        self._schema = columns.check_same_schema(self._schema, result.schema, f"preprocessing_fn {self._spec}")
        yield result
