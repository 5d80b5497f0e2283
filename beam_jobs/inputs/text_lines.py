"""The lines of a byte range of a text file, as Beam's text source splits them.

A range ``[start, end)`` yields every line that starts inside it, read to its
end even past ``end``; the line under way at ``start`` belongs to the range
before. So ranges that tile a file yield each line exactly once. Lines end at
``\\n`` with an optional ``\\r`` before it (both stripped); a last line without
a newline counts (a ``\\r`` at its end is kept, as Beam keeps it), an empty
remainder after the final newline does not. Free of Beam: any binary stream
with ``seek`` and ``read`` works.
"""

from __future__ import annotations

from collections.abc import Iterator

_CHUNK_BYTES = 4 << 20


def iter_lines(stream, start: int = 0, end: int | None = None, chunk_bytes: int = _CHUNK_BYTES) -> Iterator[bytes]:
    """The lines starting in ``[start, end)`` of ``stream`` (``end`` None: to the end of the file)."""
    buffer, pos, offset = b"", 0, start  # ``offset``: the file offset of buffer[pos]
    if start > 0:
        stream.seek(start - 1)
        buffer, offset = stream.read(chunk_bytes), start - 1
        while (newline := buffer.find(b"\n")) < 0:  # the line under way at ``start`` is the previous range's
            more = stream.read(chunk_bytes)
            if not more:
                return
            offset += len(buffer)
            buffer = more
        pos, offset = newline + 1, offset + newline + 1
    while end is None or offset < end:
        newline = buffer.find(b"\n", pos)
        if newline < 0:
            more = stream.read(chunk_bytes)
            if more:
                buffer, pos = buffer[pos:] + more, 0
                continue
            if pos < len(buffer):
                yield buffer[pos:]
            return
        yield buffer[pos : newline - 1 if newline > pos and buffer[newline - 1] == 13 else newline]
        offset += newline + 1 - pos
        pos = newline + 1
