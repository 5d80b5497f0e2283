"""Taking a distributed_epoch job back to a restored consumer's state (pure: no gRPC, no clock, no I/O).

Exactly once across a restart is measured against the checkpoint: rows a
trainer was handed before its state was saved are not delivered again; rows
handed out after it were lost with the trainer's progress, so they are
delivered again; every other row once. The dispatcher has already counted the
splits delivered after the save as done, so a restore takes the job back:

- the consumer that saved the state (``Restore.consumer``), exactly, by where
  its state says it stood (``by_cursor``);
- the job's other consumers that are gone (silent for a lease term, and not
  heard from since the restore was asked for), by the state's step: in synchronous training every input pipeline is at the
  same step, so the chief's state says how far each of them was, ``(step -
  its start step) x its rows per step`` rows of its assignments in order
  (``by_steps``). Later epochs of the job those consumers reached are taken
  back whole. Consumers still reading (asynchronous ones, or the restored
  trainer's own) keep their splits.

A split delivered up to the checkpoint stays done; one partly delivered is
pending again from the rows delivered (its next lease says where to start);
the rest are pending. Taking back is idempotent, so every consumer of a
restarted trainer may restore the same state, in any number.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable

from schemas.errors import SnapfeedError


@dataclasses.dataclass(frozen=True)
class Restore:
    """A distributed_epoch state being restored: its consumer, where that one stood, and its step (None: a state
    saved before steps were recorded, which takes back its own consumer only)."""

    consumer: str
    next_index: int
    held: dict[int, int]
    step: int | None


class RollbackWait(SnapfeedError):
    """A consumer of the job was heard from too recently to be presumed gone, too long ago to be reading:
    the restore is to be asked again shortly (the servicer answers UNAVAILABLE, which consumers retry)."""


def liveness(heard: float, asked: float, now: float, lease_seconds: float) -> str:
    """A consumer last heard from at ``heard``, for a restore first asked for at ``asked``: "live" (it called
    since: it is reading), "gone" (silent for a whole lease term: its leases lapsed, it renews no more) or
    "unknown" (the restore waits: a consumer reading renews every quarter of a term)."""
    if heard > asked:
        return "live"
    return "gone" if now - heard > lease_seconds else "unknown"


def by_cursor(assigned: list[int], starts: dict[int, int], rows: Callable[[int], int], restore: Restore):
    """(split, rows of it delivered up to the state) for each assignment of the state's own consumer."""
    for index, split in enumerate(assigned):
        if index in restore.held:
            yield split, restore.held[index]
        elif index < restore.next_index:
            yield split, rows(split)
        else:
            yield split, starts.get(split, 0)


def by_steps(assigned: list[int], starts: dict[int, int], rows: Callable[[int], int], budget: int):
    """(split, rows of it delivered) for a consumer that delivered ``budget`` rows of its assignments, in order."""
    for split in assigned:
        start = starts.get(split, 0)
        taken = min(max(0, rows(split) - start), budget)
        budget -= taken
        yield split, start + taken


def step_budget(step: int, start_step: int, batch_rows: int) -> int:
    """Rows a consumer that started at ``start_step`` delivered by ``step`` (every step but an epoch's last is full)."""
    return max(0, step - start_step) * batch_rows


def changes(
    delivered: Iterable[tuple[str, int, int]],
    holder: Callable[[int], str],
    current: Callable[[int], tuple[str, str, int]],
    rows: Callable[[int], int],
) -> tuple[list, list]:
    """The splits to mark done and to reopen: ``delivered`` is (consumer, split, rows delivered up to the
    checkpoint); only splits that consumer holds (its latest assignment, not leased to another) change.

    ``current(split)``: (state, consumer, offset) now. Returns ``done`` [[split, consumer]] and ``reopened``
    [[split, offset]], leaving out what is already so (a second restore of the same state changes nothing).
    """
    done, reopened = [], []
    for consumer, split, covered in delivered:
        state, owner, offset = current(split)
        if holder(split) != consumer or owner not in ("", consumer):
            continue
        if covered >= rows(split):
            if state != "done":
                done.append([split, consumer])
        elif state != "pending" or offset != covered:
            reopened.append([split, covered])
    return done, reopened
