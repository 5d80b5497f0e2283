"""Gathering shuffled rows into batches: one pass per column, or row by row for large rows.

For large rows, copying a whole window into one array before gathering costs a
full extra pass over memory. Instead each row is copied once, from its decoded
block to its slot in the output batch; with rows of tens of kilobytes the
per-row call is noise next to the copy. Smaller rows keep the window copy (one
``take`` per batch beats per-row or per-block calls; measured, see the reader
bench notes).
"""

from __future__ import annotations

import numpy as np

from reader.blocks import Columns


def take_rows(values: np.ndarray, positions: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = values[positions[i]]``, one pass over memory.

    ``positions`` are in range by construction. With NumPy's default
    ``mode="raise"`` a ``take`` into ``out`` gathers into a temporary and copies
    that over ``out`` (so a bad index leaves ``out`` untouched): a second pass
    that cost a third of the gather.
    """
    np.take(values, positions, axis=0, out=out, mode="clip")


class DecodedParts:
    """A window held as its decoded pieces (dicts of equally long columns), in stream order."""

    def __init__(self, parts: list[Columns]) -> None:
        self._parts = parts
        self._offsets = np.cumsum([0] + [len(next(iter(part.values()))) for part in parts])

    def take_into(self, rows: np.ndarray, out: Columns) -> None:
        """Writes the rows at window positions ``rows`` into ``out`` (arrays of ``len(rows)``), in order."""
        part_of = (np.searchsorted(self._offsets, rows, side="right") - 1).tolist()
        local = (rows - self._offsets[part_of]).tolist()
        for name, destination in out.items():
            sources = [part[name] for part in self._parts]
            for slot, (part, row) in enumerate(zip(part_of, local, strict=True)):
                destination[slot] = sources[part][row]
