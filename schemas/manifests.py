"""What a manifest says about its rows: the schema fields and the totals of its shards.

Built here once, for the job's commit (``beam_jobs.writing.commit``) and for the
reader's view of a pending run's committed shards (``reader.core.snapshot``), so
both store the schema the same way and read it back with ``arrow_schema``.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import Any

import pyarrow as pa

from schemas import columns
from schemas.snapshot_pb2 import Manifest, ShardInfo


def build(schema: pa.Schema, shards: Sequence[ShardInfo], **fields: Any) -> Manifest:
    """A manifest listing ``shards`` of rows of ``schema``; ``fields`` are its other fields (ids, times, writer).

    The schema is stored twice: the serialized Arrow schema (``arrow_schema``
    reads it back) and each column's dtype and shape (``columns.column_specs``),
    readable without Arrow. The row and byte totals are the shards' sums.
    """
    return Manifest(
        arrow_schema_b64=base64.b64encode(schema.serialize().to_pybytes()).decode(),
        columns=columns.column_specs(schema),
        num_rows=sum(shard.num_rows for shard in shards),
        num_bytes=sum(shard.num_bytes for shard in shards),
        shards=shards,
        **fields,
    )


def arrow_schema(manifest: Manifest) -> pa.Schema:
    """The Arrow schema ``build`` stored in ``manifest``."""
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(manifest.arrow_schema_b64)))
