"""Where a consumer stands in an epoch (``Cursor``): what a service iterator's ``get_state`` saves.

Rows delivered per source and the next assignment to ask for, so a restored
consumer repeats and skips nothing; the same for both processing modes (a
source is a split's assignment index in distributed_epoch, a worker's address
in parallel_epochs).
"""

from __future__ import annotations

import dataclasses
import uuid

from reader.service.delivery import Delivered


@dataclasses.dataclass
class Cursor:
    """Where a consumer is in an epoch: what ``get_state`` saves.

    ``held``: source -> rows delivered, for every source not finished yet (a
    split's assignment index, or a worker address in parallel_epochs).
    ``next_index``: the next assignment to ask the dispatcher for.
    """

    epoch: int
    consumer: str
    next_index: int = 0
    held: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def fresh(cls, epoch: int, job_name: str) -> Cursor:
        return cls(epoch, f"{job_name}/{uuid.uuid4().hex[:12]}")

    def deliver(self, delivered: Delivered) -> None:
        for source, rows in delivered:
            self.held[source] = self.held.get(source, 0) + rows
