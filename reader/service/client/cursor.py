"""Where a consumer stands in an epoch (``Cursor``): what a service iterator's ``get_state`` saves.

Rows delivered per source, the next assignment to ask for and the epoch's
step, so a restored consumer repeats and skips nothing; the same for both
processing modes (a source is a split's assignment index in distributed_epoch,
a worker's address in parallel_epochs). A consumer is one id for the life of
its iterator, every epoch: the dispatcher tells one still reading from one
gone by it (``reader.service.rollback``).
"""

from __future__ import annotations

import dataclasses
import uuid

from reader.service.delivery import Delivered
from schemas.service_pb2 import Rollback


@dataclasses.dataclass
class Cursor:
    """Where a consumer is in an epoch: what ``get_state`` saves.

    ``held``: source -> rows delivered, for every source not finished yet (a
    split's assignment index, or a worker address in parallel_epochs).
    ``next_index``: the next assignment to ask the dispatcher for.
    ``step``: steps of the epoch delivered (a restored consumer starts at its state's).
    ``restoring``: a restored distributed_epoch consumer's, until its first job
    request took the job back to the state it restores (which ``get_state``
    returns until then).
    """

    epoch: int
    consumer: str
    next_index: int = 0
    held: dict = dataclasses.field(default_factory=dict)
    step: int = 0
    restoring: Restoring | None = None

    def deliver(self, delivered: Delivered) -> None:
        for source, rows in delivered:
            self.held[source] = self.held.get(source, 0) + rows


@dataclasses.dataclass(frozen=True)
class Restoring:
    """A distributed_epoch state being restored: the state, and the ``Rollback`` its job request carries."""

    state: dict
    rollback: Rollback

    @classmethod
    def of(cls, state: dict) -> Restoring:
        held = {int(index): int(rows) for index, rows in state["held"]}
        rollback = Rollback(consumer=state["consumer"], next_index=int(state["next_index"]), held=held)
        if state.get("step") is not None:  # states saved before steps were recorded take back their consumer only
            rollback.step = int(state["step"])
        return cls(state, rollback)


def new_consumer(job_name: str) -> str:
    """A consumer id of the job: one per iterator."""
    return f"{job_name}/{uuid.uuid4().hex[:12]}"
