"""A reverse HTTP/1.1 proxy on 127.0.0.1 that adds latency and loses responses, for tests and benchmarks.

It sits in front of one local server (an object-store emulator from
``testing.object_stores``)::

    with s3_server() as s3, http_proxy(s3.endpoint, delay_s=0.02) as proxy:
        env = s3.env_via(proxy.endpoint)  # clients now talk to the proxy
        proxy.drop_response(lambda method, target, headers: method == "PUT" and "/_commit" in target)

Two knobs:

* ``delay_s`` / ``set_delay``: every request waits this long before it is
  forwarded, a round-trip delay (this machine's kernel has no ``tc netem``).
* ``drop_response(predicate, times=1)``: a request for which
  ``predicate(method, target, headers)`` is true (``target`` is the path and
  query as sent, ``headers`` a dict of lower-cased names) is forwarded and
  the server's whole response read, then the client's connection is closed
  without a byte of it: the server applied the request but the client saw a
  connection error, so it retries (at most ``times`` such requests).

It counts the requests it sees by method, and the bytes their ``Range``
headers ask for (``stats()``): what a reader downloaded, less responses'
framing and whole-object reads.

The proxy runs in a child process (``python -m testing.http_proxy TARGET``), driven
over its stdin/stdout: clients in this process that hold the GIL while they wait
on the network (pyarrow's GCS reads do) would otherwise deadlock against a proxy
thread, and a busy client would slow it. So a predicate is sent to it with
cloudpickle: a lambda or closure is fine, its captured values are copies, and
what it prints goes to stderr. A predicate that raises counts as not matching
and makes the ``http_proxy`` block raise at its end. The child exits when this
process does.

Each client connection has its own connection to the server (keep-alive on
both sides). Bodies are streamed with Content-Length or chunked framing (passed
through as is) in 1 MiB socket-level copies; ``Expect: 100-continue`` is answered
by the proxy itself. A ``Location`` response header that points at the server
(fake-gcs-server's resumable-upload sessions) is rewritten to point at the proxy.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pathlib
import pickle
import select
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback
import urllib.parse
from collections.abc import Callable, Iterator, Mapping
from typing import Any, BinaryIO

REPO_ROOT = pathlib.Path(__file__).resolve().parent.parent

Predicate = Callable[[str, str, Mapping[str, str]], bool]

_COPY_BYTES = 1 << 20  # per recv_into/sendall; >= 256 KiB keeps tens of MB/s cheap in Python
_MAX_HEAD_BYTES = 1 << 16


class _Closed(Exception):
    """The peer closed its connection (between messages when ``clean``)."""

    def __init__(self, clean: bool = False):
        super().__init__("connection closed" + (" between messages" if clean else " mid-message"))
        self.clean = clean


class _Stream:
    """A socket with a read buffer: HTTP heads and chunk-size lines are parsed from it, bodies copied past it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.buffer = bytearray()

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise _Closed()
        self.buffer += data

    def read_head(self) -> bytes:
        """One message head (request or status line and headers) without its blank line."""
        while (end := self.buffer.find(b"\r\n\r\n")) < 0:
            if len(self.buffer) > _MAX_HEAD_BYTES:
                raise ValueError("HTTP head too long")
            try:
                self._fill()
            except _Closed:
                raise _Closed(clean=not self.buffer) from None
        head = bytes(self.buffer[:end])
        del self.buffer[: end + 4]
        return head

    def read_line(self) -> bytes:
        while (end := self.buffer.find(b"\r\n")) < 0:
            if len(self.buffer) > _MAX_HEAD_BYTES:
                raise ValueError("HTTP line too long")
            self._fill()
        line = bytes(self.buffer[: end + 2])
        del self.buffer[: end + 2]
        return line

    def copy(self, size: int | None, dst: socket.socket | None, scratch: memoryview) -> None:
        """Moves ``size`` bytes (all until the peer closes when None) to ``dst`` (None: discards them)."""
        if self.buffer:
            take = len(self.buffer) if size is None else min(size, len(self.buffer))
            if dst is not None:
                dst.sendall(self.buffer[:take])
            del self.buffer[:take]
            if size is not None:
                size -= take
        while size is None or size > 0:
            got = self.sock.recv_into(scratch if size is None else scratch[: min(size, len(scratch))])
            if not got:
                if size is None:
                    return
                raise _Closed()
            if dst is not None:
                dst.sendall(scratch[:got])
            if size is not None:
                size -= got

    def copy_chunked(self, dst: socket.socket | None, scratch: memoryview) -> None:
        """Moves one chunked body, framing and trailers included, to ``dst`` unchanged."""
        while True:
            line = self.read_line()
            if dst is not None:
                dst.sendall(line)
            size = int(line.split(b";", 1)[0].strip(), 16)
            if size == 0:
                while True:  # trailers, up to the blank line
                    line = self.read_line()
                    if dst is not None:
                        dst.sendall(line)
                    if line == b"\r\n":
                        return
            self.copy(size + 2, dst, scratch)  # the data and its CRLF


def _parse_head(head: bytes) -> tuple[str, list[tuple[str, str]]]:
    first, *lines = head.decode("latin-1").split("\r\n")
    headers = []
    for line in lines:
        name, _, value = line.partition(":")
        headers.append((name.strip(), value.strip()))
    return first, headers


def _header(headers: list[tuple[str, str]], name: str) -> str | None:
    values = [v for n, v in headers if n.lower() == name]
    return ", ".join(values) if values else None


def _range_bytes(value: str) -> int:
    """How many bytes a ``Range`` header's ``bytes=a-b`` ranges ask for (0 for none, or open-ended ones)."""
    total = 0
    for part in value.removeprefix("bytes=").split(","):
        first, _, last = part.strip().partition("-")
        if first.isdigit() and last.isdigit():
            total += int(last) - int(first) + 1
    return total


def _build_head(first: str, headers: list[tuple[str, str]]) -> bytes:
    return "".join([first, "\r\n", *(f"{n}: {v}\r\n" for n, v in headers), "\r\n"]).encode("latin-1")


def _body_framing(headers: list[tuple[str, str]]) -> str | int | None:
    """'chunked', a Content-Length, or None (no framing header)."""
    encoding = _header(headers, "transfer-encoding")
    if encoding and encoding.lower().split(",")[-1].strip() == "chunked":
        return "chunked"
    length = _header(headers, "content-length")
    return int(length.split(",")[0]) if length is not None else None


def _wants_close(version: str, headers: list[tuple[str, str]]) -> bool:
    tokens = {t.strip().lower() for t in (_header(headers, "connection") or "").split(",")}
    return "close" in tokens or (version == "HTTP/1.0" and "keep-alive" not in tokens)


def _readable(sock: socket.socket) -> bool:
    """True when an idle connection has something to read: the peer closed it."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _host_and_port(endpoint: str) -> tuple[str, int]:
    target = urllib.parse.urlsplit(endpoint)
    if target.scheme != "http" or not target.hostname or not target.port or target.path not in ("", "/"):
        raise ValueError(f"the proxy forwards to http://HOST:PORT, not {endpoint!r}")
    return target.hostname, target.port


@dataclasses.dataclass
class _DropRule:
    predicate: Predicate
    times: int


class _ProxyServer:
    """The proxy itself, in the child process."""

    def __init__(self, target_endpoint: str, delay_s: float = 0.0, *, upstream_timeout_s: float = 120.0):
        self._target = _host_and_port(target_endpoint)
        self.target_endpoint = "http://{}:{}".format(*self._target)
        self._upstream_timeout_s = upstream_timeout_s
        self._delay_s = float(delay_s)
        self._lock = threading.Lock()
        self._rules: list[_DropRule] = []
        self._sockets: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._closing = False
        self.requests_seen = 0
        self.requests_by_method: dict[str, int] = {}
        self.ranged_bytes = 0  # bytes that requests asked for with "Range: bytes=a-b"
        self.responses_dropped = 0
        self.dropped: list[tuple[str, str]] = []  # (method, target) of each request whose response was lost
        self.predicate_errors: list[str] = []
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self.endpoint = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._acceptor = threading.Thread(target=self._accept_loop, name="http-proxy-accept", daemon=True)
        self._acceptor.start()

    def set_delay(self, seconds: float) -> None:
        self._delay_s = float(seconds)

    def drop_response(self, predicate: Predicate, times: int) -> None:
        with self._lock:
            self._rules.append(_DropRule(predicate, times))

    def stats(self) -> dict[str, Any]:
        with self._lock:
            return {
                "requests_seen": self.requests_seen,
                "requests_by_method": dict(self.requests_by_method),
                "ranged_bytes": self.ranged_bytes,
                "responses_dropped": self.responses_dropped,
                "dropped": list(self.dropped),
                "predicate_errors": list(self.predicate_errors),
            }

    def close(self) -> None:
        with self._lock:
            self._closing = True
            sockets = list(self._sockets)
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked on it
        self._acceptor.join(5)
        for thread in list(self._threads):
            thread.join(5)

    def _accept_loop(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                if self._closing:
                    client.close()
                    return
                self._sockets.add(client)
                thread = threading.Thread(target=self._serve, args=(client,), name="http-proxy-conn", daemon=True)
                self._threads.add(thread)
            thread.start()

    def _track(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.add(sock)
            closing = self._closing
        if closing:
            sock.shutdown(socket.SHUT_RDWR)

    def _release(self, sock: socket.socket | None) -> None:
        if sock is None:
            return
        with self._lock:
            self._sockets.discard(sock)
        sock.close()

    def _connect_upstream(self) -> _Stream:
        sock = socket.create_connection(self._target, timeout=self._upstream_timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._track(sock)
        return _Stream(sock)

    def _should_drop(self, method: str, target: str, headers: list[tuple[str, str]]) -> bool:
        lowered = {}
        for name, value in headers:
            key = name.lower()
            lowered[key] = f"{lowered[key]}, {value}" if key in lowered else value
        with self._lock:
            self.requests_seen += 1
            self.requests_by_method[method] = self.requests_by_method.get(method, 0) + 1
            self.ranged_bytes += _range_bytes(lowered.get("range", ""))
            for rule in self._rules:
                if rule.times <= 0:
                    continue
                try:
                    matched = rule.predicate(method, target, lowered)
                except Exception:  # noqa: BLE001 (reported to the parent, which raises it)
                    self.predicate_errors.append(f"{method} {target}: {traceback.format_exc()}")
                    continue
                if matched:
                    rule.times -= 1
                    self.responses_dropped += 1
                    self.dropped.append((method, target))
                    return True
        return False

    def _serve(self, client_sock: socket.socket) -> None:
        client_sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client = _Stream(client_sock)
        upstream: _Stream | None = None
        scratch = memoryview(bytearray(_COPY_BYTES))
        try:
            while True:
                try:
                    request_line, headers = _parse_head(client.read_head())
                except _Closed:
                    return
                method, target, version = request_line.split(" ", 2)
                drop = self._should_drop(method, target, headers)
                expect = (_header(headers, "expect") or "").lower()
                if expect == "100-continue":  # answered here; the server gets the body straight away
                    headers = [(n, v) for n, v in headers if n.lower() != "expect"]
                    client_sock.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                if delay := self._delay_s:
                    time.sleep(delay)
                if upstream is not None and _readable(upstream.sock):
                    self._release(upstream.sock)  # the server closed this idle keep-alive connection
                    upstream = None
                if upstream is None:
                    upstream = self._connect_upstream()
                upstream.sock.sendall(_build_head(request_line, headers))
                framing = _body_framing(headers)
                if framing == "chunked":
                    client.copy_chunked(upstream.sock, scratch)
                elif framing:
                    client.copy(framing, upstream.sock, scratch)
                close = self._relay_response(method, upstream, None if drop else client_sock, scratch)
                if drop or close or _wants_close(version, headers):
                    return
        except (OSError, ValueError, _Closed):
            return  # a peer went away or spoke something else: this connection ends
        finally:
            self._release(upstream.sock if upstream is not None else None)
            with contextlib.suppress(OSError):
                client_sock.shutdown(socket.SHUT_RDWR)
            self._release(client_sock)
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _relay_response(self, method: str, upstream: _Stream, dst: socket.socket | None, scratch: memoryview) -> bool:
        """Reads the server's response and sends it to ``dst`` (None: drops it); True when the connection must end."""
        while True:
            status_line, headers = _parse_head(upstream.read_head())
            version, status, *_ = status_line.split(" ", 2)
            code = int(status)
            if code >= 200 or code == 101:
                break
            if dst is not None and code != 100:  # 100 Continue was already sent by the proxy
                dst.sendall(_build_head(status_line, headers))
        headers = [(n, self._rewrite_location(v) if n.lower() == "location" else v) for n, v in headers]
        if dst is not None:
            dst.sendall(_build_head(status_line, headers))
        if code == 101:
            raise ValueError("protocol upgrades are not proxied")
        if method == "HEAD" or code in (204, 304):
            return _wants_close(version, headers)
        framing = _body_framing(headers)
        if framing == "chunked":
            upstream.copy_chunked(dst, scratch)
        elif framing is not None:
            upstream.copy(framing, dst, scratch)
        else:  # delimited by the server closing its connection
            upstream.copy(None, dst, scratch)
            return True
        return _wants_close(version, headers)

    def _rewrite_location(self, value: str) -> str:
        if value.startswith(self.target_endpoint):
            return self.endpoint + value[len(self.target_endpoint) :]
        return value


def _send_message(stream: BinaryIO, message: Any) -> None:
    payload = pickle.dumps(message)
    stream.write(struct.pack("!I", len(payload)) + payload)
    stream.flush()


def _read_message(stream: BinaryIO) -> Any:
    """The next message, or EOFError when the other side has gone."""
    size = stream.read(4)
    if len(size) < 4:
        raise EOFError
    payload = stream.read(struct.unpack("!I", size)[0])
    return pickle.loads(payload)


def _child_main(target_endpoint: str, delay_s: float) -> None:
    """The child process: serves the proxy and obeys its parent on stdin until it closes or exits."""
    commands, replies = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # stdout carries the replies; a stray print goes to stderr
    server = _ProxyServer(target_endpoint, delay_s)
    try:
        _send_message(replies, server.endpoint)
        while True:
            try:
                command, *args = _read_message(commands)
            except EOFError:
                return
            if command == "close":
                return
            if command == "set_delay":
                server.set_delay(*args)
            elif command == "drop_response":
                predicate, times = args
                server.drop_response(pickle.loads(predicate), times)
            _send_message(replies, server.stats())
    finally:
        server.close()


def _dumps_predicate(predicate: Predicate) -> bytes:
    try:
        import cloudpickle
    except ImportError:  # then only importable functions can be sent
        return pickle.dumps(predicate)
    return cloudpickle.dumps(predicate)


class HttpProxy:
    """The proxy a ``http_proxy`` block yields (its process's handle); see the module docstring."""

    def __init__(self, target_endpoint: str, delay_s: float = 0.0):
        _host_and_port(target_endpoint)
        self.target_endpoint = target_endpoint
        self._delay_s = float(delay_s)
        self._lock = threading.Lock()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        self._process = subprocess.Popen(
            [sys.executable, "-m", "testing.http_proxy", target_endpoint, str(self._delay_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # a Ctrl-C is this process's to handle; the child follows its stdin closing
        )
        try:
            self.endpoint: str = _read_message(self._process.stdout)
        except EOFError:
            self._process.wait()
            raise RuntimeError(f"the HTTP proxy process exited with {self._process.returncode}") from None
        self._last_stats: dict[str, Any] = {}

    def _command(self, *command: Any) -> dict[str, Any]:
        with self._lock:
            if self._process.stdin.closed:
                return self._last_stats
            try:
                _send_message(self._process.stdin, command)
                self._last_stats = _read_message(self._process.stdout)
            except (EOFError, BrokenPipeError):
                raise RuntimeError(f"the HTTP proxy process exited with {self._process.poll()}") from None
            return self._last_stats

    @property
    def delay_s(self) -> float:
        return self._delay_s

    def set_delay(self, seconds: float) -> None:
        """Every request from now on waits ``seconds`` before it is forwarded."""
        self._delay_s = float(seconds)
        self._command("set_delay", self._delay_s)

    def drop_response(self, predicate: Predicate, times: int = 1) -> None:
        """The next ``times`` requests matching ``predicate(method, target, headers)`` lose their response."""
        self._command("drop_response", _dumps_predicate(predicate), times)

    def stats(self) -> dict[str, Any]:
        """requests_seen, requests_by_method, ranged_bytes (what ``Range: bytes=a-b`` headers asked for),
        responses_dropped, dropped ((method, target) pairs), predicate_errors."""
        return self._command("stats")

    @property
    def requests_seen(self) -> int:
        return self.stats()["requests_seen"]

    @property
    def responses_dropped(self) -> int:
        return self.stats()["responses_dropped"]

    @property
    def dropped(self) -> list[tuple[str, str]]:
        return self.stats()["dropped"]

    def close(self) -> list[str]:
        """Stops the proxy; returns the predicates' errors."""
        errors = []
        with contextlib.suppress(RuntimeError):
            errors = self.stats()["predicate_errors"]
        with self._lock:
            if not self._process.stdin.closed:
                with contextlib.suppress(BrokenPipeError):
                    _send_message(self._process.stdin, ("close",))
                with contextlib.suppress(BrokenPipeError):
                    self._process.stdin.close()
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._process.stdout.close()
        return errors


@contextlib.contextmanager
def http_proxy(target_endpoint: str, delay_s: float = 0.0) -> Iterator[HttpProxy]:
    """A proxy on a free 127.0.0.1 port in front of ``target_endpoint`` (http://HOST:PORT); stopped on exit.

    Raises at the end of the block if a ``drop_response`` predicate raised.
    """
    proxy = HttpProxy(target_endpoint, delay_s)
    try:
        yield proxy
    except BaseException:
        proxy.close()
        raise
    if errors := proxy.close():
        raise RuntimeError("a drop_response predicate raised:\n" + "\n".join(errors))


if __name__ == "__main__":
    _child_main(sys.argv[1], float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
