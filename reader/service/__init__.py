"""The reader service (DESIGN §5). In progress: the dispatcher's pure state machine is here;
the gRPC servicers, servers and client are not written yet (see the issue notes)."""

from reader.service.dispatch_state import DispatchState, Lease

__all__ = ["DispatchState", "Lease"]
