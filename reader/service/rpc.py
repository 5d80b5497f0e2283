"""The dispatcher's gRPC surface: method names, (de)serializers, a client stub and servicer wiring.

Built with grpc's generic handlers over the protobuf messages of
``schemas/service.proto``, so no generated ``_pb2_grpc`` module is needed.
"""

from __future__ import annotations

import grpc

from schemas import service_pb2 as pb

SERVICE = "snapfeed.service.Dispatcher"
#: method -> (request type, reply type)
METHODS = {
    "Heartbeat": (pb.WorkerHeartbeat, pb.Empty),
    "GetJob": (pb.JobRequest, pb.JobReply),
    "LeaseSplit": (pb.LeaseRequest, pb.LeaseReply),
    "Renew": (pb.LeaseRequest, pb.Empty),
    "AckSplit": (pb.AckRequest, pb.Empty),
    "StreamsRead": (pb.LeaseRequest, pb.Empty),  # parallel_epochs: a consumer read every stream of its epoch
    "Status": (pb.Empty, pb.StatusReply),
}


def handlers(servicer) -> grpc.GenericRpcHandler:
    """Routes each method to ``servicer.<Method>(request, context)``."""
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(
                getattr(servicer, name),
                request_deserializer=request.FromString,
                response_serializer=reply.SerializeToString,
            )
            for name, (request, reply) in METHODS.items()
        },
    )


class DispatcherStub:
    """Client side: ``stub.GetJob(request, timeout=...)`` etc."""

    def __init__(self, channel: grpc.Channel) -> None:
        for name, (request, reply) in METHODS.items():
            setattr(
                self,
                name,
                channel.unary_unary(
                    f"/{SERVICE}/{name}",
                    request_serializer=request.SerializeToString,
                    response_deserializer=reply.FromString,
                ),
            )


def described(exc: grpc.RpcError) -> str:
    """A failed call as one line, ``CODE: details`` (its ``str`` is a multi-line debug dump)."""
    return f"{exc.code().name}: {exc.details()}"
