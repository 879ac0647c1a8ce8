"""Helpers for the HTTP transport tests: raw TCP servers with scripted behaviour.

Everything runs on real sockets on 127.0.0.1; nothing in httpx is mocked.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Callable

from atmostonce.transport import WireRequest

Behaviour = Callable[["RawServer", socket.socket], None]


class RawServer:
    """A TCP listener on 127.0.0.1; each accepted connection runs ``behaviour(server, conn)`` in a thread.

    ``connections`` counts accepted connections; ``requests`` holds every complete
    HTTP request read (head plus ``Content-Length`` body); ``received`` holds the
    first bytes of connections read with :meth:`read_some`. ``release`` is set on close.
    """

    def __init__(self, behaviour: Behaviour, *, rcvbuf: int | None = None):
        self.behaviour = behaviour
        self.release = threading.Event()
        self.connections = 0
        self.requests: list[bytes] = []
        self.received: list[bytes] = []
        self._cond = threading.Condition()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        if rcvbuf is not None:  # inherited by accepted sockets: keeps the peer's send window tiny
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.sock.settimeout(0.05)
        self.port = self.sock.getsockname()[1]
        self._closing = False
        self._thread = threading.Thread(target=self._accept_loop, daemon=True)
        self._thread.start()

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"

    def _accept_loop(self) -> None:
        while not self._closing:
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            conn.settimeout(10)
            with self._cond:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self.behaviour(self, conn)
        except OSError:
            pass
        finally:
            conn.close()

    def read_request(self, conn: socket.socket) -> bytes | None:
        """Read one full request; record it in ``requests``. ``None`` if the peer closed first."""
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value.strip())
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            body += chunk
        request = head + b"\r\n\r\n" + body
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()
        return request

    def read_some(self, conn: socket.socket) -> bytes:
        data = conn.recv(4096)
        with self._cond:
            self.received.append(data)
        return data

    def wait_requests(self, n: int, timeout: float = 5.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: len(self.requests) >= n, timeout)

    def close(self) -> None:
        self._closing = True
        self.release.set()
        self._thread.join()
        self.sock.close()


def parse_request(raw: bytes) -> tuple[str, str, dict[str, str], bytes]:
    """``(method, target, headers lower-cased, body)`` of a raw request."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    method, target, _ = lines[0].split(" ", 2)
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return method, target, headers, body


# ---------------------------------------------------------------- behaviours


def answer(status: int, body: bytes | dict | None = None, headers: dict[str, str] | None = None) -> Behaviour:
    """Read the request, then answer ``status`` with ``body`` (a dict is sent as JSON) and close."""
    payload = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")

    def behave(server: RawServer, conn: socket.socket) -> None:
        if server.read_request(conn) is None:
            return
        lines = [f"HTTP/1.1 {status} Status", f"Content-Length: {len(payload)}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + payload)

    return behave


def close_after_request(server: RawServer, conn: socket.socket) -> None:
    """Read the whole request, then close (FIN) without a byte of response."""
    server.read_request(conn)


def reset_after_request(server: RawServer, conn: socket.socket) -> None:
    """Read the whole request, then close with RST (SO_LINGER 0)."""
    if server.read_request(conn) is not None:
        rst(conn)


def hang_after_request(server: RawServer, conn: socket.socket) -> None:
    """Read the whole request and never answer (until the server closes)."""
    server.read_request(conn)
    server.release.wait()


def never_read(server: RawServer, conn: socket.socket) -> None:
    """Accept and never read, so a big request body fills the socket buffers."""
    server.release.wait()


def reset_mid_body(server: RawServer, conn: socket.socket) -> None:
    """Read the head and a little body, then RST while the client is still writing."""
    server.read_some(conn)
    rst(conn)


def tls_garbage(server: RawServer, conn: socket.socket) -> None:
    """Plain TCP: read the ClientHello, answer with plain-text garbage."""
    server.read_some(conn)
    conn.sendall(b"HTTP/1.1 400 Not TLS\r\nContent-Length: 0\r\n\r\n")


def tls_reset(server: RawServer, conn: socket.socket) -> None:
    """Plain TCP: read the ClientHello, then RST mid-handshake."""
    server.read_some(conn)
    rst(conn)


def rst(conn: socket.socket) -> None:
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


# A server that answers must never lose the race against the client's timeout, even on a loaded CI machine, so
# the default is patient; a test that waits for one timeout on purpose shortens only that one (SHORT).
PATIENT = {"connect_timeout": 10.0, "write_timeout": 10.0, "read_timeout": 10.0}
SHORT = 0.3


def wire(body: dict | None = None, key: str = "dk-1", epoch: int = 0) -> WireRequest:
    return WireRequest(
        body=body if body is not None else {"text": "hello", "delivery_key": key}, delivery_key=key, resend_epoch=epoch
    )
