"""Reading pieces of blocks from shards into NumPy columns, one of two ways per shard.

- Direct: local, uncompressed shards whose selected columns are all
  fixed-width skip Arrow (a bucket shard downloading into the cache counts as
  local: its reads wait for the chunks they need, ``reader.core.cache.shard_fill``).
  Each block's header is read once, when the block is
  first needed, and says where each column's run of bytes lies
  (``reader.core.ipc_layout``); pieces are read with ``preadv`` straight into the
  window's buffer, or for large rows into the batch (``reader.core.batch``).
  What the page cache holds is copied at once by the thread loading the
  window; a read that would wait for the disk (``RWF_NOWAIT`` says so) is
  handed to the I/O pool, so a cold disk has many reads outstanding and a warm
  cache costs no hand-off. Blocks of windows further ahead are read by the
  kernel into the page cache, or downloaded first (``advise``).
- Fetched: every other shard (compressed, on an object store, strings or lists
  selected) is read whole block by whole block through ``reader.core.block_io``: a
  window's blocks as coalesced reads on the I/O pool, issued ahead of use,
  then decoded by Arrow (GIL released) on the CPU threads.

Which way is per shard, from the manifest, and was decided by measurement
(``bench/cold_read_bench.py``): on local uncompressed shards both ways read as
fast, cold and warm, and the direct one holds no blocks in memory.
``SNAPFEED_DIRECT_READS=0`` reads every shard the fetched way (to compare).
Every shard is checked against the manifest the first time it is opened
(``reader.core.shard_files``), its CRC32C with ``verify_checksums=True``. With
``verify_checksums="blocks"`` each block is checked against its own CRC32C the
first time this process reads it instead (``reader.core.block_checks``): a direct
block is read whole once for that, with its header.
"""

from __future__ import annotations

import concurrent.futures
import functools
import os
from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa

from reader.core import block_checks, block_io, ipc_layout
from reader.core.allocator import Columns
from reader.core.batch import DirectWindow
from reader.core.block_io import Fetch, ShortReadError
from reader.core.cache import Filling, ShardCache
from reader.core.direct_shard import (
    BlockExtents,
    ColumnExtent,
    DirectShard,
    HeaderExtents,
    LocalShardFile,
    pread_nowait,
)
from reader.core.ipc_layout import BlockRange
from reader.core.loading import Loading, WindowBuffer
from reader.core.plan import Piece
from reader.core.shard_files import OpenShard, ShardFiles
from reader.core.snapshot import Snapshot
from schemas import columns
from schemas.errors import CorruptSnapshotError

DIRECT_READS_ENV = "SNAPFEED_DIRECT_READS"


class BlockReader:
    """Thread-safe reads of ``Piece``s of one snapshot, projected to ``column_names``."""

    def __init__(
        self,
        snapshot: Snapshot,
        column_names: Sequence[str],
        *,
        verify_checksums: bool | str,
        direct_reads: bool | None = None,
        cache: ShardCache | None = None,
        keep_fetched_bytes: int = 0,
    ) -> None:
        """``keep_fetched_bytes``: how much of the buffers fetched blocks were read into is kept for
        later fetches once copied out (``block_io.FetchBuffers``)."""
        self._snapshot = snapshot
        self._fetch_buffers = block_io.FetchBuffers(keep_fetched_bytes)
        self._columns = list(column_names)
        self._checks = block_checks.BlockChecks(snapshot, enabled=bool(verify_checksums))
        self._files = ShardFiles(snapshot, verify_checksums=verify_checksums, checks=self._checks, cache=cache)
        #: Each stored schema's fields and their IPC slots, by the snapshot holding the shard: a union's members
        #: agree on the columns read, not on the whole schema their blocks were written with.
        self._layouts: dict[int, tuple[pa.Schema, dict | None]] = {}
        spec = snapshot.element_spec
        if direct_reads is None:
            direct_reads = os.environ.get(DIRECT_READS_ENV, "1") != "0"
        # Strings, bytes and lists have offsets, not fixed-width rows: such a projection is always fetched.
        self._fixed_width = all(spec[name].fixed_width for name in self._columns)
        self._direct_columns = direct_reads and self._fixed_width
        self._direct: dict[int, DirectShard | None] = {}
        self._may_direct: dict[int, bool] = {}

    def _stored(self, shard: int) -> tuple[pa.Schema, dict | None]:
        """The schema the shard's blocks were written with, and its columns' IPC slots (None: not plain)."""
        member, _ = self._snapshot.locate(shard)
        layout = self._layouts.get(id(member))
        if layout is None:
            schema = member.schema
            layout = self._layouts[id(member)] = (schema, ipc_layout.column_slots(schema))
        return layout

    def _may_read_directly(self, shard: int) -> bool:
        """Whether the shard is read the direct way, from the manifest alone (no I/O)."""
        if shard not in self._may_direct:
            self._may_direct[shard] = (
                self._direct_columns
                and self._snapshot.shard_codec(shard) == "none"
                and self._stored(shard)[1] is not None
            )
        return self._may_direct[shard] and self._files.is_local(shard)

    def _direct_shard(self, shard: int) -> DirectShard | None:
        """The shard opened for direct reads, when its manifest entry and the selected columns allow them."""
        if shard not in self._direct:
            if not self._may_read_directly(shard):
                self._direct[shard] = None
            else:
                opened = self._files.open(shard)  # checked against the manifest first
                with self._files.lock(shard):
                    if shard not in self._direct:
                        self._direct[shard] = self._direct_file(shard, opened)
        return self._direct[shard]

    def _direct_file(self, shard: int, opened: OpenShard) -> DirectShard | None:
        """Direct reads of an opened shard: of its local file, or of its download into the cache as it lands."""
        if isinstance(opened.file, Filling):
            file = opened.file
        elif opened.local is not None:
            file = LocalShardFile(opened.local)
        else:
            return None
        extents = HeaderExtents(len(opened.layout.blocks), functools.partial(self._extents, shard, opened))
        return DirectShard(opened.local or self._snapshot.shard_path(shard), file, extents)

    def _extents(self, shard: int, opened: OpenShard, index: int) -> BlockExtents | None:
        """Where the selected columns of one block lie, from its header; None when any is not one plain
        run of bytes (nulls, a compressed block, another dtype): that block is decoded by Arrow instead."""
        span = opened.layout.blocks[index]
        whole = self._checks.needed(shard, index)  # checked once per process: read with its header, then
        try:
            message = block_io.read_exactly(opened.file, span.offset, span.length if whole else span.metadata_bytes)
        except ShortReadError as exc:
            raise self._files.cut_short(self._snapshot.shard_path(shard), exc) from exc
        if whole:
            self._checks.check(shard, index, message)
        try:
            header = ipc_layout.parse_batch_header(message.slice(0, span.metadata_bytes))
        except ValueError:
            return None  # Arrow's decoder names what is wrong with it
        expected = self._snapshot.shard_info(shard).block_rows[index]
        if header.compressed or header.rows != expected or header.body_bytes != span.body_bytes:
            return None
        _, stored_slots = self._stored(shard)
        if (len(header.nodes), len(header.buffers)) != ipc_layout.slot_totals(stored_slots):
            return None
        spec = self._snapshot.element_spec
        extents = {}
        for name in self._columns:
            slots, dtype = stored_slots[name], np.dtype(spec[name].dtype)
            if slots.value_type is None or slots.value_type != pa.from_numpy_dtype(dtype):
                return None
            if any(header.nodes[node][1] for node in range(slots.first_node, slots.first_node + slots.nodes)):
                return None
            offset, length = header.buffers[slots.first_buffer + slots.buffers - 1]  # the values
            row_bytes = slots.values_per_row * dtype.itemsize
            if offset < 0 or length < header.rows * row_bytes or offset + length > span.body_bytes:
                return None
            extents[name] = ColumnExtent(span.body_offset + offset, row_bytes)
        return BlockExtents(header.rows, extents)

    def fetch(self, pieces: Sequence[Piece], pool, *, max_bytes: int, open_threads: int = 16) -> Fetch | None:
        """Starts reading, on the I/O ``pool``, the blocks of ``pieces`` that are not read directly:
        coalesced, in the order the pieces need them. None when there are none."""
        if self._files.cached:  # whether a bucket shard is read from the cache (directly) is known once open
            self._files.open_many([piece.shard for piece in pieces], open_threads)
        fetched = [piece for piece in pieces if not self._may_read_directly(piece.shard)]
        if not fetched:
            return None
        self._files.open_many([piece.shard for piece in fetched], open_threads)
        blocks = [((p.shard, p.block), self._block_range(p.shard, p.block)) for p in fetched]
        return Fetch(
            blocks, self._files.file, pool, max_bytes=max_bytes, cached=self._cached_at, buffers=self._fetch_buffers
        )

    def _cached_at(self, shard: int, offset: int) -> bool:
        """Whether the shard's byte at ``offset`` is in the page cache now (False off local disk)."""
        if self._files.open(shard).local is None:
            return False
        return pread_nowait(self._files.file(shard).fileno(), memoryview(bytearray(1)), offset) == 1

    def _header_readable(self, direct: DirectShard, shard: int, block: int) -> bool:
        """Whether a direct block's first byte is readable without waiting (its header then is, read at once)."""
        return direct.file.pread_now(memoryview(bytearray(1)), self._block_range(shard, block).offset) == 1

    def ahead_bytes(self, pieces: Sequence[Piece], open_threads: int = 16) -> int:
        """Bytes that reading the pieces ahead (``fetch`` and ``advise``) reads: their blocks once each."""
        self._files.open_many([piece.shard for piece in pieces], open_threads)
        blocks = {(p.shard, p.block) for p in pieces}
        return sum(self._block_range(shard, block).length for shard, block in blocks)

    def advise(self, pieces: Sequence[Piece], pool) -> int:
        """Has the kernel read the blocks of directly read pieces into the page cache, ahead of their
        reads (asked on ``pool``, the I/O pool); returns their bytes."""
        blocks = list(dict.fromkeys((p.shard, p.block) for p in pieces if self._may_read_directly(p.shard)))
        self._will_need(blocks, pool)
        return sum(self._block_range(shard, block).length for shard, block in blocks)

    def _block_range(self, shard: int, block: int) -> BlockRange:
        return self._files.open(shard).layout.blocks[block]

    def direct_window(self, pieces: Sequence[Piece], pool=None) -> DirectWindow | None:
        """The pieces as a window to gather from in place; None unless every block allows it.

        Block headers not read yet are read on ``pool`` (the I/O pool), all at once.
        """
        if not pieces or not all(self._may_read_directly(shard) for shard in {p.shard for p in pieces}):
            return None
        blocks = list(dict.fromkeys((p.shard, p.block) for p in pieces))

        def extents(key: tuple[int, int]) -> BlockExtents | None:
            direct = self._direct_shard(key[0])
            return direct.blocks[key[1]] if direct else None

        unread = [key for key in blocks if not self._extents_known(*key)]
        if pool is not None and len(unread) > 1:
            list(pool.map(extents, unread))  # headers not read yet, all at once (handing known ones over costs more)
        if any(extents(key) is None for key in blocks):
            return None
        self._will_need(blocks, pool)
        return DirectWindow(pieces, self._direct_shard, self._columns)

    def _extents_known(self, shard: int, block: int) -> bool:
        direct = self._direct.get(shard)
        return direct is not None and direct.blocks.known(block)

    def _will_need(self, blocks: Sequence[tuple[int, int]], pool=None) -> None:
        """Has direct blocks read ahead of their reads: a local file's by the kernel, into the page cache
        when they are not there (``LocalShardFile.will_need``), a downloading shard's chunks moved ahead of
        the rest of its download (``Filling.will_need``).

        On ``pool`` (the I/O pool) when given, not on the caller's thread: callers are the gathering
        thread, where probing the page cache for each block was a twentieth of a warm pass's time (3 KB
        rows, mostly waiting for the GIL back after each probe). A hint: what fails here is named by the
        read that follows.
        """
        if not blocks:
            return
        if pool is not None:
            pool.submit(self._will_need, blocks)
            return
        for shard, block in blocks:
            direct = self._direct_shard(shard)
            if direct is not None:
                span = self._block_range(shard, block)
                direct.file.will_need(span.offset, span.length)

    def read_direct(self, piece: Piece, out: Callable[[int], Columns]) -> Columns | None:
        """The piece read straight from its shard file into ``out(piece.rows)`` (arrays of that many rows per
        column) when its block allows it (a local, uncompressed shard of plain columns): no decoding and no
        fresh memory. None when it does not (``read`` it instead). Blocking reads, on the caller's thread."""
        direct = self._direct_for(piece)
        if direct is None:
            return None
        arrays = out(piece.rows)
        try:
            direct.read_piece_into(piece, arrays)
        except OSError as exc:
            path = self._snapshot.shard_path(piece.shard)
            raise self._files.unreadable(f"block {piece.block} of shard {path}", path, exc) from exc
        return arrays

    def read(self, piece: Piece, fetch: Fetch | None = None, *, copied_after: bool = False) -> Columns:
        block = self.read_arrow(piece, fetch, copied_after=copied_after)
        return {name: columns.column_to_numpy(block.column(name)) for name in self._columns}

    def read_arrow(self, piece: Piece, fetch: Fetch | None = None, *, copied_after: bool = False) -> pa.RecordBatch:
        """The piece as an Arrow record batch of the projected columns (what service workers stream).

        Its block's bytes come from ``fetch`` when it holds them, else from one read of the whole block.
        ``copied_after``: the caller copies the piece out and then tells ``fetch`` (``Fetch.copied``).
        """
        path = self._snapshot.shard_path(piece.shard)
        key = (piece.shard, piece.block)
        try:
            if fetch is not None and key in fetch:
                message = fetch.take(key, copied_after=copied_after)
            else:
                opened = self._files.open(piece.shard)
                span = opened.layout.blocks[piece.block]
                message = block_io.read_exactly(opened.file, span.offset, span.length)
            self._checks.check(piece.shard, piece.block, message)
            block = block_io.decode_block(message, self._stored(piece.shard)[0])
        except CorruptSnapshotError:
            raise
        except ShortReadError as exc:
            raise self._files.cut_short(path, exc) from exc
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise self._files.unreadable(f"block {piece.block} of shard {path}", path, exc) from exc
        expected = self._snapshot.shard_info(piece.shard).block_rows[piece.block]
        if block.num_rows != expected:
            raise CorruptSnapshotError(
                f"block {piece.block} of shard {path} has {block.num_rows} rows, the manifest says {expected}"
            )
        if piece.start or piece.stop != block.num_rows:
            block = block.slice(piece.start, piece.rows)
        return block.select(self._columns)

    def read_window(
        self,
        pieces: Sequence[Piece],
        pool,
        buffer: WindowBuffer | None = None,
        *,
        io_pool=None,
        fetch: Fetch | None = None,
    ) -> Loading:
        """Starts reading all pieces; the result is one array per column, pieces in order.

        Pieces are read on ``pool``: direct ones from the page cache, handing
        what is not cached yet to ``io_pool`` (``_read_direct``), the others
        decoded from ``fetch`` (started by ``fetch()``; without one each block
        is read when its piece is). With a ``buffer`` each piece is read into
        its place in the buffer's reused arrays (straight from the file for
        direct shards), so the result is only valid until the buffer is
        reused; without one it is fresh memory.
        """
        io_pool = io_pool or pool
        if buffer is None:
            reads = [functools.partial(self.read, piece, fetch) for piece in pieces]
            return Loading(pool, reads, self._concatenate, fetch=fetch)
        out = buffer.arrays(self._snapshot, self._columns, sum(piece.rows for piece in pieces))
        self._files.open_local([piece.shard for piece in pieces if self._may_read_directly(piece.shard)])
        offsets = np.cumsum([0] + [piece.rows for piece in pieces]).tolist()

        def fill(index: int) -> concurrent.futures.Future | None:
            piece = pieces[index]
            target = {name: out[name][offsets[index] : offsets[index + 1]] for name in self._columns}
            if self._may_read_directly(piece.shard):
                direct = self._direct.get(piece.shard)
                if direct is None and self._files.is_open(piece.shard):  # opened ahead (``ahead_bytes``)
                    direct = self._direct_shard(piece.shard)
                if direct is None or not (
                    direct.blocks.known(piece.block) or self._header_readable(direct, piece.shard, piece.block)
                ):
                    # Opening the shard or reading the block's header waits for the disk: on the I/O pool.
                    return io_pool.submit(self._fill_waiting, piece, target, fetch)
                if direct.blocks[piece.block] is not None:
                    return self._read_direct(direct, piece, target, io_pool)
            self._fill_decoded(piece, target, fetch)
            return None

        reads = [functools.partial(fill, index) for index in range(len(pieces))]
        return Loading(pool, reads, lambda _: out, fetch=fetch)

    def _fill_decoded(self, piece: Piece, out: Columns, fetch: Fetch | None) -> None:
        # Only fixed-width columns are copied: a window's object arrays (lists) hold views of the block's values.
        copied = self._fixed_width and fetch is not None and (piece.shard, piece.block) in fetch
        part = self.read(piece, fetch, copied_after=copied)
        for name in self._columns:
            out[name][...] = part[name]
        if copied:
            del part  # the last reference to the fetched bytes: their buffer may be reused now
            fetch.copied((piece.shard, piece.block))

    def _fill_waiting(self, piece: Piece, out: Columns, fetch: Fetch | None) -> None:
        """A piece read with blocking reads (an I/O pool task): directly when its block allows it."""
        direct = self._direct_for(piece)
        if direct is not None:
            direct.read_piece_into(piece, out)
        else:
            self._fill_decoded(piece, out, fetch)

    def _direct_for(self, piece: Piece) -> DirectShard | None:
        """The piece's shard open for direct reads, when the piece's block allows them."""
        direct = self._direct_shard(piece.shard)
        return direct if direct is not None and direct.blocks[piece.block] is not None else None

    def _read_direct(
        self, direct: DirectShard, piece: Piece, out: Columns, io_pool
    ) -> concurrent.futures.Future | None:
        """Reads the piece into ``out`` as far as the page cache holds it now; the rest is read on the I/O
        pool (the future of that is returned), so a cold disk gets many reads at once.

        Whether a read would wait for the disk is asked of the kernel, not guessed: ``preadv`` with
        ``RWF_NOWAIT`` copies what is cached and stops where it would have to wait (and starts the
        kernel's read-ahead there). Warm, every piece is one such read on the thread that was going to
        copy it anyway, with no hand-off; cold, a thread that would block hands the read over.
        """
        rest = []
        for name, values in out.items():
            extent = direct.blocks[piece.block].columns[name]
            destination = memoryview(values).cast("B")  # refuses a non-contiguous array instead of copying
            offset = extent.offset + piece.start * extent.row_bytes
            destination, offset = direct.read_now(destination, offset)
            if destination:
                rest.append((destination, offset))
        if not rest:
            return None
        return io_pool.submit(_read_rest, direct, rest)

    def _concatenate(self, parts: list[Columns]) -> Columns:
        if len(parts) == 1:
            return parts[0]
        return {name: np.concatenate([part[name] for part in parts]) for name in self._columns}


def _read_rest(direct: DirectShard, rest: list[tuple[memoryview, int]]) -> None:
    for destination, offset in rest:
        direct.read_into(destination, offset)  # blocking; a shard cut short is named
