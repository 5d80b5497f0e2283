"""The reader service (docs/architecture.md §5): a dispatcher (gRPC) leasing splits, workers (Arrow Flight) streaming them.

Layers: ``dispatch_state`` (pure state machine) -> ``dispatcher``/``worker``
(servicers and in-process servers, port 0 by default); the names both sides
share are in ``protocol``, ``splits`` and ``delivery``, the wire in ``rpc``,
``transport`` and ``auth``. The consumer behind
``reader.distributed_dataset(service=...)`` is ``reader.service.client``.

The servers are imported when first named here, so a trainer that imports the
consumer (which imports this package) never loads the dispatcher or the workers.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "DispatchServer": "reader.service.dispatcher",
    "DispatcherConfig": "reader.service.config",
    "ServerSecurity": "reader.service.config",
    "WorkerConfig": "reader.service.config",
    "DispatchState": "reader.service.dispatch_state",
    "Lease": "reader.service.dispatch_state",
    "WorkerServer": "reader.service.worker",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_EXPORTS[name]), name)
