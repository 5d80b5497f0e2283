"""Where a shard's blocks and their columns lie, from the Arrow IPC file's own metadata.

pyarrow reads blocks by index but does not say where they are in the file, and
reads that know their byte ranges are what lets a reader coalesce them and keep
many in flight. Two small flatbuffer tables hold that (format/File.fbs and
format/Message.fbs of the Arrow specification):

- The footer, at the end of the file (``<flatbuffer><int32 length>ARROW1``):
  ``Footer{version, schema, dictionaries: [Block], recordBatches: [Block]}``
  with ``struct Block{offset: int64, metaDataLength: int32, bodyLength: int64}``.
  A block's message is ``metaDataLength`` bytes at ``offset`` (continuation
  marker, length, flatbuffer, padding), followed by its ``bodyLength`` body.
- A record batch message's header:
  ``RecordBatch{length, nodes: [FieldNode{length, null_count}],
  buffers: [Buffer{offset, length}], compression}``; buffer offsets are
  relative to the body. Nodes and buffers follow the schema depth first
  (``column_slots``), which is how an uncompressed fixed-width column is found
  as one run of bytes without decoding the block.

Only what the reader needs is parsed; anything unexpected is a ``ValueError``
the caller names the shard in.
"""

from __future__ import annotations

import dataclasses
import struct

import pyarrow as pa

MAGIC = b"ARROW1"
#: ``<int32 footer length>ARROW1`` closes every IPC file.
TRAILER_BYTES = 4 + len(MAGIC)
_BLOCK = struct.Struct("<qi4xq")  # struct Block: offset, metaDataLength, (padding), bodyLength
_PAIR = struct.Struct("<qq")  # struct FieldNode{length, null_count}, struct Buffer{offset, length}
_RECORD_BATCH_HEADER = 3  # MessageHeader union: NONE, Schema, DictionaryBatch, RecordBatch, ...


@dataclasses.dataclass(frozen=True)
class BlockRange:
    """One block's message in the shard file: ``metadata_bytes`` of header, then its body."""

    offset: int
    metadata_bytes: int
    body_bytes: int

    @property
    def length(self) -> int:
        return self.metadata_bytes + self.body_bytes

    @property
    def end(self) -> int:
        return self.offset + self.length

    @property
    def body_offset(self) -> int:
        return self.offset + self.metadata_bytes


@dataclasses.dataclass(frozen=True)
class ShardLayout:
    """The record batches (blocks) of one shard, in order, and how many dictionary batches precede them."""

    blocks: tuple[BlockRange, ...]
    dictionaries: int


@dataclasses.dataclass(frozen=True)
class BatchLayout:
    """A record batch message's header: rows, field nodes and body buffers (offsets within the body)."""

    rows: int
    nodes: tuple[tuple[int, int], ...]  # (length, null_count) per field node, depth first
    buffers: tuple[tuple[int, int], ...]  # (offset, length) per buffer, depth first
    compressed: bool
    body_bytes: int


class _Table:
    """A flatbuffer table: fields by index through its vtable (absent fields read as defaults)."""

    def __init__(self, data: memoryview, position: int) -> None:
        self._data = data
        self._position = position
        self._vtable = position - _unpack("<i", data, position)
        self._vtable_bytes = _unpack("<H", data, self._vtable)

    def _field(self, index: int) -> int:
        entry = 4 + 2 * index
        if entry + 2 > self._vtable_bytes:
            return 0
        offset = _unpack("<H", self._data, self._vtable + entry)
        return self._position + offset if offset else 0

    def scalar(self, index: int, fmt: str, default: int = 0) -> int:
        position = self._field(index)
        return _unpack(fmt, self._data, position) if position else default

    def table(self, index: int) -> _Table | None:
        position = self._field(index)
        return _Table(self._data, position + _unpack("<I", self._data, position)) if position else None

    def vector(self, index: int) -> tuple[int, int]:
        """(position of the first element, number of elements); (0, 0) when absent."""
        position = self._field(index)
        if not position:
            return 0, 0
        start = position + _unpack("<I", self._data, position)
        return start + 4, _unpack("<I", self._data, start)


def _unpack(fmt: str, data: memoryview, position: int) -> int:
    if position < 0:
        raise ValueError(f"flatbuffer offset {position} is negative")
    return struct.unpack_from(fmt, data, position)[0]


def _root(data: memoryview) -> _Table:
    return _Table(data, _unpack("<I", data, 0))


def footer_length(trailer: bytes) -> int:
    """The footer's length from the file's last ``TRAILER_BYTES`` bytes."""
    if len(trailer) != TRAILER_BYTES or trailer[4:] != MAGIC:
        raise ValueError("it does not end with the Arrow IPC file magic ARROW1 (truncated, or not an Arrow file)")
    length = struct.unpack_from("<i", trailer)[0]
    if length <= 0:
        raise ValueError(f"its footer length is {length}")
    return length


def parse_footer(footer: bytes | memoryview, footer_offset: int) -> ShardLayout:
    """The blocks listed by a footer flatbuffer that starts at ``footer_offset`` in the file."""
    try:
        root = _root(memoryview(footer))
        blocks = tuple(_blocks(footer, *root.vector(3)))
        dictionaries = root.vector(2)[1]
    except struct.error as exc:
        raise ValueError(f"its footer is garbled ({exc})") from None
    for block in blocks:
        if block.offset < 8 or block.metadata_bytes < 8 or block.body_bytes < 0 or block.end > footer_offset:
            raise ValueError(f"its footer lists a block at bytes {block.offset}..{block.end}, outside the file")
    return ShardLayout(blocks, dictionaries)


def _blocks(data, start: int, count: int):
    for index in range(count):
        offset, metadata_bytes, body_bytes = _BLOCK.unpack_from(data, start + index * _BLOCK.size)
        yield BlockRange(offset, metadata_bytes, body_bytes)


def parse_batch_header(metadata: bytes | memoryview) -> BatchLayout:
    """A block's header from its first ``metadata_bytes`` bytes (continuation marker and length first)."""
    data = memoryview(metadata)
    try:
        start = 8 if _unpack("<i", data, 0) == -1 else 4  # files before Arrow 0.15 lack the marker
        length = _unpack("<i", data, start - 4)
        if length <= 0 or start + length > len(data):
            raise ValueError(f"its header length {length} does not fit in {len(data)} bytes")
        message = _root(data[start : start + length])
        if message.scalar(1, "<B") != _RECORD_BATCH_HEADER:
            raise ValueError("it is not a record batch")
        batch = message.table(2)
        if batch is None:
            raise ValueError("its record batch header is missing")
        nodes_at, node_count = batch.vector(1)
        buffers_at, buffer_count = batch.vector(2)
        body = data[start : start + length]
        return BatchLayout(
            rows=batch.scalar(0, "<q"),
            nodes=tuple(_PAIR.unpack_from(body, nodes_at + i * _PAIR.size) for i in range(node_count)),
            buffers=tuple(_PAIR.unpack_from(body, buffers_at + i * _PAIR.size) for i in range(buffer_count)),
            compressed=batch.table(3) is not None,
            body_bytes=message.scalar(3, "<q"),
        )
    except struct.error as exc:
        raise ValueError(f"its header is garbled ({exc})") from None


@dataclasses.dataclass(frozen=True)
class ColumnSlots:
    """The field nodes and buffers one top-level column owns in a record batch, and, for a
    fixed-width column (numbers or fixed-size lists of them), its value type and values per row."""

    first_node: int
    nodes: int
    first_buffer: int
    buffers: int
    value_type: pa.DataType | None  # None: not one run of fixed-width values
    values_per_row: int = 1


def column_slots(schema: pa.Schema) -> dict[str, ColumnSlots] | None:
    """Every column's slots; None when the schema has a type whose IPC layout is not handled here."""
    slots, node, buffer = {}, 0, 0
    for field in schema:
        counts = _counts(field.type)
        if counts is None:
            return None
        value_type, width = _fixed_width(field.type)
        slots[field.name] = ColumnSlots(node, counts[0], buffer, counts[1], value_type, width)
        node, buffer = node + counts[0], buffer + counts[1]
    return slots


def slot_totals(slots: dict[str, ColumnSlots]) -> tuple[int, int]:
    """Field nodes and buffers a record batch of the schema has in all (to check a header against)."""
    return sum(s.nodes for s in slots.values()), sum(s.buffers for s in slots.values())


def _counts(data_type: pa.DataType) -> tuple[int, int] | None:
    """(field nodes, buffers) of one field of this type in the IPC format (version 5)."""
    if isinstance(data_type, pa.BaseExtensionType):
        return _counts(data_type.storage_type)
    types = pa.types
    if types.is_dictionary(data_type):
        return 1, 2  # the indices; the values are in dictionary batches
    if types.is_null(data_type):
        return 1, 0
    if types.is_fixed_size_list(data_type):
        child = _counts(data_type.value_type)
        return None if child is None else (1 + child[0], 1 + child[1])
    if types.is_map(data_type):  # a list of struct<key, item> entries
        child = _counts(pa.struct([data_type.key_field, data_type.item_field]))
        return None if child is None else (1 + child[0], 2 + child[1])
    if types.is_list(data_type) or types.is_large_list(data_type):
        child = _counts(data_type.value_type)
        return None if child is None else (1 + child[0], 2 + child[1])
    if types.is_struct(data_type):
        children = [_counts(data_type.field(i).type) for i in range(data_type.num_fields)]
        if None in children:
            return None
        return 1 + sum(c[0] for c in children), 1 + sum(c[1] for c in children)
    if any(
        check(data_type) for check in (types.is_binary, types.is_string, types.is_large_binary, types.is_large_string)
    ):
        return 1, 3  # validity, offsets, values
    if (
        types.is_integer(data_type)
        or types.is_floating(data_type)
        or types.is_boolean(data_type)
        or types.is_temporal(data_type)
        or types.is_decimal(data_type)
        or types.is_fixed_size_binary(data_type)
    ):
        return 1, 2
    return None  # unions, views, run-end encoded: not in snapshots; the caller decodes such shards


def _fixed_width(data_type: pa.DataType) -> tuple[pa.DataType | None, int]:
    """The value type and values per row when a column is one run of fixed-width values."""
    if isinstance(data_type, pa.BaseExtensionType):
        return _fixed_width(data_type.storage_type)
    if pa.types.is_fixed_size_list(data_type):
        value_type, width = _fixed_width(data_type.value_type)
        return value_type, width * data_type.list_size
    if pa.types.is_integer(data_type) or pa.types.is_floating(data_type):
        return data_type, 1
    return None, 1
