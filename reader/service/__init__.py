"""The reader service (docs/architecture.md §5): a dispatcher (gRPC) leasing splits, workers (Arrow Flight) streaming them.

Layers: ``dispatch_state`` (pure state machine) -> ``dispatcher``/``worker``
(servicers and in-process servers, port 0 by default) -> ``client`` (behind
``reader.distributed_dataset(service=...)``).
"""

from reader.service.dispatch_state import DispatchState, Lease
from reader.service.dispatcher import DispatchServer
from reader.service.worker import WorkerServer

__all__ = ["DispatchServer", "DispatchState", "Lease", "WorkerServer"]
