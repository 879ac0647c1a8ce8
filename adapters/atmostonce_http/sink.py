"""A local platform sink: a real HTTP posting API on 127.0.0.1 with fault injection.

Endpoints (JSON bodies; objects are ``{"id", "body", "idempotency_key"}``):

* ``POST /posts`` with header ``Idempotency-Key``: a key seen before returns its
  object with 200 and creates nothing; otherwise creates, 201, ``Location: /posts/{id}``.
  Refused with 403 in dry-run mode (nothing is ever written), 400 if the body is
  not a JSON object, 411 without ``Content-Length``.
* ``GET /posts/{id}``: 200 with the object, 404 if absent or still lagging.
* ``GET /posts?key=K``: find by idempotency key: 200 or 404; 501 when lookup is off.
* ``DELETE /posts/{id}``: 204, or 404. The key is forgotten with the object.
* ``PUT`` or ``PATCH /posts/{id}`` with a JSON object: the object's body becomes it (a correction),
  200 with the object, or 404. Deletes and corrections (retractions) take their own planned fault
  (:meth:`PlatformSink.plan_retraction_fault`): ``drop_before_write``, ``drop_after_write`` or
  ``error_before_write``; they are counted in ``deletes`` and ``updates`` (applied writes only).

Faults apply to create requests, one per request: first the FIFO of planned
faults (:meth:`PlatformSink.plan`), else a draw from the ratio mix
(:meth:`PlatformSink.set_fault_mix`). Kinds (:data:`FAULTS`): ``delay`` (sleep,
then proceed), ``error_before_write`` (503, nothing created),
``error_after_write`` (create, then 500), ``drop_before_write`` (read the
request, close without answering, nothing created), ``drop_after_write``
(create, then close without answering), ``reset`` (create nothing, close with
RST), ``read_lag`` (create; reads and lookups of it 404 for some seconds), and
``none``. All durations are seconds. Counters are thread-safe.

Run standalone: ``python -m atmostonce_http.sink --port 8080``.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import random
import socket
import struct
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlsplit

from atmostonce.identity import platform_idempotency_key, split_platform_idempotency_key

__all__ = ["FAULTS", "Fault", "PlatformSink", "main"]

FAULTS = (
    "none",
    "delay",
    "error_before_write",
    "error_after_write",
    "drop_before_write",
    "drop_after_write",
    "reset",
    "read_lag",
)
"""Fault kinds accepted by :meth:`PlatformSink.plan` and :meth:`PlatformSink.set_fault_mix` (not ``none``)."""


@dataclass(frozen=True)
class Fault:
    """One fault for one create request; ``seconds`` is used by ``delay`` and ``read_lag``."""

    kind: str
    seconds: float = 0.0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    sink: PlatformSink

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that gave up (timeout, reset) is part of the game, not a server error
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "atmostonce-sink/1"
    timeout = 30
    server: _Server

    def setup(self) -> None:
        super().setup()
        # Head and body go out in separate writes; without this, Nagle plus delayed ACK adds ~40 ms each.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    # ---------------------------------------------------------------- helpers
    def _json(self, status: int, doc: Any, headers: Mapping[str, str] | None = None) -> None:
        data = json.dumps(doc).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _read_body(self) -> bytes | None:
        """The request body, or ``None`` after answering an error (no or bad ``Content-Length``)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.close_connection = True
            self._json(411, {"error": "Content-Length required"})
            return None
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._json(400, {"error": "bad Content-Length"})
            return None
        data = self.rfile.read(length) if length else b""
        if len(data) != length:  # client went away mid-body
            self.close_connection = True
            return None
        return data

    def _found(self, obj: dict[str, Any] | None) -> None:
        if obj is None:
            self._json(404, {"error": "not found"})
        else:
            self._json(200, obj)

    def _drop(self) -> None:
        """Close without answering: the client sees a clean EOF (FIN)."""
        self.close_connection = True

    def _reset(self) -> None:
        """Close abortively: SO_LINGER 0 makes the kernel send RST."""
        self.close_connection = True
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.connection.close()
        self.rfile.close()  # drops the last reference: the descriptor closes now, with RST

    # ---------------------------------------------------------------- methods
    def do_POST(self) -> None:
        sink = self.server.sink
        raw = self._read_body()
        if raw is None:
            return
        if urlsplit(self.path).path.rstrip("/") != "/posts":
            self._json(404, {"error": "no such endpoint"})
            return
        fault = sink._begin_create()
        if fault is None:
            self._json(403, {"error": "dry run: nothing is written"})
            return
        try:
            doc = json.loads(raw)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            self._json(400, {"error": "body must be a JSON object"})
            return
        sink._applied(fault)
        if fault.kind == "delay":
            time.sleep(fault.seconds)
        elif fault.kind == "error_before_write":
            self._json(503, {"error": "injected: unavailable"})
            return
        elif fault.kind == "drop_before_write":
            self._drop()
            return
        elif fault.kind == "reset":
            self._reset()
            return
        lag = fault.seconds if fault.kind == "read_lag" else 0.0
        written = sink._write(doc, self.headers.get("Idempotency-Key"), lag)
        if written is None:  # dry run was switched on while this request was in flight
            self._json(403, {"error": "dry run: nothing is written"})
            return
        if isinstance(written, str):  # "fenced": a fenced lookup answered "absent" for this key: its tombstone refuses
            self._json(409, {"error": "fenced: a lookup proved this key absent; the key is tombstoned"})
            return
        obj, created = written
        if fault.kind == "error_after_write":
            self._json(500, {"error": "injected: internal error"})
            return
        if fault.kind == "drop_after_write":
            self._drop()
            return
        self._json(201 if created else 200, obj, {"Location": "/posts/" + quote(obj["id"], safe="")})

    def do_GET(self) -> None:
        sink = self.server.sink
        if self._read_body() is None:
            return
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/")
        if path == "/posts":
            keys = parse_qs(parts.query).get("key")
            if not keys:
                self._json(400, {"error": "GET /posts needs ?key="})
            elif not sink.lookup_enabled:
                self._json(501, {"error": "lookup by key is switched off"})
            else:
                self._found(sink._find(keys[0], by_key=True))
        elif path.startswith("/posts/"):
            self._found(sink._find(unquote(path[len("/posts/") :]), by_key=False))
        else:
            self._json(404, {"error": "no such endpoint"})

    def _retraction_fault_before_write(self) -> str | None:
        """Apply the next planned retraction fault if it strikes before the write; ``None`` when it did
        (the request is answered or dropped), else the fault still to apply after the write (or ``""``)."""
        fault = self.server.sink._next_retraction_fault()
        if fault == "error_before_write":
            self._json(503, {"error": "injected: unavailable"})
            return None
        if fault == "drop_before_write":
            self._drop()
            return None
        return fault or ""

    def do_DELETE(self) -> None:
        sink = self.server.sink
        if self._read_body() is None:
            return
        path = urlsplit(self.path).path
        fault = self._retraction_fault_before_write()
        if fault is None:
            return
        deleted = path.startswith("/posts/") and sink._delete(unquote(path[len("/posts/") :]))
        if fault == "drop_after_write":
            self._drop()
        elif deleted:
            self.send_response(204)
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._json(404, {"error": "not found"})

    def do_PUT(self) -> None:
        sink = self.server.sink
        raw = self._read_body()
        if raw is None:
            return
        try:
            body = json.loads(raw)
        except ValueError:
            body = None
        if not isinstance(body, dict):
            self._json(400, {"error": "the body must be a JSON object"})
            return
        path = urlsplit(self.path).path
        fault = self._retraction_fault_before_write()
        if fault is None:
            return
        obj = sink._update(unquote(path[len("/posts/") :]), body) if path.startswith("/posts/") else None
        if fault == "drop_after_write":
            self._drop()
        else:
            self._found(obj)

    do_PATCH = do_PUT


class PlatformSink:
    """A posting API on a real socket, in a daemon thread. Use ``with PlatformSink() as sink:``.

    ``host``/``port`` (0: a free port), ``lookup`` (serve ``GET /posts?key=``),
    ``dry_run`` (refuse every create with 403), ``delay_seconds`` and
    ``read_lag_seconds`` (defaults for those faults). Counters (read any time):
    ``requests`` (create requests received), ``creates`` (objects ever
    created), ``objects`` (id -> object, a copy), ``creates_by_key`` (creates
    per ``body["delivery_key"]`` if it is a string, else per idempotency key,
    without its fence epoch: a count above 1 is a duplicate), ``faults_applied`` (kind -> count).

    ``dedupe=False`` plays a platform without idempotency keys: every create
    that reaches the write makes a new object, so any resend shows up as a
    duplicate. ``fenced_lookup=True`` makes ``GET /posts?key=`` a fence: it
    ignores read lag, and once it has answered "not found" for a key it leaves a
    **tombstone** on that key: every later create request carrying it is refused
    with 409 and writes nothing, for the sink's lifetime, whenever the request
    arrived (one still in the network when the lookup answered included). That is
    the guarantee a platform's idempotency-status API must give for a not-found
    answer to prove absence (docs/design.md, "A fence is a tombstone");
    ``tombstone_refusals`` counts the creates it refused.
    """

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        lookup: bool = True,
        dry_run: bool = False,
        delay_seconds: float = 0.05,
        read_lag_seconds: float = 0.5,
        dedupe: bool = True,
        fenced_lookup: bool = False,
    ):
        self.host, self._port = host, port
        self.delay_seconds = delay_seconds
        self.read_lag_seconds = read_lag_seconds
        self._cond = threading.Condition()
        self._lookup = lookup
        self._dry_run = dry_run
        self.dedupe = dedupe
        self.fenced_lookup = fenced_lookup
        self._tombstones: set[str] = set()
        self._tombstone_refusals = 0
        self._ids = itertools.count(1)
        self._objects: dict[str, dict[str, Any]] = {}
        self._by_key: dict[str, str] = {}
        self._visible_at: dict[str, float] = {}
        self._creates_by_key: collections.Counter[str] = collections.Counter()
        self._faults_applied: collections.Counter[str] = collections.Counter()
        self._requests = 0
        self._creates = 0
        self._deletes = 0
        self._updates = 0
        self._retraction_faults: collections.deque[str] = collections.deque()
        self._planned: collections.deque[Fault] = collections.deque()
        self._mix: list[tuple[str, float]] = []
        self._rng = random.Random()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> PlatformSink:
        """Bind and serve in a daemon thread. Raises ``RuntimeError`` if already started, ``OSError`` if binding fails."""
        if self._server is not None:
            raise RuntimeError("sink already started")
        server = _Server((self.host, self._port), _Handler)
        server.sink = self
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}, name="atmostonce-sink", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the listening socket. Idempotent."""
        server, self._server = self._server, None
        if server is None:
            return
        server.shutdown()
        server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> PlatformSink:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The bound port. Raises ``RuntimeError`` before :meth:`start`."""
        if self._server is None:
            raise RuntimeError("sink not started")
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``. Raises ``RuntimeError`` before :meth:`start`."""
        return f"http://{self.host}:{self.port}"

    # ---------------------------------------------------------------- switches and faults
    @property
    def lookup_enabled(self) -> bool:
        with self._cond:
            return self._lookup

    @lookup_enabled.setter
    def lookup_enabled(self, value: bool) -> None:
        with self._cond:
            self._lookup = bool(value)

    @property
    def dry_run(self) -> bool:
        with self._cond:
            return self._dry_run

    @dry_run.setter
    def dry_run(self, value: bool) -> None:
        with self._cond:
            self._dry_run = bool(value)

    def plan(self, fault: str, seconds: float | None = None) -> None:
        """Queue ``fault`` for the next create request not yet given one (FIFO).

        ``seconds`` is for ``delay`` / ``read_lag`` (default: ``delay_seconds`` /
        ``read_lag_seconds``). Raises ``ValueError`` for an unknown kind or negative seconds.
        """
        if fault not in FAULTS:
            raise ValueError(f"unknown fault {fault!r}; one of {FAULTS}")
        if seconds is not None and seconds < 0:
            raise ValueError("seconds must be >= 0")
        with self._cond:
            self._planned.append(Fault(fault, self._seconds_for(fault, seconds)))

    def set_fault_mix(self, mix: Mapping[str, float], seed: int | None = None) -> None:
        """Give each create request without a planned fault ``mix[kind]`` probability of that fault.

        Ratios are in [0, 1] and sum to at most 1; the rest proceed normally.
        ``seed`` makes the draw sequence reproducible. An empty mix turns it off.
        Raises ``ValueError`` for an unknown kind or bad ratios.
        """
        items = sorted(mix.items())
        for kind, ratio in items:
            if kind not in FAULTS or kind == "none":
                raise ValueError(f"unknown fault {kind!r}")
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 <= ratio <= 1:
                raise ValueError(f"ratio for {kind!r} must be in [0, 1], got {ratio!r}")
        if sum(r for _, r in items) > 1 + 1e-9:
            raise ValueError("fault ratios sum to more than 1")
        with self._cond:
            self._mix = [(k, float(r)) for k, r in items]
            self._rng = random.Random(seed)

    def edit(self, object_id: str, body: dict[str, Any]) -> None:
        """Change a stored object's body, as a person editing the post on the platform would (for tests).
        Raises ``KeyError`` for an unknown id."""
        with self._cond:
            self._objects[object_id]["body"] = dict(body)

    def settle_reads(self) -> None:
        """End every read lag now: objects created so far become visible to reads (for tests)."""
        with self._cond:
            self._visible_at.clear()

    def clear_faults(self) -> None:
        """Drop planned faults and the mix."""
        with self._cond:
            self._planned.clear()
            self._mix = []

    def _seconds_for(self, kind: str, seconds: float | None) -> float:
        if seconds is not None:
            return float(seconds)
        return {"delay": self.delay_seconds, "read_lag": self.read_lag_seconds}.get(kind, 0.0)

    # ---------------------------------------------------------------- counters
    @property
    def requests(self) -> int:
        with self._cond:
            return self._requests

    @property
    def creates(self) -> int:
        with self._cond:
            return self._creates

    @property
    def objects(self) -> dict[str, dict[str, Any]]:
        with self._cond:
            return {k: dict(v) for k, v in self._objects.items()}

    @property
    def creates_by_key(self) -> dict[str, int]:
        with self._cond:
            return dict(self._creates_by_key)

    @property
    def tombstone_refusals(self) -> int:
        """Create requests refused because a fenced lookup had tombstoned their key."""
        with self._cond:
            return self._tombstone_refusals

    def wait_for_tombstone_refusals(self, n: int, timeout: float) -> bool:
        """Block until ``tombstone_refusals >= n`` or ``timeout`` seconds pass; returns whether it was reached."""
        with self._cond:
            return self._cond.wait_for(lambda: self._tombstone_refusals >= n, timeout)

    @property
    def faults_applied(self) -> dict[str, int]:
        with self._cond:
            return dict(self._faults_applied)

    def wait_for_creates(self, n: int, timeout: float) -> bool:
        """Block until ``creates >= n`` or ``timeout`` seconds pass; returns whether it was reached."""
        with self._cond:
            return self._cond.wait_for(lambda: self._creates >= n, timeout)

    # ---------------------------------------------------------------- called by the handler
    def _begin_create(self) -> Fault | None:
        """Count a create request; ``None`` in dry run, else the fault to apply."""
        with self._cond:
            self._requests += 1
            if self._dry_run:
                return None
            if self._planned:
                return self._planned.popleft()
            if self._mix:
                draw, acc = self._rng.random(), 0.0
                for kind, ratio in self._mix:
                    acc += ratio
                    if draw < acc:
                        return Fault(kind, self._seconds_for(kind, None))
            return Fault("none")

    def _applied(self, fault: Fault) -> None:
        if fault.kind != "none":
            with self._cond:
                self._faults_applied[fault.kind] += 1

    def _write(self, body: dict[str, Any], key: str | None, lag: float) -> tuple[dict[str, Any], bool] | str | None:
        """Create (or find by ``key``) an object: ``(object, created)``; ``None`` in dry run;
        ``"fenced"`` when a fenced lookup has answered "not found" for ``key`` (its tombstone refuses
        every create with that key, whenever it arrived)."""
        with self._cond:
            if self._dry_run:
                return None
            if key is not None and key in self._tombstones:
                self._tombstone_refusals += 1
                self._cond.notify_all()
                return "fenced"
            existing = self._by_key.get(key) if key is not None and self.dedupe else None
            if existing is not None and existing in self._objects:
                return dict(self._objects[existing]), False
            oid = f"p{next(self._ids)}"
            obj = {"id": oid, "body": body, "idempotency_key": key}
            self._objects[oid] = obj
            if key is not None:
                self._by_key[key] = oid
            self._creates += 1
            dk = body.get("delivery_key")
            count_key = dk if isinstance(dk, str) else key
            if count_key is not None:  # a retry under the next fence epoch is the same delivery
                delivery, resend, _fence = split_platform_idempotency_key(count_key)
                count_key = platform_idempotency_key(delivery, resend)
            if count_key is not None:
                self._creates_by_key[count_key] += 1
            if lag > 0:
                self._visible_at[oid] = time.monotonic() + lag
            self._cond.notify_all()
            return dict(obj), True

    def _find(self, ident: str, *, by_key: bool) -> dict[str, Any] | None:
        with self._cond:
            oid = self._by_key.get(ident) if by_key else ident
            obj = self._objects.get(oid) if oid is not None else None
            if by_key and self.fenced_lookup:
                if obj is None:
                    self._tombstones.add(ident)  # for ever: no later create with this key may write
                    return None
                return dict(obj)
            if obj is None or time.monotonic() < self._visible_at.get(oid, 0.0):  # type: ignore[arg-type]  # obj: oid
                return None
            return dict(obj)

    def _next_retraction_fault(self) -> str | None:
        with self._cond:
            return self._retraction_faults.popleft() if self._retraction_faults else None

    def plan_retraction_fault(self, fault: str) -> None:
        """The next delete or correction meets ``fault``: ``drop_before_write``, ``drop_after_write`` or
        ``error_before_write``. Raises ``ValueError`` for another kind."""
        if fault not in ("drop_before_write", "drop_after_write", "error_before_write"):
            raise ValueError(f"unknown retraction fault {fault!r}")
        with self._cond:
            self._retraction_faults.append(fault)

    @property
    def deletes(self) -> int:
        with self._cond:
            return self._deletes

    @property
    def updates(self) -> int:
        with self._cond:
            return self._updates

    def _update(self, oid: str, body: dict[str, Any]) -> dict[str, Any] | None:
        with self._cond:
            obj = self._objects.get(oid)
            if obj is None:
                return None
            obj["body"] = body
            self._updates += 1
            return dict(obj)

    def _delete(self, oid: str) -> bool:
        with self._cond:
            obj = self._objects.pop(oid, None)
            if obj is None:
                return False
            self._deletes += 1
            self._visible_at.pop(oid, None)
            key = obj["idempotency_key"]
            if key is not None and self._by_key.get(key) == oid:
                del self._by_key[key]
            return True


def _parse_mix(text: str) -> dict[str, float]:
    mix: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        kind, _, ratio = part.partition("=")
        mix[kind.strip()] = float(ratio)
    return mix


def main(argv: list[str] | None = None) -> int:
    """``python -m atmostonce_http.sink``: serve until interrupted. Prints the URL on the first line."""
    ap = argparse.ArgumentParser(prog="python -m atmostonce_http.sink", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--no-lookup", action="store_true", help="answer GET /posts?key= with 501")
    ap.add_argument("--dry-run", action="store_true", help="refuse every create with 403")
    ap.add_argument("--fault-mix", default="", help="e.g. drop_after_write=0.1,delay=0.05")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--delay-seconds", type=float, default=0.05)
    ap.add_argument("--read-lag-seconds", type=float, default=0.5)
    args = ap.parse_args(argv)
    sink = PlatformSink(
        args.host,
        args.port,
        lookup=not args.no_lookup,
        dry_run=args.dry_run,
        delay_seconds=args.delay_seconds,
        read_lag_seconds=args.read_lag_seconds,
    )
    try:
        sink.set_fault_mix(_parse_mix(args.fault_mix), seed=args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    with sink:
        print(f"atmostonce sink listening on {sink.url}", flush=True)
        try:
            threading.Event().wait()
        except KeyboardInterrupt:
            pass
    print(f"requests={sink.requests} creates={sink.creates}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
