"""A small SMTP-aware fault relay (ours; threads and sockets only) between a client and an SMTP server.

``atmostonce_matrix.proxy.FaultProxy`` cannot stand in front of SMTP: it waits for an HTTP request
head before it connects upstream, while an SMTP server speaks first. :class:`SmtpFaultRelay` relays
one session in lock step (a command line from the client, the server's reply back; no pipelining is
needed: smtplib does not pipeline) and applies one *mode* per connection:

* ``pass``: relay everything.
* ``refuse_mail``: answer the first ``MAIL FROM`` with ``451 4.3.0`` itself, without forwarding it
  (the server never sees a transaction), then relay the rest (``QUIT``).
* ``drop_payload``: relay up to the server's ``354``, read the client's whole payload, forward
  none of it, and close both connections: the server discards the transaction (no ``<CRLF>.<CRLF>``
  reached it); the client has sent everything and gets no final reply.
* ``drop_after_data``: forward the whole payload, wait for the server's final reply (``250`` queued),
  then close the client connection without relaying it: the message exists; the client cannot know.
* ``hold_after_data``: as ``drop_after_data``, but keep the client connection open and silent until
  the client gives up (its timeout) or the relay closes.

A mode comes from the first queued :meth:`SmtpFaultRelay.plan`, else a seeded draw from
:meth:`SmtpFaultRelay.set_fault_mix`, else ``pass``. :attr:`SmtpFaultRelay.records` lists each
connection (:class:`RelayRecord`: the mode, whether the payload reached the server, the server's
final reply code, the ``Message-ID`` seen in the payload).
"""

from __future__ import annotations

import contextlib
import random
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["MODES", "RelayRecord", "SmtpFaultRelay"]

MODES = ("pass", "refuse_mail", "drop_payload", "drop_after_data", "hold_after_data")
_MAX_LINE = 64 * 1024
_MAX_PAYLOAD = 64 * 1024 * 1024
_MESSAGE_ID = re.compile(rb"^Message-ID:\s*(<[^>\r\n]*>)", re.I | re.M)


@dataclass
class RelayRecord:
    """One relayed connection."""

    mode: str
    message_id: str | None = None
    payload_forwarded: bool = False
    final_code: int | None = None
    final_relayed: bool = False
    done: bool = False
    error: str | None = None


class _Closed(Exception):
    pass


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, bytearray()

    def until(self, marker: bytes, limit: int) -> bytes:
        start = 0
        while True:
            i = self.buf.find(marker, start)
            if i >= 0:
                out = bytes(self.buf[: i + len(marker)])
                del self.buf[: i + len(marker)]
                return out
            if len(self.buf) > limit:
                raise _Closed("line too long")
            start = max(0, len(self.buf) - len(marker) + 1)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise _Closed("peer closed")
            self.buf += chunk

    def reply(self) -> tuple[int, bytes]:
        """One (possibly multi-line) SMTP reply: its code and its raw bytes."""
        raw = b""
        while True:
            line = self.until(b"\r\n", _MAX_LINE)
            raw += line
            if len(line) < 4 or line[3:4] != b"-":
                try:
                    return int(line[:3]), raw
                except ValueError:
                    return 0, raw


def _close(sock: socket.socket | None) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


class SmtpFaultRelay:
    """Listens on ``host`` (127.0.0.1, an unused port by default) and relays to ``upstream``; a context manager."""

    def __init__(self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1", io_timeout: float = 30.0):
        self.upstream = (upstream_host, upstream_port)
        self.host = host
        self.io_timeout = io_timeout
        self.records: list[RelayRecord] = []
        self._plans: list[str] = []
        self._mix: list[tuple[str, float]] = []
        self._rng = random.Random(0)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._listener: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[socket.socket] = set()
        self._handlers: list[threading.Thread] = []

    @property
    def port(self) -> int:
        if self._listener is None:
            raise RuntimeError("the relay is not started")
        return self._listener.getsockname()[1]

    def start(self) -> SmtpFaultRelay:
        ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        ls.bind((self.host, 0))
        ls.listen(64)
        ls.settimeout(0.1)
        self._listener = ls
        self._thread = threading.Thread(target=self._accept_loop, name="smtp-fault-relay", daemon=True)
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop accepting, drop live connections, join the threads. Idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.close()
        with self._lock:
            conns, handlers = list(self._conns), list(self._handlers)
        for c in conns:
            _close(c)
        for t in handlers:
            t.join(timeout=5)

    def __enter__(self) -> SmtpFaultRelay:
        return self.start() if self._listener is None else self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def plan(self, mode: str) -> None:
        """Queue ``mode`` for the next connection."""
        if mode not in MODES:
            raise ValueError(f"unknown relay mode {mode!r}; modes: {MODES}")
        with self._lock:
            self._plans.append(mode)

    def set_fault_mix(self, mix: Mapping[str, float], *, seed: int = 0) -> None:
        """Draw a mode per connection with these probabilities (the remainder passes); empty: off."""
        for mode, p in mix.items():
            if mode not in MODES or not 0 <= p <= 1:
                raise ValueError(f"bad fault mix entry {mode!r}: {p!r}")
        if sum(mix.values()) > 1 + 1e-9:
            raise ValueError("fault probabilities add up to more than 1")
        with self._lock:
            self._mix, self._rng = list(mix.items()), random.Random(seed)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._mix = []

    def _choose(self) -> str:
        with self._lock:
            if self._plans:
                return self._plans.pop(0)
            if self._mix:
                x = self._rng.random()
                for mode, p in self._mix:
                    if x < p:
                        return mode
                    x -= p
        return "pass"

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            record = RelayRecord(self._choose())
            t = threading.Thread(target=self._handle, args=(client, record), name="smtp-relay-conn", daemon=True)
            with self._lock:
                self.records.append(record)
                self._conns.add(client)
                self._handlers.append(t)
            t.start()

    def _handle(self, client: socket.socket, record: RelayRecord) -> None:
        up: socket.socket | None = None
        try:
            client.settimeout(self.io_timeout)
            up = socket.create_connection(self.upstream, timeout=self.io_timeout)
            with self._lock:
                self._conns.add(up)
            self._session(client, up, record)
        except (_Closed, OSError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            record.done = True
            _close(client)
            _close(up)
            with self._lock:
                self._conns.discard(client)
                if up is not None:
                    self._conns.discard(up)

    def _session(self, client: socket.socket, up: socket.socket, record: RelayRecord) -> None:
        cr, ur = _Reader(client), _Reader(up)
        client.sendall(ur.reply()[1])  # the greeting
        refused = False
        while not self._stop.is_set():
            line = cr.until(b"\r\n", _MAX_LINE)
            verb = line[:4].upper()
            if verb == b"MAIL" and record.mode == "refuse_mail" and not refused:
                refused = True
                client.sendall(b"451 4.3.0 fault relay: refused before DATA, not forwarded\r\n")
                continue
            up.sendall(line)
            code, reply = ur.reply()
            if verb == b"DATA" and code == 354:
                client.sendall(reply)
                payload = cr.until(b"\r\n.\r\n", _MAX_PAYLOAD)
                found = _MESSAGE_ID.search(payload)
                record.message_id = found.group(1).decode("latin-1") if found else None
                if record.mode == "drop_payload":
                    return  # neither side gets the end of the payload
                up.sendall(payload)
                record.payload_forwarded = True
                record.final_code, final = ur.reply()
                if record.mode == "drop_after_data":
                    with contextlib.suppress(OSError):
                        up.sendall(b"QUIT\r\n")
                    return
                if record.mode == "hold_after_data":
                    with contextlib.suppress(OSError):
                        up.sendall(b"QUIT\r\n")
                    while not self._stop.is_set():  # silent until the client gives up
                        try:
                            if not client.recv(65536):
                                return
                        except TimeoutError:
                            continue
                    return
                client.sendall(final)
                record.final_relayed = True
                continue
            client.sendall(reply)
            if verb == b"QUIT":
                return
