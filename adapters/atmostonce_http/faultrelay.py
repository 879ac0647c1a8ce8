"""What the fault relays in front of a real server share (threads and sockets only): a loopback listener,
one handler thread per client connection relayed to the upstream, the sockets' bookkeeping, and the
seeded draw of one fault mode per connection.

:class:`FaultRelay` is the base of :class:`atmostonce_email.SmtpFaultRelay` (SMTP, in lock step: the
server speaks first) and :class:`atmostonce_matrix.proxy.FaultProxy` (HTTP/1.1: it reads the request head
before it connects upstream). Each says what a connection is in :meth:`FaultRelay._accepted`.
"""

from __future__ import annotations

import abc
import contextlib
import random
import socket
import threading
from collections.abc import Mapping
from typing import Self

__all__ = ["Closed", "FaultRelay", "close_socket", "recv_until"]


class Closed(Exception):
    """The peer closed, or what was being read outgrew its limit."""


def recv_until(sock: socket.socket, buf: bytearray, marker: bytes, limit: int, start: int = 0) -> int:
    """Read into ``buf`` until ``marker`` occurs at or after ``start``; returns the index just past it.

    Raises :class:`Closed` when the peer closes first or ``buf`` outgrows ``limit``.
    """
    while True:
        i = buf.find(marker, start)
        if i >= 0:
            return i + len(marker)
        if len(buf) > limit:
            raise Closed("too large")
        start = max(start, len(buf) - len(marker) + 1)
        chunk = sock.recv(65536)
        if not chunk:
            raise Closed("peer closed")
        buf += chunk


def close_socket(sock: socket.socket | None) -> None:
    """Shut down and close ``sock`` (``None``: nothing), ignoring a socket already gone."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class FaultRelay(abc.ABC):
    """Listens on ``host``:``port`` (an unused port by default) and hands each connection to
    :meth:`_accepted`; a context manager. ``io_timeout``: seconds a single socket read may block."""

    _kind = "relay"
    """What it is called in its errors."""
    _thread_name = "fault-relay"
    _backlog = 64

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        io_timeout: float = 30.0,
    ):
        self.upstream = (upstream_host, upstream_port)
        self.host, self._port = host, port
        self.io_timeout = io_timeout
        self._mix: list[tuple[str, float]] = []
        self._mix_match: str | None = None
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError(f"the {self._kind} is not started")
        return self._listener.getsockname()[1]

    def start(self) -> Self:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, self._port))
        ls.listen(self._backlog)
        ls.settimeout(0.1)
        self._listener = ls
        self._thread = threading.Thread(target=self._accept_loop, name=self._thread_name, daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, drop live connections, join the threads. Idempotent."""
        self._stop.set()
        self._stopping()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._lock:
            conns = list(self._conns)
        for c in conns:
            close_socket(c)
        self._closed()

    def __enter__(self) -> Self:
        return self.start() if self._listener is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _stopping(self) -> None:
        """Called by :meth:`close` once stopping is set, before the accept thread is joined (default: nothing)."""
        return None

    def _closed(self) -> None:
        """Called by :meth:`close` once the live connections are dropped (default: nothing)."""
        return None

    def _set_mix(self, mix: Mapping[str, float], seed: int, match: str | None = None) -> None:
        """Draw from ``mix`` (its entries checked by the caller; empty: off) for the connections whose first
        line contains ``match`` (``None``: every connection)."""
        if sum(mix.values()) > 1 + 1e-9:
            raise ValueError("fault probabilities add up to more than 1")
        with self._lock:
            self._mix, self._mix_match, self._rng = list(mix.items()), match, random.Random(seed)

    def _draw(self, line: str = "") -> str | None:
        """A mode drawn from the mix for a connection whose first line is ``line``; ``None`` for the remainder,
        no mix, or a ``line`` the mix does not match. Call it holding ``_lock``."""
        if self._mix and (self._mix_match is None or self._mix_match in line):
            x = self._rng.random()
            for mode, p in self._mix:
                if x < p:
                    return mode
                x -= p
        return None

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self._accepted(client)

    @abc.abstractmethod
    def _accepted(self, client: socket.socket) -> None:
        """Handle a new client connection (in a thread of its own); called on the accept thread."""

    def _connect_upstream(self) -> socket.socket:
        up = socket.create_connection(self.upstream, timeout=self.io_timeout)
        with self._lock:
            self._conns.add(up)
        return up

    def _forget(self, client: socket.socket, up: socket.socket | None) -> None:
        """Close a finished connection's sockets and stop tracking them; call it holding ``_lock``."""
        close_socket(client)
        close_socket(up)
        self._conns.discard(client)
        if up is not None:
            self._conns.discard(up)
