"""The order rows flow in: seeded piece permutation, then a shuffle within windows.

Pure logic. An epoch's stream is the pipeline's pieces, permuted with the
epoch seed, grouped into consecutive windows of at least ``window_rows`` rows;
each window's rows are permuted again. A window is the shuffle buffer: rows are
shuffled across all blocks inside it, and the piece permutation spreads
neighbours on disk across the whole epoch. Everything derives from
``(seed, epoch)`` through NumPy's ``SeedSequence``, so every machine computes
the same order and a resumed iterator can jump straight to any row offset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from reader.core.plan import Piece

_PIECE_ORDER, _ROW_ORDER = 1, 2
#: Epochs whose windows an ``EpochOrder`` keeps: a pass's, the next one's, and the one before.
_EPOCHS_KEPT = 3


def seeded_generator(seed: int, *salt: int) -> np.random.Generator:
    """A NumPy generator for ``(seed, *salt)``: the same stream on every machine."""
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, *salt])))


def epoch_seed(seed: int, epoch: int, *, reshuffle_each_epoch: bool) -> int:
    """The seed of one epoch: the same for every epoch when not reshuffling."""
    return int(seeded_generator(seed, epoch if reshuffle_each_epoch else 0).integers(0, 2**63 - 1))


@dataclasses.dataclass(frozen=True)
class Window:
    pieces: tuple[Piece, ...]
    start: int  # offset of its first row in the epoch stream
    rows: int
    seed: int | None  # None: rows in stored order

    @property
    def stop(self) -> int:
        return self.start + self.rows

    def row_order(self) -> np.ndarray | None:
        """Positions within the window in output order (None: stored order)."""
        if self.seed is None:
            return None
        return seeded_generator(self.seed, _ROW_ORDER).permutation(self.rows)


@dataclasses.dataclass(frozen=True)
class EpochOrder:
    """The order of one pipeline's pieces, epoch by epoch: everything the windows of an epoch derive from."""

    pieces: tuple[Piece, ...]
    window_rows: int
    seed: int
    shuffle: bool = True
    reshuffle_each_epoch: bool = True
    #: The last epochs' windows: each pass asks for its epoch's and the next one's, and a pass a ``for``
    #: loop over epochs starts asks for what the pass before it computed (a millisecond per 200 pieces).
    _computed: dict[int, list[Window]] = dataclasses.field(default_factory=dict, init=False, compare=False, repr=False)

    def windows(self, epoch: int) -> list[Window]:
        """The epoch's windows, in stream order."""
        computed = self._computed.get(epoch)
        if computed is not None:
            return computed
        if not self.shuffle:
            windows = epoch_windows(self.pieces, self.window_rows, None)
        else:
            seed = epoch_seed(self.seed, epoch, reshuffle_each_epoch=self.reshuffle_each_epoch)
            windows = epoch_windows(self.pieces, self.window_rows, seed)
        self._computed[epoch] = windows
        while len(self._computed) > _EPOCHS_KEPT:  # the epochs farthest from this one (a restore may jump back)
            self._computed.pop(max(list(self._computed), key=lambda kept: abs(kept - epoch)), None)
        return windows


def epoch_windows(pieces: Sequence[Piece], window_rows: int, seed: int | None) -> list[Window]:
    """The epoch's windows; ``seed=None`` keeps stored order (no shuffling)."""
    if seed is not None:
        pieces = [pieces[i] for i in seeded_generator(seed, _PIECE_ORDER).permutation(len(pieces))]
    windows: list[Window] = []
    group: list[Piece] = []
    group_rows = start = 0
    for piece in pieces:
        group.append(piece)
        group_rows += piece.rows
        if group_rows >= window_rows:
            windows.append(_window(group, start, group_rows, seed, len(windows)))
            start += group_rows
            group, group_rows = [], 0
    if group:
        windows.append(_window(group, start, group_rows, seed, len(windows)))
    return windows


def _window(pieces: list[Piece], start: int, rows: int, seed: int | None, index: int) -> Window:
    window_seed = None if seed is None else int(seeded_generator(seed, _ROW_ORDER, index).integers(0, 2**63 - 1))
    return Window(tuple(pieces), start, rows, window_seed)
