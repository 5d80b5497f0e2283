"""The names the reader service's servers and its consumer share, apart from either (as tf.data service's
``common.h``): the processing modes, the format a worker's stream declares, and how a replaced run is refused.

The consumer (``reader.service.client``) imports these instead of reaching into
the dispatcher's state machine or the workers' run cache.
"""

from __future__ import annotations

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
