"""How the reader service's processes serve and open connections: plaintext, or TLS from PEM files.

Addresses are always ``grpc://host:port``; TLS is a property of the whole
deployment, not of an address. Servers started with a certificate and key
(``--tls_cert``/``--tls_key``) serve TLS only; clients opt in by naming the CA
that signed them (``ServiceOptions(tls_ca=)``, ``--dispatcher_tls_ca``, ``--tls_ca``).
So the dispatcher and every worker must agree: all TLS or all plaintext.

A client whose TLS setting does not match the server's would otherwise see
UNAVAILABLE, which consumers retry for a minute (a restarting dispatcher looks
the same). Dispatcher channels therefore probe the server once a call fails
UNAVAILABLE and turn a mismatch into an immediate ``UsageError`` saying what to
change.
"""

from __future__ import annotations

import socket
import ssl
from dataclasses import dataclass

import grpc
import pyarrow.flight as flight

from schemas.errors import UsageError

PROBE_SECONDS = 2.0


def read_ca(path: str | None, option: str) -> bytes | None:
    """The PEM CA certificate(s) in ``path`` (None: plaintext), checked so a bad file fails here, not per call."""
    if not path:
        return None
    try:
        with open(path, "rb") as handle:
            pem = handle.read()
        ssl.create_default_context(cadata=pem.decode("ascii", "replace"))
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise UsageError(f"{option}={path}: not a readable PEM CA certificate ({exc})") from exc
    return pem


@dataclass(frozen=True)
class ServerTls:
    """A server's PEM certificate chain and private key."""

    cert: bytes
    key: bytes

    @classmethod
    def load(cls, cert_path: str | None, key_path: str | None) -> ServerTls | None:
        """Both files (``ServerSecurity`` refuses one alone) or neither (plaintext); the pair is checked to match
        before any port is bound."""
        if not cert_path:
            return None
        try:
            # A callable password makes an encrypted key fail instead of prompting on the terminal.
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert_path, key_path, lambda: b"")
            with open(cert_path, "rb") as cert, open(key_path, "rb") as key:
                return cls(cert=cert.read(), key=key.read())
        except OSError as exc:  # ssl.SSLError is an OSError
            raise UsageError(
                f"--tls_cert={cert_path} --tls_key={key_path}: not a readable PEM certificate and its "
                f"unencrypted private key ({exc})"
            ) from exc


def add_port(server: grpc.Server, host: str, port: int, tls: ServerTls | None) -> int:
    """Binds ``host:port`` (TLS only, when ``tls``) and returns the port (the chosen one for port 0)."""
    address = f"{host}:{port}"
    if tls is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, grpc.ssl_server_credentials([(tls.key, tls.cert)]))
    if bound == 0:
        raise UsageError(f"cannot listen on {address} (in use?)")
    return bound


def flight_server_options(host: str, port: int, tls: ServerTls | None) -> dict:
    """``FlightServerBase`` keyword arguments: its location and, with TLS, its certificate."""
    if tls is None:
        return {"location": f"grpc://{host}:{port}"}
    return {"location": f"grpc+tls://{host}:{port}", "tls_certificates": [(tls.cert, tls.key)]}


def flight_client(worker: str, tls_ca: bytes | None) -> flight.FlightClient:
    """A Flight connection to ``grpc://host:port``, over TLS verified against ``tls_ca`` when given."""
    if tls_ca is None:
        return flight.connect(worker)
    return flight.connect(f"grpc+tls://{worker.removeprefix('grpc://')}", tls_root_certs=tls_ca)


def dispatcher_channel(address: str, tls_ca: bytes | None, ca_option: str = "tls_ca") -> grpc.Channel:
    """A channel to the dispatcher at ``host:port``; a TLS mismatch fails fast naming ``ca_option``."""
    address = address.removeprefix("grpc://")
    if tls_ca is None:
        channel = grpc.insecure_channel(address)
    else:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=tls_ca))
    return grpc.intercept_channel(channel, _MismatchCheck(address, tls_ca, ca_option))


class _MismatchCheck(grpc.UnaryUnaryClientInterceptor):
    """Raises ``UsageError`` for a call that failed UNAVAILABLE because client and server disagree on TLS."""

    def __init__(self, address: str, tls_ca: bytes | None, ca_option: str) -> None:
        self._address = address
        self._tls_ca = tls_ca
        self._ca_option = ca_option

    def intercept_unary_unary(self, continuation, client_call_details, request):
        outcome = continuation(client_call_details, request)
        if outcome.code() == grpc.StatusCode.UNAVAILABLE:
            problem = tls_mismatch(self._address, self._tls_ca, self._ca_option)
            if problem:
                raise UsageError(problem)
        return outcome


def tls_mismatch(address: str, tls_ca: bytes | None, ca_option: str) -> str | None:
    """What is wrong with this client's TLS setting for the server at ``host:port``, or None.

    None also when nothing listens there: that is an outage (or a restart), not a setting.
    """
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    try:
        raw = socket.create_connection((host, int(port)), timeout=PROBE_SECONDS)
    except OSError:
        return None
    with raw:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        if tls_ca is None:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context.load_verify_locations(cadata=tls_ca.decode("ascii", "replace"))
        context.set_alpn_protocols(["h2"])
        try:
            context.wrap_socket(raw, server_hostname=host).close()
        except ssl.SSLCertVerificationError as exc:
            return (
                f"grpc://{address} serves TLS with a certificate that {ca_option} does not verify: {exc.verify_message}"
            )
        except OSError:
            if tls_ca is None:
                return None  # plaintext on both sides; the failure is something else
            return f"grpc://{address} does not serve TLS; drop {ca_option}, or start it with --tls_cert/--tls_key"
    if tls_ca is None:
        return f"grpc://{address} serves TLS; pass {ca_option}=<the CA certificate (PEM) that signed its --tls_cert>"
    return None
