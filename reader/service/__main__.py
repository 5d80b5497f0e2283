"""``python -m reader.service dispatcher|worker|status``: run the reader service's processes.

Each server prints ``serving on grpc://HOST:PORT`` then ``health on grpc://HOST:PORT``
(gRPC health checking; a worker's is a second port, ``--health_port``), and with
``--metrics_port`` ``metrics on http://HOST:PORT/metrics`` (Prometheus; off by default).
SIGTERM (and Ctrl-C) drain: a worker leaves the dispatcher's live workers, health goes NOT_SERVING,
in-flight calls finish (a worker waits at most ``--drain_seconds`` for its streams), exit 0.
A worker the dispatcher refuses (wrong ``--auth_token_file``, TLS mismatch) exits 2 saying why.
TLS is all or nothing: give the dispatcher and every worker ``--tls_cert``/``--tls_key``, and
workers, ``status`` and consumers the CA that signed them.
Errors end in one ``error:`` line with the error's exit code (1, or 2 for a usage error).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys

import grpc

from reader.core.options import AUTO, CacheOptions
from reader.service import transport
from reader.service.auth import bearer, read_token_file
from reader.service.config import DRAIN_SECONDS, DispatcherConfig, ServerSecurity, WorkerConfig
from reader.service.dispatcher import DispatchServer
from reader.service.rpc import DispatcherStub, described
from reader.service.worker import WorkerServer
from schemas import command
from schemas.errors import EXIT_OK, ServiceUnavailableError, SnapfeedError, UsageError
from schemas.service_pb2 import Empty


def config_from_flags(kind: type, args: argparse.Namespace):
    """A ``DispatcherConfig`` or ``WorkerConfig`` from the flags, which are named as its fields; the fields no flag
    spells as such are made here: the security both servers share, a worker's cache and its dispatcher."""
    made = {
        "security": ServerSecurity(
            auth_token=read_token_file(args.auth_token_file), tls_cert=args.tls_cert, tls_key=args.tls_key
        ),
        "allowed_roots": args.allowed_roots or (),
    }
    if kind is WorkerConfig:
        made["dispatcher_address"] = args.dispatcher
        made["cache"] = CacheOptions(
            dir=args.cache_dir, max_bytes=AUTO if args.cache_bytes is None else args.cache_bytes
        )
    flagged = {field.name: getattr(args, field.name) for field in dataclasses.fields(kind) if hasattr(args, field.name)}
    return kind(**(flagged | made))


def _serve(server) -> int:
    def drain(signum, frame):
        server.stop()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    server.start()
    print(f"serving on {server.target}\nhealth on {server.health_target}", flush=True)
    if server.metrics_target:
        print(f"metrics on {server.metrics_target}", flush=True)
    server.join()
    return EXIT_OK


def _add_tls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tls_cert", default=None, help="PEM certificate (chain): serve TLS only (with --tls_key)")
    parser.add_argument("--tls_key", default=None, help="PEM private key of --tls_cert (unencrypted)")


def _add_metrics(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--metrics_port",
        type=int,
        default=None,
        help="serve Prometheus metrics over HTTP on this port at --host (0: any free port; default: off)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = command.ArgumentParser(prog="python -m reader.service", description=__doc__)
    sub = parser.add_subparsers(dest="role", required=True)
    dispatcher = sub.add_parser("dispatcher", help="run the dispatcher")
    dispatcher.add_argument("--port", type=int, default=5050)
    dispatcher.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 for all)")
    dispatcher.add_argument("--work_dir", default=None, help="journal jobs/leases here so a restart resumes them")
    dispatcher.add_argument(
        "--allowed_roots",
        default=None,
        help="comma-separated snapshot roots clients may name: local folders or URI prefixes such as "
        "gs://bucket/snapshots or s3://bucket (default: any snapshot)",
    )
    dispatcher.add_argument("--lease_seconds", type=float, default=30.0)
    dispatcher.add_argument("--auth_token_file", default=None, help="require this shared token on every RPC")
    _add_tls(dispatcher)
    _add_metrics(dispatcher)
    worker = sub.add_parser("worker", help="run a worker")
    worker.add_argument("--dispatcher", required=True, help="HOST:PORT or grpc://HOST:PORT")
    worker.add_argument("--port", type=int, default=0)
    worker.add_argument("--host", default="127.0.0.1")
    worker.add_argument(
        "--allowed_roots",
        default=None,
        help="comma-separated snapshot roots this worker reads from: local folders or URI prefixes such as "
        "gs://bucket/snapshots or s3://bucket (default: any snapshot)",
    )
    worker.add_argument(
        "--auth_token_file", default=None, help="require this token on every stream; also sent to the dispatcher"
    )
    worker.add_argument("--health_port", type=int, default=0, help="gRPC health checking port (0: any free port)")
    worker.add_argument(
        "--drain_seconds",
        type=float,
        default=DRAIN_SECONDS,
        help="on SIGTERM, how long to wait for the streams in flight before exiting without them",
    )
    worker.add_argument(
        "--cache_dir",
        default=None,
        help="keep shards of bucket snapshots on this local disk for later epochs, shared with the host's other "
        "readers ('auto': $SNAPFEED_CACHE_DIR or ~/.cache/snapfeed; docs/reading.md)",
    )
    worker.add_argument(
        "--cache_bytes", type=int, default=None, help="the cache's budget in bytes (default: 64 GiB or half the free)"
    )
    _add_tls(worker)
    _add_metrics(worker)
    worker.add_argument("--dispatcher_tls_ca", default=None, help="PEM CA that signed a TLS dispatcher's certificate")
    status = sub.add_parser("status", help="workers, jobs, splits done/leased/pending, consumers")
    status.add_argument("--dispatcher", required=True)
    status.add_argument("--auth_token_file", default=None, help="the dispatcher's shared token")
    status.add_argument("--tls_ca", default=None, help="PEM CA that signed a TLS dispatcher's certificate")
    for role in (dispatcher, worker, status):
        role.add_argument(command.VERBOSE_FLAG, action="store_true", help=command.VERBOSE_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    return command.run("service", lambda: _run(build_parser().parse_args(argv)), argv)


def _run(args: argparse.Namespace) -> int:
    try:
        if args.role == "dispatcher":
            return _serve(DispatchServer(config_from_flags(DispatcherConfig, args)))
        if args.role == "worker":
            worker = WorkerServer(config_from_flags(WorkerConfig, args))
            _serve(worker)
            if worker.failure:
                raise UsageError(worker.failure)
            if worker.abandoned_streams:  # the interpreter's exit would wait for them
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_OK)
            return EXIT_OK
        token = read_token_file(args.auth_token_file)
        with transport.dispatcher_channel(
            args.dispatcher, transport.read_ca(args.tls_ca, "--tls_ca"), "--tls_ca"
        ) as channel:
            reply = DispatcherStub(channel).Status(Empty(), timeout=10, metadata=bearer(token))
        print(json.dumps(json.loads(reply.json), indent=1))
        return EXIT_OK
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNAVAILABLE:
            raise ServiceUnavailableError(
                f"the dispatcher at {args.dispatcher} is unreachable: {exc.details()}. Check the address and that "
                f"it is running."
            ) from exc
        raise SnapfeedError(f"the dispatcher at {args.dispatcher} answered {described(exc)}") from exc


if __name__ == "__main__":
    sys.exit(main())
