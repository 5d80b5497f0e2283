"""``ServiceOptions``: where a consumer finds the reader service and how it reads from it.

Plain data, checked on construction and free of gRPC, so ``import reader``
can export it and a wrong address or mode is one line before anything
connects; ``reader.service.client.ServiceConnection`` is what uses it.
"""

from __future__ import annotations

import dataclasses

from reader.service.protocol import DISTRIBUTED, PROCESSING_MODES
from schemas.errors import UsageError

#: How long a consumer keeps retrying an unreachable dispatcher or workers it has reached before (a
#: dispatcher restarted with --work_dir resumes the job) by default.
DEFAULT_TIMEOUT_SECONDS = 60.0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceOptions:
    """A reader service to read from (docs/service.md); ``service="grpc://host:port"`` is ``ServiceOptions(address=...)``.

    Args:
        address: the dispatcher, ``grpc://host:port``.
        processing_mode: ``"distributed_epoch"`` (every row once per epoch across the job's consumers) or
            ``"parallel_epochs"`` (each consumer gets every worker's whole shuffled stream).
        job_name: consumers giving the same name share one job (and so one epoch's rows); None: a job of its own.
        auth_token: the bearer token the servers were started with (``--auth_token``).
        tls_ca: a PEM file, the CA that signed a TLS service's certificates; None: plaintext.
        timeout_seconds: how long an unreachable dispatcher or workers are retried (with a warning logged)
            before ``ServiceUnavailableError``; a dispatcher never reached fails within 5 s.
    """

    address: str
    processing_mode: str = DISTRIBUTED
    job_name: str | None = None
    auth_token: str | None = None
    tls_ca: str | None = None
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS

    def __post_init__(self) -> None:
        if not isinstance(self.address, str) or not self.address.startswith("grpc://"):
            raise UsageError(f"service address {self.address!r}: give the dispatcher as grpc://host:port")
        if self.processing_mode not in PROCESSING_MODES:
            raise UsageError(f"processing_mode={self.processing_mode!r}; choose one of {', '.join(PROCESSING_MODES)}")
        if self.job_name is not None and (not isinstance(self.job_name, str) or not self.job_name):
            raise UsageError(f"job_name={self.job_name!r}; give a non-empty string, or None for a job of its own")
        timeout = self.timeout_seconds
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not timeout > 0:
            raise UsageError(f"timeout_seconds={timeout!r}; give a positive number of seconds")

    @classmethod
    def coerce(cls, service: ServiceOptions | str) -> ServiceOptions:
        """``service=`` as options: a ``grpc://`` address is the dispatcher, with every other option at its default."""
        if isinstance(service, cls):
            return service
        if isinstance(service, str):
            return cls(address=service)
        raise UsageError(f"service={service!r}; give 'grpc://host:port' or a reader.ServiceOptions(address=...)")
