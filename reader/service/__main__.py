"""``python -m reader.service dispatcher|worker|status``: run the reader service's processes.

SIGTERM (and Ctrl-C) drain: health goes NOT_SERVING, in-flight calls finish, exit 0.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys

import grpc

from reader.service.auth import read_token_file
from reader.service.dispatcher import DispatchServer
from reader.service.rpc import DispatcherStub
from reader.service.worker import WorkerServer
from schemas.errors import SnapfeedError
from schemas.service_pb2 import Empty


def _roots(text: str | None) -> list[str]:
    return [root for root in (text or "").split(",") if root]


def _serve(server) -> int:
    def drain(signum, frame):
        server.stop()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    server.start()
    print(f"serving on {server.target}", flush=True)
    server.join()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m reader.service", description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    dispatcher = sub.add_parser("dispatcher", help="run the dispatcher")
    dispatcher.add_argument("--port", type=int, default=5050)
    dispatcher.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    dispatcher.add_argument("--work_dir", default=None, help="journal jobs/leases here so a restart resumes them")
    dispatcher.add_argument("--allowed_roots", default=None, help="comma-separated snapshot roots clients may name")
    dispatcher.add_argument("--lease_seconds", type=float, default=30.0)
    dispatcher.add_argument("--auth_token_file", default=None, help="require this shared token on every RPC")
    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT or grpc://HOST:PORT")
    worker.add_argument("--port", type=int, default=0)
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument("--allowed_roots", default=None, help="comma-separated roots this worker reads from")
    worker.add_argument("--auth_token_file", default=None, help="require this shared token on every stream")
    status = sub.add_parser("status", help="workers, jobs, splits done/leased/pending, consumers")
    status.add_argument("--dispatcher", required=True)
    args = parser.parse_args(argv)
    try:
        if args.role == "dispatcher":
            return _serve(
                DispatchServer(
                    args.port,
                    args.work_dir,
                    host=args.host,
                    allowed_roots=_roots(args.allowed_roots),
                    lease_seconds=args.lease_seconds,
                    auth_token=read_token_file(args.auth_token_file),
                )
            )
        if args.role == "worker":
            return _serve(
                WorkerServer(args.dispatcher, args.port, host=args.host, allowed_roots=_roots(args.allowed_roots))
            )
        with grpc.insecure_channel(args.dispatcher.removeprefix("grpc://")) as channel:
            reply = DispatcherStub(channel).Status(Empty(), timeout=10)
        print(json.dumps(json.loads(reply.json), indent=1))
        return 0
    except grpc.RpcError as exc:
        print(f"error: the dispatcher at {args.dispatcher} is unreachable: {exc.details()}", file=sys.stderr)
        return 1
    except SnapfeedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
