"""Gathering a window's shuffled large rows straight out of its decoded blocks.

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
