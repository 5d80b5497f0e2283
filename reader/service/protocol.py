"""The names the reader service's servers and its consumer share, apart from either (as tf.data service's
``common.h``): the processing modes, the format a worker's stream declares, how a replaced run is refused, and
how a union of snapshots travels.

The consumer (``reader.service.client``) imports these instead of reaching into
the dispatcher's state machine or the workers' run cache.
"""

from __future__ import annotations

from collections.abc import Iterable

from schemas.errors import SnapshotNotFoundError

#: Processing modes (seed 002): every element once per epoch across the job's consumers, or every
#: worker's whole shuffled stream to each consumer.
DISTRIBUTED, PARALLEL = "distributed_epoch", "parallel_epochs"
PROCESSING_MODES = (DISTRIBUTED, PARALLEL)

#: Schema metadata of a worker's stream saying how it sends rows: in delivery order, cut where the
#: consumer cuts its batches, splits of ``splits.BLOCKS_PER_SPLIT`` blocks (/3: 32, /2: 16). A worker that sends
#: rows any other way (an older version sent blocks as stored, or split the job's blocks differently) lacks it, and
#: the consumer refuses its stream rather than deliver other rows than the split it leased.
STREAM_FORMAT = {b"snapfeed.stream": b"delivery-order/3"}

#: The Flight action a worker answers with the dispatcher address it was given, so a consumer pointed at a
#: worker's port instead of the dispatcher's can say which address to use.
DISPATCHER_ACTION = "snapfeed.dispatcher"

#: A consumer without a ``job_name`` gets a job of its own, named this prefix and a random suffix; metrics add
#: such jobs up under the bare word, so unnamed datasets do not each make new series.
ANONYMOUS_JOB = "anonymous"

#: Flight ``extra_info`` of a worker's refusal of a replaced run, so the consumer can tell it apart.
REPLACED_RUN = b"snapfeed:replaced-run"


class ReplacedRunError(SnapshotNotFoundError):
    """The run a consumer planned from is no longer its snapshot's run, and the server does not hold it."""


#: A union of snapshots (``reader.core.union``) travels in the one-snapshot fields (a ``JobRequest``'s
#: ``snapshot`` and ``run_id``, a ticket's) as its members' folders and runs, a line each, in the union's order: one
#: snapshot is sent as before, and a server that predates unions refuses a union as a folder it cannot find.
MEMBER_SEPARATOR = "\n"


def joined(values: Iterable[str]) -> str:
    """The members' folders (or runs) in one field."""
    return MEMBER_SEPARATOR.join(values)


def members(field: str) -> list[str]:
    """The members' folders (or runs) a field sent: one, unless a union was sent."""
    return field.split(MEMBER_SEPARATOR)
