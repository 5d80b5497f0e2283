"""A Prometheus registry served over HTTP: the reader service's ``--metrics_port`` and a dataset's ``metrics=<port>``.

One place turns a port that cannot be listened on into one usage line (the
flag or argument named as the user wrote it), and knows the port actually
bound (port 0 picks a free one). ``prometheus_client`` serves the standard
text format on a daemon thread.
"""

from __future__ import annotations

import prometheus_client
from prometheus_client.registry import CollectorRegistry

from schemas.errors import UsageError


class MetricsEndpoint:
    """``registry`` served at ``target`` (``http://host:port/metrics``) on a daemon thread until ``close()``."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, given: str) -> None:
        """``given``: how the user asked for it (``--metrics_port=9100``, ``metrics='127.0.0.1:9100'``)."""
        try:
            self._server, self._thread = prometheus_client.start_http_server(port, addr=host, registry=registry)
        except OSError as exc:
            raise UsageError(
                f"{given}: cannot serve metrics on {host}:{port} ({exc.strerror or exc}); give a free port (0: any)"
            ) from None
        self.address = f"{host}:{self._server.server_port}"
        self.target = f"http://{self.address}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
