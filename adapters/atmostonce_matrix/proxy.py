"""A small TCP fault proxy for HTTP/1.1 in front of a homeserver (ours; threads and sockets only).

:class:`FaultProxy` listens on 127.0.0.1 and relays each client connection to
the upstream. For every new connection it reads the request head, then takes
a *plan*: the first queued plan whose ``match`` occurs in the request line
(e.g. ``"PUT "`` or ``"/send/"``), else a draw from the fault mix set with
:meth:`FaultProxy.set_fault_mix` (when its ``match`` occurs), else ``pass``.
A plan applies to one connection, judged on its first request; a client with
keep-alive off (the transports here) opens one connection per request.

Modes (:data:`MODES`):

* ``pass``: relay both ways until either side closes.
* ``drop_before_forward``: read the whole request, forward nothing, close the
  client connection (FIN) without an answer. The homeserver never saw it;
  the client cannot know that: unknown.
* ``drop_after_forward``: forward the whole request, wait for the
  homeserver's complete response, then close the client connection without
  relaying it. The event exists; the client sees a disconnect: unknown.
* ``delay``: hold the whole request ``seconds`` (set it past the client's
  read timeout) or until :meth:`FaultProxy.release`, then forward it and
  relay the response if the client is still there. The client times out first; the event appears *later*, which
  is why a history lookup that finds nothing proves nothing.
* ``reset``: forward only the request head (the homeserver gets an
  incomplete request and discards it), then reset both connections (RST via
  ``SO_LINGER`` 0). The client sees a reset mid-request: unknown.
* ``gateway_error``: forward the whole request, read the response, answer
  the client ``502 Bad Gateway`` instead (what a reverse proxy does when its
  upstream connection breaks after forwarding). The event exists: unknown.

:attr:`FaultProxy.records` lists what happened per connection
(:class:`ProxyRecord`); :meth:`FaultProxy.wait_idle` waits until no
connection is being handled (e.g. until a delayed request has landed).

Use::

    with FaultProxy("127.0.0.1", synapse_port) as proxy:
        proxy.plan("drop_after_forward", match="PUT ")
        transport = MatrixTransport(MatrixConfig(homeserver_url=proxy.url, ...))
"""

from __future__ import annotations

import contextlib
import selectors
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from atmostonce_http.faultrelay import Closed, FaultRelay, close_socket, recv_until

__all__ = ["MODES", "FaultProxy", "Plan", "ProxyRecord"]

MODES = ("pass", "drop_before_forward", "drop_after_forward", "delay", "reset", "gateway_error")
_MAX_HEAD = 64 * 1024


@dataclass(frozen=True)
class Plan:
    """What to do with one connection. ``match``: substring of the request line (``None``: any)."""

    mode: str
    match: str | None = None
    seconds: float | None = None

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown proxy mode {self.mode!r}; modes: {MODES}")
        if self.seconds is not None and not self.seconds >= 0:
            raise ValueError("seconds must be >= 0")


@dataclass
class ProxyRecord:
    """One handled connection: its request line, the mode applied, and what the upstream answered."""

    request_line: str
    mode: str
    forwarded: bool = False
    upstream_status: int | None = None
    relayed: bool = False
    done: bool = False
    error: str | None = None
    started: float = field(default_factory=time.monotonic)


def _headers(head: bytes) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in head.split(b"\r\n")[1:]:
        name, sep, value = line.partition(b":")
        if sep:
            out[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return out


def _read_message(sock: socket.socket, buf: bytearray) -> bytes:
    """One complete HTTP/1.1 message (head plus a Content-Length or chunked body) from ``sock``."""
    end = recv_until(sock, buf, b"\r\n\r\n", _MAX_HEAD)
    headers = _headers(bytes(buf[:end]))
    if "chunked" in headers.get("transfer-encoding", "").lower():
        total = recv_until(sock, buf, b"0\r\n\r\n", 64 * 1024 * 1024, start=end)  # the last chunk, no trailers
    else:
        total = end + int(headers.get("content-length", "0") or 0)
        while len(buf) < total:
            chunk = sock.recv(65536)
            if not chunk:
                raise Closed("peer closed mid-body")
            buf += chunk
    message = bytes(buf[:total])
    del buf[:total]
    return message


def _reset(sock: socket.socket) -> None:
    """Close with RST instead of FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    with contextlib.suppress(OSError):
        sock.close()


class FaultProxy(FaultRelay):
    """See the module docstring. ``delay_seconds``: default hold for ``delay`` plans;
    ``io_timeout``: seconds any single socket read may block before the connection is dropped."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        delay_seconds: float = 2.0,
        io_timeout: float = 30.0,
    ):
        super().__init__(upstream_host, upstream_port, host=host, port=port, io_timeout=io_timeout)
        self.delay_seconds = delay_seconds
        self.records: list[ProxyRecord] = []
        self.faults: Counter[str] = Counter()
        self._plans: list[Plan] = []
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._releases = 0

    # ---------------------------------------------------------------- lifecycle
    _kind = "proxy"
    _thread_name = "fault-proxy"
    _backlog = 128

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _stopping(self) -> None:
        with self._idle:
            self._idle.notify_all()  # held requests give up

    # ---------------------------------------------------------------- plans
    def plan(self, mode: str, *, match: str | None = None, seconds: float | None = None) -> None:
        """Queue ``mode`` for the next connection whose request line contains ``match``."""
        p = Plan(mode, match, seconds)
        with self._lock:
            self._plans.append(p)

    def set_fault_mix(self, mix: Mapping[str, float], *, seed: int = 0, match: str | None = None) -> None:
        """Draw a mode per connection (request line containing ``match``) with these probabilities; the
        remainder passes. An empty mix switches drawing off."""
        for mode, p in mix.items():
            Plan(mode)
            if not 0 <= p <= 1:
                raise ValueError(f"probability for {mode!r} must be in [0, 1]")
        self._set_mix(mix, seed, match)

    def clear(self) -> None:
        """Forget queued plans and the fault mix."""
        with self._lock:
            self._plans.clear()
            self._mix = []

    @property
    def pending_plans(self) -> int:
        with self._lock:
            return len(self._plans)

    def _choose(self, request_line: str) -> Plan:
        with self._lock:
            for i, p in enumerate(self._plans):
                if p.match is None or p.match in request_line:
                    return self._plans.pop(i)
            return Plan(self._draw(request_line) or "pass")

    def release(self) -> None:
        """Let every request held by a ``delay`` plan go on now (held ones only; later plans hold again)."""
        with self._idle:
            self._releases += 1
            self._idle.notify_all()

    def _hold(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        with self._idle:
            generation = self._releases
            while not self._stop.is_set() and self._releases == generation:
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._idle.wait(left)

    def wait_idle(self, timeout: float = 30.0) -> bool:
        """Wait until no connection is being handled; ``False`` on timeout."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._active:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._idle.wait(left)
        return True

    # ---------------------------------------------------------------- relay
    def _accepted(self, client: socket.socket) -> None:
        with self._lock:
            self._active += 1
            self._conns.add(client)
        threading.Thread(target=self._handle, args=(client,), name="fault-proxy-conn", daemon=True).start()

    def _handle(self, client: socket.socket) -> None:
        up: socket.socket | None = None
        record: ProxyRecord | None = None
        try:
            client.settimeout(self.io_timeout)
            buf = bytearray()
            head_end = recv_until(client, buf, b"\r\n\r\n", _MAX_HEAD)
            request_line = bytes(buf[: buf.find(b"\r\n")]).decode("latin-1")
            plan = self._choose(request_line)
            record = ProxyRecord(request_line, plan.mode)
            with self._lock:
                self.records.append(record)
                if plan.mode != "pass":
                    self.faults[plan.mode] += 1
            if plan.mode == "pass":
                up = self._connect_upstream()
                up.sendall(bytes(buf))
                record.forwarded = True
                self._pump(client, up)
                return
            if plan.mode == "reset":
                up = self._connect_upstream()
                up.sendall(bytes(buf[:head_end]))  # the head only: an incomplete request upstream
                record.forwarded = False
                _reset(client)
                _reset(up)
                return
            request = _read_message(client, buf)
            if plan.mode == "drop_before_forward":
                close_socket(client)
                return
            if plan.mode == "delay":
                self._hold(plan.seconds if plan.seconds is not None else self.delay_seconds)
                if self._stop.is_set():
                    return
            up = self._connect_upstream()
            up.sendall(request)
            record.forwarded = True
            ubuf = bytearray()
            response = _read_message(up, ubuf)
            status_line = response[: response.find(b"\r\n")].split()
            record.upstream_status = int(status_line[1]) if len(status_line) > 1 else None
            if plan.mode == "drop_after_forward":
                close_socket(client)
            elif plan.mode == "gateway_error":
                body = b"<html><body><h1>502 Bad Gateway</h1></body></html>"
                head = b"HTTP/1.1 502 Bad Gateway\r\nContent-Type: text/html\r\nConnection: close\r\n"
                with contextlib.suppress(OSError):
                    client.sendall(head + b"Content-Length: %d\r\n\r\n" % len(body) + body)
                    record.relayed = True
            else:  # delay: relay the late answer if the client is still listening
                with contextlib.suppress(OSError):
                    client.sendall(response)
                    record.relayed = True
        except (Closed, OSError) as exc:
            if record is not None:
                record.error = f"{type(exc).__name__}: {exc}"
        finally:
            if record is not None:
                record.done = True
            with self._idle:
                self._forget(client, up)
                self._active -= 1
                self._idle.notify_all()

    def _pump(self, client: socket.socket, up: socket.socket) -> None:
        """Relay bytes both ways until both directions are closed (or either side errors)."""
        sel = selectors.DefaultSelector()
        peers = {client: up, up: client}
        open_reads = {client, up}
        for s in open_reads:
            s.setblocking(False)
            sel.register(s, selectors.EVENT_READ)
        try:
            while open_reads and not self._stop.is_set():
                events = sel.select(timeout=0.2)
                for key, _ in events:
                    src: socket.socket = key.fileobj  # type: ignore[assignment]
                    try:
                        data = src.recv(65536)
                    except BlockingIOError:
                        continue
                    dst = peers[src]
                    if not data:
                        sel.unregister(src)
                        open_reads.discard(src)
                        with contextlib.suppress(OSError):
                            dst.shutdown(socket.SHUT_WR)
                        if src is client:  # the client is done: nothing more is owed to it
                            return
                        continue
                    dst.setblocking(True)
                    dst.settimeout(self.io_timeout)
                    try:
                        dst.sendall(data)
                    finally:
                        dst.setblocking(False)
        finally:
            sel.close()
