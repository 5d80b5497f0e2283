"""The shard format: Arrow IPC *file* format, one record batch per block.

A block is about ``block_bytes`` of uncompressed data (AUTO: 1 MiB), so a
reader gets random access to blocks through the IPC footer without reading a
whole shard. Writers stream to any file-like sink and compute the CRC32C of
the bytes as they go (the value GCS stores), so no shard is read back to be
checksummed.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import enum
from collections.abc import Iterator

import google_crc32c
import pyarrow as pa
import pyarrow.ipc as ipc

from schemas.errors import CorruptSnapshotError, UsageError

AUTO_BLOCK_BYTES = 1 << 20
AUTO_SHARD_BYTES = 256 << 20


#: AUTO stores a shard with LZ4 only when LZ4 shrinks its first block by at least this much.
AUTO_MIN_SAVINGS = 0.10


class Compression(str, enum.Enum):
    AUTO = "auto"
    LZ4 = "lz4"
    ZSTD = "zstd"
    NONE = "none"

    @classmethod
    def parse(cls, value: str) -> Compression:
        """The RFC's GZIP and SNAPPY are refused with the alternative named."""
        upper = (value or "AUTO").upper()
        if upper in ("GZIP", "SNAPPY"):
            raise UsageError(
                f"--compression={value} is not supported: Arrow IPC shards compress per block "
                f"with LZ4 or ZSTD, which are faster than {upper} and keep random access. "
                f"Use --compression=ZSTD (smaller), LZ4 (faster) or AUTO (LZ4 where it pays, the default)."
            )
        try:
            return cls(upper.lower())
        except ValueError:
            raise UsageError(f"unknown --compression={value}; choose AUTO, LZ4, ZSTD or NONE") from None

    def for_shard(self, first_block: pa.RecordBatch) -> Compression:
        """The codec a shard starting with ``first_block`` is written with.

        AUTO is LZ4 where it pays and NONE where it does not: decoding LZ4 that
        saved nothing (images, already-compressed or random bytes) costs readers a
        full pass over memory, and uncompressed fixed-width blocks can be read
        straight into the reader's buffers. Shards of one snapshot may differ.
        """
        if self is not Compression.AUTO:
            return self
        codec = pa.Codec("lz4")
        raw = compressed = 0
        for column in first_block.columns:
            storage = column.storage if isinstance(column, pa.ExtensionArray) else column
            for buffer in filter(None, storage.buffers()):  # children's buffers included
                raw += buffer.size
                compressed += len(codec.compress(buffer, asbytes=True)) if buffer.size else 0
        saved = 1 - compressed / raw if raw else 0.0
        return Compression.LZ4 if saved >= AUTO_MIN_SAVINGS else Compression.NONE

    @property
    def ipc_options(self) -> ipc.IpcWriteOptions:
        if self is Compression.AUTO:
            raise ValueError("resolve AUTO with for_shard() before writing")
        return ipc.IpcWriteOptions(compression=None if self is Compression.NONE else self.value)


@dataclasses.dataclass(frozen=True)
class ShardStats:
    num_rows: int
    num_bytes: int
    block_rows: tuple[int, ...]
    crc32c: int
    block_crc32c: tuple[int, ...] = ()  # each block's IPC message (header and body), as the reader reads it


class _ChecksummingSink:
    """File-like wrapper counting bytes and folding them into a CRC32C as they pass: the whole file's, and
    each block's (``end_block`` closes one; the first starts after the magic and the schema).

    With ``writes`` (a single-thread executor) the CRC and the write of each
    chunk run there, in order, while the caller goes on encoding the next
    block; at most ``IN_FLIGHT_BYTES`` wait, and ``drain`` waits for them all.
    """

    IN_FLIGHT_BYTES = 32 << 20

    def __init__(self, raw, writes: concurrent.futures.Executor | None = None) -> None:
        self._raw = raw
        self._writes = writes
        self._pending: collections.deque[tuple[concurrent.futures.Future, int]] = collections.deque()
        self._in_flight = 0
        self.crc32c = 0
        self.num_bytes = 0
        self.closed = False
        self._head = b""  # the file's first bytes, until they say where its blocks start
        self._block_start: int | None = None  # where the block being written starts, once the header is known
        self._block_crc = 0
        self.block_crc32c: list[int] = []

    #: The magic (8 bytes), then the schema message's continuation marker and length (4 + 4).
    _HEAD_BYTES = 16

    @property
    def header_bytes(self) -> int:
        """Where the first block starts: after the magic and the schema message (0 until they are written)."""
        if len(self._head) < self._HEAD_BYTES:
            return 0
        return self._HEAD_BYTES + int.from_bytes(self._head[12:16], "little", signed=True)

    def write(self, data) -> int:
        # pyarrow hands over bytes or read-only pyarrow Buffers (immutable, kept alive while referenced), which
        # google-crc32c's C extension and file writes take as they are (a copy into bytes cost a pass over every
        # byte written); a writable view is copied, as the C extension refuses one and it may change later.
        chunk = data if isinstance(data, bytes | pa.Buffer) else bytes(data)
        size = len(chunk)
        if len(self._head) < self._HEAD_BYTES:
            self._head += memoryview(chunk)[: self._HEAD_BYTES - len(self._head)].tobytes()
        if self._block_start is None and self.header_bytes:
            self._block_start = self.header_bytes
        start, block_start = self.num_bytes, self._block_start
        self.num_bytes += size
        if self._writes is None:
            self._write_now(chunk, start, block_start)
            return size
        self._pending.append((self._writes.submit(self._write_now, chunk, start, block_start), size))
        self._in_flight += size
        while self._in_flight > self.IN_FLIGHT_BYTES:
            self._wait_oldest()
        return size

    def _write_now(self, chunk, start: int, block_start: int | None) -> None:
        """Checksums and writes the ``chunk`` of bytes that starts at ``start`` in the file (in write order)."""
        self.crc32c = google_crc32c.extend(self.crc32c, chunk)
        if block_start is not None and start + len(chunk) > block_start:
            in_block = chunk if start >= block_start else memoryview(chunk)[block_start - start :]
            self._block_crc = google_crc32c.extend(self._block_crc, in_block)
        self._raw.write(chunk)

    def end_block(self) -> None:
        """Records the CRC32C of the block whose last byte was just written; the next one starts here."""
        self._block_start = self.num_bytes
        if self._writes is None:
            self._end_block_now()
        else:
            self._pending.append((self._writes.submit(self._end_block_now), 0))

    def _end_block_now(self) -> None:
        self.block_crc32c.append(self._block_crc)
        self._block_crc = 0

    def _wait_oldest(self) -> None:
        future, size = self._pending.popleft()
        self._in_flight -= size
        future.result()  # a failed write raises here

    def drain(self) -> None:
        """Waits until every chunk is written (raising the first failure)."""
        while self._pending:
            self._wait_oldest()

    def tell(self) -> int:
        return self.num_bytes

    def flush(self) -> None:
        self.drain()
        self._raw.flush()

    def close(self) -> None:
        # pyarrow closes the sink when the writer closes; the caller owns ``raw``.
        self.closed = True


#: What each block adds to an IPC file's footer (``struct Block``: offset, metadata length, body length).
FOOTER_BYTES_PER_BLOCK = 24


def _empty_file_bytes(schema: pa.Schema) -> int:
    """The size of an IPC file of ``schema`` holding no block: magic, schema, end marker, footer, trailer."""
    sink = pa.BufferOutputStream()
    ipc.new_file(sink, schema).close()
    return sink.tell()


def block_bytes_within(shard_bytes: int, block_bytes: int, schema: pa.Schema) -> int:
    """The block size (uncompressed bytes, as ``BlockAccumulator`` counts them) that keeps a one-block
    shard of ``schema`` within ``shard_bytes``: ``block_bytes``, or less when the shard bound is smaller.

    A block cannot be larger than a shard: without this cap a shard bound below the block size
    was exceeded by a whole block. What a shard holds besides its blocks' data (the schema, twice,
    and each block's header) is taken off. Only a row larger than that still makes a larger shard.
    """
    empty_block = pa.RecordBatch.from_pylist([], schema=schema)
    besides_data = _empty_file_bytes(schema) + ipc.get_record_batch_size(empty_block) + FOOTER_BYTES_PER_BLOCK
    return min(block_bytes, max(1, shard_bytes - besides_data))


class ShardWriter:
    """Writes blocks to one shard; ``close()`` returns its stats.

    ``writes``: a single-thread executor the bytes are checksummed and written
    on, overlapping the caller's encoding (None: on the caller's thread).
    """

    def __init__(
        self, sink, schema: pa.Schema, compression: Compression, *, writes: concurrent.futures.Executor | None = None
    ) -> None:
        self._sink = _ChecksummingSink(sink, writes)
        self._writer = ipc.new_file(pa.PythonFile(self._sink, mode="w"), schema, options=compression.ipc_options)
        self._block_rows: list[int] = []
        self._empty_file_bytes = _empty_file_bytes(schema)

    @property
    def bytes_written(self) -> int:
        return self._sink.num_bytes

    @property
    def num_rows(self) -> int:
        return sum(self._block_rows)

    def fits(self, block: pa.RecordBatch, shard_bytes: int) -> bool:
        """Whether the shard, closed after ``block``, stays within ``shard_bytes`` (an empty one takes any block).

        The block's size is its uncompressed IPC message: a compressed shard may close a little early.
        """
        if not self._block_rows:
            return True
        blocks = len(self._block_rows) + 1
        data = self._sink.num_bytes - self._sink.header_bytes + ipc.get_record_batch_size(block)
        return self._empty_file_bytes + data + blocks * FOOTER_BYTES_PER_BLOCK <= shard_bytes

    def write_block(self, block: pa.RecordBatch) -> None:
        self._writer.write_batch(block)
        self._sink.end_block()
        self._block_rows.append(block.num_rows)

    def close(self) -> ShardStats:
        self._writer.close()
        self._sink.drain()
        return ShardStats(
            num_rows=sum(self._block_rows),
            num_bytes=self._sink.num_bytes,
            block_rows=tuple(self._block_rows),
            crc32c=self._sink.crc32c,
            block_crc32c=tuple(self._sink.block_crc32c),
        )


class BlockAccumulator:
    """Regroups incoming record batches into blocks of about ``block_bytes``.

    Pure logic: rows-per-block comes from the observed bytes per row, so tiny
    rows give big blocks and 150 KB rows give few-row blocks.
    """

    def __init__(self, block_bytes: int = AUTO_BLOCK_BYTES) -> None:
        if block_bytes < 1:
            raise UsageError(f"block size must be positive, got {block_bytes}")
        self._block_bytes = block_bytes
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0

    def _rows_per_block(self) -> int:
        bytes_per_row = max(1, self._pending_bytes // max(1, self._pending_rows))
        return max(1, self._block_bytes // bytes_per_row)

    def add(self, batch: pa.RecordBatch) -> Iterator[pa.RecordBatch]:
        """Adds a batch; yields every block that is now full."""
        if batch.num_rows == 0:
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= self._block_bytes:
            yield from self._drain(keep_partial=True)

    def flush(self) -> Iterator[pa.RecordBatch]:
        """Yields what is left (the last, possibly small, block)."""
        yield from self._drain(keep_partial=False)

    def _drain(self, *, keep_partial: bool) -> Iterator[pa.RecordBatch]:
        if not self._pending:
            return
        rows_per_block = self._rows_per_block()
        table = pa.Table.from_batches(self._pending)
        offset, total = 0, table.num_rows
        while total - offset >= rows_per_block:
            yield table.slice(offset, rows_per_block).combine_chunks().to_batches()[0]
            offset += rows_per_block
        rest = table.slice(offset)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        if rest.num_rows == 0:
            return
        rest_batch = rest.combine_chunks().to_batches()[0]
        if keep_partial:
            self._pending = [rest_batch]
            self._pending_rows = rest_batch.num_rows
            self._pending_bytes = rest_batch.nbytes
        else:
            yield rest_batch


def checksum_file(stream, chunk_bytes: int = 8 << 20, buffer: pa.Buffer | None = None) -> tuple[int, int]:
    """(crc32c, size) of everything readable from ``stream`` (``readinto``), read chunk by chunk into one
    mutable ``buffer`` (a fresh one of ``chunk_bytes`` when None): nothing is allocated per chunk, where
    fresh chunks freed at GB/s stayed in the reading thread's malloc arena."""
    buffer = buffer if buffer is not None else pa.py_buffer(bytearray(chunk_bytes))
    view = memoryview(buffer)
    crc, size = 0, 0
    while got := stream.readinto(view):
        crc = google_crc32c.extend(crc, buffer.slice(0, got))
        size += got
    return crc, size


_ZEROS = pa.py_buffer(bytes(1 << 20))  # what crc32c_concat shifts a CRC over


def crc32c_concat(first: int, second: int, second_bytes: int) -> int:
    """The CRC32C of ``A + B`` from ``first`` = CRC32C(A), ``second`` = CRC32C(B) and B's length: parts
    checked as they arrive, in any order, make the whole's checksum without reading it again.

    CRC32C is affine in the message, with the register's initial value and final XOR both 0xFFFFFFFF:
    CRC(A + B) = S(CRC(A)) ^ CRC(B), where S runs the register over len(B) zero bytes, which is what
    extending ``first ^ 0xFFFFFFFF`` with zeros and XOR-ing 0xFFFFFFFF back computes.
    """
    shifted = first ^ 0xFFFFFFFF
    while second_bytes:
        zeros = min(second_bytes, _ZEROS.size)
        shifted = google_crc32c.extend(shifted, _ZEROS.slice(0, zeros))
        second_bytes -= zeros
    return shifted ^ 0xFFFFFFFF ^ second


def open_shard(random_access_file, where: str) -> ipc.RecordBatchFileReader:
    """Opens an IPC file; a truncated or garbled shard is named in the error."""
    try:
        return ipc.open_file(random_access_file)
    except (pa.ArrowInvalid, OSError) as exc:
        raise CorruptSnapshotError(
            f"shard {where} is unreadable ({exc}); it is truncated or corrupt. "
            f"Run `snapfeed verify` on the snapshot and materialize it again with --mode=write."
        ) from exc
