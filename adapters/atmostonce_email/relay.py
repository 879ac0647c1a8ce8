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
import re
import socket
import threading
from collections.abc import Mapping
from dataclasses import dataclass

from atmostonce_http.faultrelay import Closed, FaultRelay, recv_until

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


class _Reader:
    def __init__(self, sock: socket.socket):
        self.sock, self.buf = sock, bytearray()

    def until(self, marker: bytes, limit: int) -> bytes:
        end = recv_until(self.sock, self.buf, marker, limit)
        out = bytes(self.buf[:end])
        del self.buf[:end]
        return out

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


class SmtpFaultRelay(FaultRelay):
    """Listens on ``host`` (127.0.0.1, an unused port) and relays to ``upstream``; a context manager."""

    _thread_name = "smtp-fault-relay"

    def __init__(self, upstream_host: str, upstream_port: int, *, host: str = "127.0.0.1", io_timeout: float = 30.0):
        super().__init__(upstream_host, upstream_port, host=host, io_timeout=io_timeout)
        self.records: list[RelayRecord] = []
        self._plans: list[str] = []
        self._handlers: list[threading.Thread] = []

    def _closed(self) -> None:
        with self._lock:
            handlers = list(self._handlers)
        for t in handlers:
            t.join(timeout=5)

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
        self._set_mix(mix, seed)

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._mix = []

    def _choose(self) -> str:
        with self._lock:
            if self._plans:
                return self._plans.pop(0)
            return self._draw() or "pass"

    def _accepted(self, client: socket.socket) -> None:
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
            up = self._connect_upstream()
            self._session(client, up, record)
        except (Closed, OSError) as exc:
            record.error = f"{type(exc).__name__}: {exc}"
        finally:
            record.done = True
            with self._lock:
                self._forget(client, up)

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
