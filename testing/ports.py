"""Free TCP ports on 127.0.0.1, for the servers the benches and the tests start on this machine."""

from __future__ import annotations

import socket


def free_ports(count: int) -> list[int]:
    """``count`` ports free on 127.0.0.1 now (all held open while choosing, so they differ)."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def free_port() -> int:
    """One port free on 127.0.0.1 now."""
    (port,) = free_ports(1)
    return port
