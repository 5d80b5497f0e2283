"""Several sources mixed with weights: exact shares per epoch, stratified batches, one global stream.

``reader.mixture({"web": a, "code": b}, weights={"web": 3, "code": 1})`` makes a ``Mixture``, which
``distributed_dataset`` and ``dataset`` read like a snapshot. Its plan (``reader.core.mixture_plan``)
says how many rows of each source every epoch and every global batch take; this module says which:

- Each source is a stream of *passes*: pass ``p`` is all its blocks, permuted with a seed of
  (dataset seed, source, ``p``) (stored order unshuffled). Epoch ``e`` takes rows
  ``[e * quota, (e + 1) * quota)`` of that stream, so no row repeats before every row was delivered.
- An epoch's stream is cut into windows of whole global batches (the shuffle buffer). A window takes
  the next rows of each source, as pieces of its blocks, and its row order puts each batch's quota
  of each source at that batch's positions, at random among the window's rows of that source and
  mixed across sources within the batch.

All of it is a function of (the sources' snapshots, weights, epoch rows, seed, epoch, global batch),
never of the number of pipelines: pipelines slice each global batch as under ``shard_policy=DATA``
(each loads the windows and gathers its slice), so a state restores exactly on any number of them.
The block reader reads every source's shards through one ``SnapshotUnion`` of all their snapshots:
one read pool, one cache and one window ring for any number of sources.
"""

from __future__ import annotations

import bisect
import dataclasses
import functools
import itertools
import math
import numbers
from collections.abc import Mapping, Sequence

import numpy as np
import pyarrow as pa

from reader.core import order
from reader.core.mixture_plan import MixturePlan
from reader.core.plan import Piece, all_blocks
from reader.core.snapshot import Snapshot, TensorSpec
from reader.core.union import SnapshotUnion, as_readable
from reader.core.union import refusal as union_refusal
from schemas.errors import UsageError
from schemas.snapshot_pb2 import ShardInfo

_SOURCE_SEED, _WINDOW_ORDER = 12, 13


def _weight(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value) or value <= 0:
        raise UsageError(f"mixture weight {name}={value!r}; give each source a positive finite number")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Mixture:
    """Named sources (each a snapshot or a union) read as one dataset with weights (``reader.mixture``)."""

    names: tuple[str, ...]
    sources: tuple[Snapshot | SnapshotUnion, ...]
    weights: tuple[float, ...]
    epoch_rows: int

    @functools.cached_property
    def union(self) -> SnapshotUnion:
        """Every source's snapshots in one shard index space (what the block reader reads)."""
        return SnapshotUnion(tuple(member for source in self.sources for member in _members(source)))

    @functools.cached_property
    def source_pieces(self) -> tuple[tuple[Piece, ...], ...]:
        """Each source's blocks, as pieces of the union's shards."""
        pieces, first = [], 0
        for source in self.sources:
            pieces.append(
                tuple(
                    Piece(piece.shard + first, piece.block, piece.start, piece.stop)
                    for piece in all_blocks(source.block_rows)
                )
            )
            first += source.num_shards
        return tuple(pieces)

    @property
    def source_rows(self) -> tuple[int, ...]:
        return tuple(source.num_rows for source in self.sources)

    def plan(self, batch: int, drop_remainder: bool) -> MixturePlan:
        return MixturePlan(self.source_rows, self.weights, self.epoch_rows, batch, drop_remainder)

    @property
    def weights_text(self) -> str:
        return weights_text(self.names, self.weights)

    @property
    def path(self) -> str:
        """For messages: the sources by name, with weights."""
        return f"the mixture {self.weights_text}"

    @property
    def snapshot_id(self) -> str:
        return "mix(" + ",".join(self.names) + ")"

    @property
    def identity(self) -> dict:
        """What a saved state records: every source's name, weight and rows, and the epoch's rows."""
        return {
            "mixture": [
                [name, weight, source.identity]
                for name, weight, source in zip(self.names, self.weights, self.sources, strict=True)
            ],
            "epoch_rows": self.epoch_rows,
        }

    # What the block reader and the pipeline read of a snapshot, over every source's shards.
    @property
    def members(self) -> tuple[Snapshot, ...]:
        return self.union.members

    @property
    def num_rows(self) -> int:
        return self.union.num_rows

    @property
    def num_bytes(self) -> int:
        return self.union.num_bytes

    @property
    def num_shards(self) -> int:
        return self.union.num_shards

    @property
    def block_rows(self) -> list[list[int]]:
        return self.union.block_rows

    @property
    def element_spec(self) -> dict[str, TensorSpec]:
        return self.union.element_spec

    @property
    def column_names(self) -> list[str]:
        return self.union.column_names

    @property
    def schema(self) -> pa.Schema:
        return self.union.schema

    def locate(self, shard: int) -> tuple[Snapshot, int]:
        return self.union.locate(shard)

    def shard_path(self, index: int) -> str:
        return self.union.shard_path(index)

    def shard_info(self, index: int) -> ShardInfo:
        return self.union.shard_info(index)

    def shard_codec(self, index: int) -> str:
        return self.union.shard_codec(index)

    def readable_columns(self, wanted: Sequence[str] | None) -> list[str]:
        return self.union.readable_columns(wanted)


def _members(source: Snapshot | SnapshotUnion) -> tuple[Snapshot, ...]:
    return source.members if isinstance(source, SnapshotUnion) else (source,)


def mixture(
    sources: Mapping[str, object], weights: Mapping[str, float] | None = None, epoch_rows: int | None = None
) -> Mixture:
    """Sources read as one dataset, each epoch exactly the weights' share of ``epoch_rows`` from each.

    Args:
        sources: name -> what ``distributed_dataset`` reads as one snapshot (a folder, an ``open_snapshot``
            handle, a view ``VIEW`` or ``VIEW@K``) or a list of them (their union).
        weights: name -> a positive number (None: the same for all); only ratios count.
        epoch_rows: rows an epoch delivers (None: the sources' rows added up). A source whose share is more
            than its rows is read more than once per epoch; less, and the next epoch goes on from where
            this one stopped in it.

    Give the mixture as ``distributed_dataset``'s (or ``dataset``'s) first argument.
    """
    if not isinstance(sources, Mapping) or not sources:
        raise UsageError(f"reader.mixture(sources={sources!r:.80}); give a dict of name -> snapshot, at least one")
    names = tuple(sources)
    if bad := [name for name in names if not isinstance(name, str) or not name]:
        raise UsageError(f"reader.mixture: source names must be non-empty strings, got {bad!r}")
    weights = dict.fromkeys(names, 1.0) if weights is None else dict(weights)
    if set(weights) != set(names):
        missing, unknown = sorted(set(names) - set(weights)), sorted(set(weights) - set(names))
        raise UsageError(
            f"reader.mixture: weights name {sorted(weights)} but the sources are {list(names)}"
            + (f" (no weight for {missing})" if missing else "")
            + (f" (no source {unknown})" if unknown else "")
            + "; give one weight per source"
        )
    opened = tuple(as_readable(sources[name]) for name in names)
    _refuse_shared_snapshots(names, opened)
    total = sum(source.num_rows for source in opened)
    if epoch_rows is None:
        epoch_rows = total
    elif isinstance(epoch_rows, bool) or not isinstance(epoch_rows, numbers.Integral) or epoch_rows < 1:
        raise UsageError(f"reader.mixture(epoch_rows={epoch_rows!r}); give a positive number of rows, or None")
    if empty := [name for name, source in zip(names, opened, strict=True) if source.num_rows == 0]:
        raise UsageError(f"reader.mixture: source {', '.join(empty)} has no rows; a mixture draws rows from each")
    return Mixture(names, opened, tuple(_weight(name, weights[name]) for name in names), int(epoch_rows))


def _refuse_shared_snapshots(names: Sequence[str], sources: Sequence[Snapshot | SnapshotUnion]) -> None:
    """One line when two sources hold the same snapshot run: its rows would count towards both shares."""
    seen: dict[tuple[str, str], str] = {}
    for name, source in zip(names, sources, strict=True):
        for member in _members(source):
            key = (member.path, member.metadata.run_id)
            if key in seen and seen[key] != name:
                raise UsageError(
                    f"reader.mixture: snapshot {member.path} is in both source {seen[key]} and source {name}; "
                    f"each snapshot may be in one source only"
                )
            seen[key] = name


def refusal(saved: object, reading) -> str:
    """Why a state that recorded ``saved`` (an ``identity``) cannot restore into a dataset reading ``reading``;
    '' when it records the same rows (mixtures here, the rest ``reader.core.union.refusal``)."""
    saved_mix = isinstance(saved, dict) and "mixture" in saved
    if not saved_mix and not isinstance(reading, Mixture):
        return union_refusal(saved, reading)
    current = reading.identity
    if saved == current:
        return ""
    if not saved_mix:
        return (
            f"this reader state was saved reading {_not_mixture(saved)}; this dataset reads {reading.path}: "
            f"build the dataset the state was saved on, or start a fresh iterator (no set_state)"
        )
    if not isinstance(reading, Mixture):
        return (
            f"this reader state was saved on a mixture ({_weights_of(saved)}); this dataset reads {reading.path}: "
            f"rebuild the mixture to restore it, or start a fresh iterator (no set_state)"
        )
    saved_names = [entry[0] for entry in saved["mixture"]]
    if saved_names != list(reading.names):
        return (
            f"this reader state was saved on a mixture of sources {saved_names}; this one has {list(reading.names)}: "
            f"rebuild the mixture with the saved sources, or start the epoch with a fresh iterator (no set_state)"
        )
    if [entry[1] for entry in saved["mixture"]] != list(reading.weights):
        return (
            f"this reader state was saved on a mixture with weights {_weights_of(saved)}; this one has "
            f"{reading.weights_text}: rebuild the dataset with the saved weights or start the epoch with a fresh "
            f"iterator (no set_state)"
        )
    if saved.get("epoch_rows") != reading.epoch_rows:
        return (
            f"this reader state was saved on a mixture with epoch_rows={saved.get('epoch_rows')}; this one has "
            f"epoch_rows={reading.epoch_rows}: rebuild it with the saved epoch_rows, or start a fresh iterator"
        )
    for (name, _, identity), source in zip(saved["mixture"], reading.sources, strict=True):
        if refused := union_refusal(identity, source):
            return f"source {name} of this mixture: {refused}"
    return f"this reader state was saved on another mixture ({saved!r:.200}); start a fresh iterator (no set_state)"


def weights_text(names: Sequence[str], weights: Sequence[float]) -> str:
    """``web=3,code=1``: how messages name a mixture's weights."""
    return ",".join(f"{name}={weight:g}" for name, weight in zip(names, weights, strict=True))


def _weights_of(identity: dict) -> str:
    return weights_text([entry[0] for entry in identity["mixture"]], [entry[1] for entry in identity["mixture"]])


def _not_mixture(identity: object) -> str:
    if isinstance(identity, dict) and "union" in identity:
        return f"a union of {len(identity['union'])} snapshots"
    if isinstance(identity, list) and len(identity) == 2:
        return f"snapshot {identity[0][:12]} (run {identity[1]})"
    return f"{identity!r:.100}"


@dataclasses.dataclass(frozen=True, eq=False)
class MixtureWindow:
    """A window of a mixture's epoch stream: ``pieces`` of every source (source after source), and for each of
    its batches how many rows of each source it takes (``quotas``); its row order is drawn from ``seed``."""

    pieces: tuple[Piece, ...]
    start: int
    rows: int
    seed: int | None  # None: unshuffled (sources still interleaved batch by batch, rows in stream order)
    quotas: np.ndarray  # batches of the window x sources
    #: Each source's rows of the window by pass: the rows of a pass are shuffled among themselves only, so
    #: a pass's rows all come before the next one's.
    passes: tuple[tuple[int, ...], ...]

    @property
    def stop(self) -> int:
        return self.start + self.rows

    def row_order(self) -> np.ndarray:
        """Positions within the window's loaded rows (source after source), in stream order: each batch takes
        its quota of each source's rows, drawn at random without replacement among that source's rows of the
        window, and the batch's rows are shuffled together (in stored order and source after source
        when unshuffled)."""
        batch_of_row = np.repeat(np.arange(len(self.quotas)), self.quotas.sum(axis=1))
        source_of_row = np.repeat(np.tile(np.arange(self.quotas.shape[1]), len(self.quotas)), self.quotas.ravel())
        if self.seed is None:
            loaded = np.arange(self.rows)
        else:
            rng = order.seeded_generator(self.seed, _WINDOW_ORDER)
            # Group + a random fraction, sorted: a random order within each group (a third of lexsort's time).
            source_of_row = source_of_row[np.argsort(batch_of_row + rng.random(self.rows))]  # mixed in each batch
            # The loaded rows, source after source and pass after pass, at random within each pass.
            lengths = [rows for passes in self.passes for rows in passes]
            loaded = np.argsort(np.repeat(np.arange(len(lengths)), lengths) + rng.random(self.rows))
        result = np.empty(self.rows, dtype=np.int64)
        result[np.argsort(source_of_row, kind="stable")] = loaded  # each source's stream slots, in order
        return result


@dataclasses.dataclass
class _PassStream:
    """One source's passes: pass ``p`` is all its pieces, permuted with ``(seed, p)``."""

    pieces: tuple[Piece, ...]
    seed: int | None  # None: every pass in stored order
    reshuffle: bool
    rows: int = 0
    _passes: dict[int, tuple[list[Piece], list[int]]] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rows = sum(piece.rows for piece in self.pieces)

    def _pass(self, number: int) -> tuple[list[Piece], list[int]]:
        if number not in self._passes:
            if len(self._passes) > 2:
                self._passes.pop(min(self._passes))
            pieces = list(self.pieces)
            if self.seed is not None:
                # Philox keyed by (source seed, pass): a third of a SeedSequence's cost, and a 64-source mixture
                # starts 64 passes an epoch.
                key = np.array([self.seed, number if self.reshuffle else 0], dtype=np.uint64)
                permutation = np.random.Generator(np.random.Philox(key=key)).permutation(len(pieces))
                pieces = [pieces[i] for i in permutation]
            self._passes[number] = pieces, list(itertools.accumulate((p.rows for p in pieces), initial=0))
        return self._passes[number]

    def cut(self, begin: int, end: int) -> tuple[list[Piece], tuple[int, ...]]:
        """Rows ``[begin, end)`` of the stream of passes, as pieces (pass after pass), and its rows in each pass."""
        selected: list[Piece] = []
        passes: list[int] = []
        while begin < end:
            number, offset = divmod(begin, self.rows)
            stop = min(end - begin + offset, self.rows)
            pieces, starts = self._pass(number)
            first = bisect.bisect_right(starts, offset) - 1
            for index in range(first, len(pieces)):
                lo, hi = max(offset, starts[index]), min(stop, starts[index + 1])
                if lo >= hi:
                    break
                piece = pieces[index]
                whole = hi - lo == piece.rows
                selected.append(
                    piece
                    if whole
                    else Piece(
                        piece.shard, piece.block, piece.start + lo - starts[index], piece.start + hi - starts[index]
                    )
                )
            passes.append(stop - offset)
            begin += stop - offset
        return selected, tuple(passes)


@dataclasses.dataclass
class MixtureOrder:
    """The windows of a mixture's epochs, what ``reader.core.window_loader`` loads (like an ``EpochOrder``)."""

    mixture: Mixture
    plan: MixturePlan
    batches_per_window: int
    seed: int
    shuffle: bool = True
    reshuffle_each_epoch: bool = True
    _computed: dict[int, list[MixtureWindow]] = dataclasses.field(default_factory=dict, init=False, repr=False)

    def __post_init__(self) -> None:
        self._streams = [
            _PassStream(
                pieces,
                int(order.seeded_generator(self.seed, _SOURCE_SEED, index).integers(0, 2**63 - 1))
                if self.shuffle
                else None,
                self.reshuffle_each_epoch,
            )
            for index, pieces in enumerate(self.mixture.source_pieces)
        ]
        self._window_quotas = self.plan.window_quotas(self.batches_per_window)
        self._window_first = np.vstack(
            [np.zeros((1, len(self._streams)), np.int64), np.cumsum(self._window_quotas, axis=0)[:-1]]
        )

    def windows(self, epoch: int) -> list[MixtureWindow]:
        """The epoch's windows, in stream order."""
        if epoch in self._computed:
            return self._computed[epoch]
        epoch_seed = (
            order.epoch_seed(self.seed, epoch, reshuffle_each_epoch=True) if self.shuffle else None
        )  # the rows differ from epoch to epoch, so their order does too
        windows, start, k = [], 0, self.batches_per_window
        batch_quotas = self.plan.batch_quotas
        for index, (quotas, first) in enumerate(zip(self._window_quotas, self._window_first, strict=True)):
            pieces: list[Piece] = []
            passes: list[tuple[int, ...]] = []
            for source, stream in enumerate(self._streams):
                begin = self.plan.source_start(source, epoch) + int(first[source])
                source_pieces, source_passes = stream.cut(begin, begin + int(quotas[source]))
                pieces += source_pieces
                passes.append(source_passes)
            rows = int(quotas.sum())
            seed = None if epoch_seed is None else int(order.seeded_generator(epoch_seed, index).integers(0, 2**63 - 1))
            window_quotas = batch_quotas[index * k : (index + 1) * k]
            windows.append(MixtureWindow(tuple(pieces), start, rows, seed, window_quotas, tuple(passes)))
            start += rows
        self._computed[epoch] = windows
        while len(self._computed) > 3:
            self._computed.pop(max(self._computed, key=lambda kept: abs(kept - epoch)))
        return windows
