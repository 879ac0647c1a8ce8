"""A Matrix transport: post one room event per intent, at most once (docs/matrix.md).

:class:`MatrixTransport` implements :class:`atmostonce.transport.Transport`
against the Matrix client-server API on httpx, with httpx retries off
(``HTTPTransport(retries=0)``), redirects not followed and keep-alive off, so
one :meth:`MatrixTransport.send` puts exactly one request on the wire. The
decisions, in short (docs/matrix.md has the long form):

* **txnId.** ``PUT /_matrix/client/v3/rooms/{room}/send/{type}/{txnId}`` with
  ``txnId = request.idempotency_key``: the delivery key, plus ``.r<epoch>``
  after an operator resend, so a deliberate resend is a new transaction and is
  not deduplicated away. The same key is embedded in the event content under
  ``org.atmostonce.delivery_key`` (:attr:`MatrixConfig.key_field`), which is
  what :meth:`lookup` searches for.
* **Device.** Synapse deduplicates a txnId per (user, device), not per access
  token. The transport chooses its device id once, persists it in a small JSON
  state file *before* logging in, and logs in with that ``device_id`` on every
  start, so a restarted publisher (new login, new token) is still the same
  device and a resend of the same txnId returns the existing event. It never
  logs out (logging out deletes the device and Synapse's txnId records with
  it). One transport at a time may use a state file (an ``flock``).
* **Window.** Synapse forgets a txnId about 24 h after it was first used
  (in-memory cache 30 min, database table 24 h, cleaned every 5 min).
  :attr:`MatrixConfig.resend_window_seconds` (default 23 h) stays below it:
  the transport journals the first time it sent each txnId (``<state>.txns``, one JSON line, fsynced before
  the bytes leave) and **refuses** to send a txnId again once that time is
  older than the window: :class:`NotSent` with row
  ``local:outside_resend_window``, no byte sent; likewise a txnId that another
  device first sent (``local:sent_by_another_device``: a lost state file).
  :meth:`resend_status` tells an operator the same before they act.
* **Fenced: no.** A lookup pages room history (``/messages``, newest first,
  filtered to this sender and event type) and stops after
  :attr:`MatrixConfig.lookup_max_events` events. Finding nothing proves
  nothing: a request held in a proxy or queued in the homeserver may still
  persist its event after the answer, and an older event may lie beyond the
  bound. So ``fenced_lookup`` is ``False``; a not-found leaves the intent
  ``indeterminate``. (A same-device same-txnId resend would be a fence only by
  posting the message, which is a resend, not a lookup; the runtime never
  resends an unknown outcome, and ``lookup`` is not given the body.)
* **Read-back.** ``GET /rooms/{room}/event/{eventId}``; :meth:`matches`
  compares the event content with the content sent (RFC 8785), key field
  included, and only for an event of the configured type from this user in
  this room. A reused txnId whose body differs gets the old event back: the
  comparison catches it (``read_back.differs``).
* **Classification.** ``spec/matrix_outcomes.toml``
  (:mod:`atmostonce_matrix.classify`): 429 ``M_LIMIT_EXCEEDED``,
  ``M_FORBIDDEN`` and other 4xx: not sent; 5xx, timeouts after writing and
  disconnects: unknown; 2xx with an ``event_id``: sent.

Capabilities: ``read_back=True, lookup_by_key=True, fenced_lookup=False``.
All durations in seconds.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import fcntl
import json
import math
import os
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx

from atmostonce.errors import AtMostOnceError
from atmostonce.identity import canonical_json, digest_bytes, platform_idempotency_key
from atmostonce.transport import (
    Capabilities,
    Found,
    LookupResult,
    NotFound,
    NotSent,
    ReadBackResult,
    SendResult,
    Sent,
    Unknown,
    WireRequest,
    retry_after_seconds,
)
from atmostonce_http.classify import Classification, error_kind

from .classify import MatrixOutcomeTable, matrix_outcome_table

__all__ = [
    "DEFAULT_RESEND_WINDOW",
    "KEY_FIELD",
    "MatrixConfig",
    "MatrixTransport",
    "MatrixTransportError",
    "ResendStatus",
]

KEY_FIELD = "org.atmostonce.delivery_key"
DEFAULT_RESEND_WINDOW = 23 * 3600.0
"""23 h: below Synapse's 24 h txnId retention, leaving an hour for clock skew and its 5-minute cleanup period."""
SYNAPSE_TXN_RETENTION = 24 * 3600.0
_STATE_FORMAT = 1


class MatrixTransportError(AtMostOnceError):
    """A login, read-back or lookup got no usable answer, or the state file cannot be used.

    Raised instead of returning :class:`NotFound`, so a failed lookup never
    passes for absence. ``status`` is the HTTP status (or ``None``), ``errcode``
    the Matrix error code when the homeserver sent one.
    """

    def __init__(self, message: str, status: int | None = None, errcode: str | None = None):
        super().__init__(message)
        self.status, self.errcode = status, errcode


def _positive(name: str, value: Any, *, integer: bool = False) -> None:
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if not ok or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive {'integer' if integer else 'number'}, got {value!r}")


@dataclass(frozen=True)
class MatrixConfig:
    """One room on one homeserver, posted to as one user from one persisted device.

    * ``homeserver_url``: ``http(s)://host[:port]`` of the client-server API (here: the fault proxy).
    * ``room_id``: ``!opaque:server`` (room version 12: ``!opaque``); the user must be joined.
    * ``user`` / ``password``: login for ``m.login.password`` (localpart or full ``@user:server``).
    * ``state_path``: JSON state file holding the device id; ``<state_path>.txns`` journals first sends.
    * ``event_type``: event type posted (``m.room.message``); the intent's request body is the event content.
    * ``key_field``: content field carrying the idempotency key (namespaced, ignored by clients).
    * ``resend_window_seconds``: how long after a txnId's first send a resend is still deduplicated (< 24 h).
    * ``lookup_max_events`` / ``lookup_page_size``: the lookup's bound, in events of ``event_type``
      sent by this user, newest first; and the page size of each ``/messages`` call.
    * ``connect_timeout`` / ``write_timeout`` / ``read_timeout``: seconds.
    * ``max_connections``: concurrent requests (one per worker thread is enough).
    """

    homeserver_url: str
    room_id: str
    user: str
    password: str = dataclasses.field(repr=False)
    state_path: str
    event_type: str = "m.room.message"
    key_field: str = KEY_FIELD
    device_display_name: str = "atmostonce publisher"
    resend_window_seconds: float = DEFAULT_RESEND_WINDOW
    lookup_max_events: int = 1000
    lookup_page_size: int = 100
    connect_timeout: float = 5.0
    write_timeout: float = 10.0
    read_timeout: float = 30.0
    max_connections: int = 32

    def __post_init__(self) -> None:
        if not isinstance(self.homeserver_url, str) or not self.homeserver_url.startswith(("http://", "https://")):
            raise ValueError(f"homeserver_url must be an http:// or https:// URL, got {self.homeserver_url!r}")
        if not isinstance(self.room_id, str) or not self.room_id.startswith("!") or len(self.room_id) < 2:
            raise ValueError(f"room_id must be a room id ('!opaque' or '!opaque:server'), got {self.room_id!r}")
        for name in ("user", "password", "state_path", "event_type", "key_field", "device_display_name"):
            value = getattr(self, name)
            if isinstance(value, os.PathLike):
                object.__setattr__(self, name, os.fspath(value))
            elif not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty string")
        for name in ("resend_window_seconds", "connect_timeout", "write_timeout", "read_timeout"):
            _positive(name, getattr(self, name))
        if self.resend_window_seconds >= SYNAPSE_TXN_RETENTION:
            raise ValueError(
                f"resend_window_seconds must be below Synapse's txnId retention ({SYNAPSE_TXN_RETENTION:.0f} s)"
            )
        for name in ("lookup_max_events", "lookup_page_size", "max_connections"):
            _positive(name, getattr(self, name), integer=True)

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> MatrixConfig:
        """Build from plain data (parsed JSON/TOML). Raises ``ValueError`` for unknown or missing keys."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown matrix config keys: {sorted(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ValueError(f"matrix config: {exc}") from exc

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            read_back=True,
            lookup_by_key=True,
            fenced_lookup=False,
        )


@dataclass(frozen=True)
class ResendStatus:
    """Whether sending ``txn_id`` now would be deduplicated against its first send.

    ``first_sent_at`` is wall-clock seconds and ``first_device_id`` the device
    that first sent it (both ``None``: never sent, so a send is a first send).
    :attr:`may_send` is what :meth:`MatrixTransport.send` enforces.
    """

    txn_id: str
    device_id: str
    first_sent_at: float | None
    first_device_id: str | None
    age_seconds: float | None
    window_seconds: float

    @property
    def within_window(self) -> bool:
        """Never sent, or first sent no longer than ``window_seconds`` ago."""
        return self.age_seconds is None or self.age_seconds <= self.window_seconds

    @property
    def same_device(self) -> bool:
        return self.first_device_id is None or self.first_device_id == self.device_id

    @property
    def may_send(self) -> bool:
        """A first send, or a resend that Synapse will answer with the existing event."""
        return self.first_sent_at is None or (self.same_device and self.within_window)


def _fsync_dir(path: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _event_id(value: Any) -> str | None:
    if isinstance(value, str) and value.startswith("$") and len(value) > 1 and not any(ord(c) < 33 for c in value):
        return value
    return None


class MatrixTransport:
    """The :class:`atmostonce.transport.Transport` for one Matrix room. See the module docstring.

    ``MatrixTransport(config)`` takes a :class:`MatrixConfig` or a mapping; it
    locks the state file, loads or creates the device id, and logs in (raises
    :class:`MatrixTransportError` if any of that fails, ``ValueError`` for a bad
    config). ``clock`` returns wall-clock seconds (the resend window is measured
    with it). Use as a context manager or call :meth:`close`.
    """

    name = "matrix"
    protocol_version = 1

    def __init__(
        self,
        config: MatrixConfig | Mapping[str, Any],
        *,
        table: MatrixOutcomeTable | None = None,
        clock: Callable[[], float] = time.time,
    ):
        self.config = config if isinstance(config, MatrixConfig) else MatrixConfig.from_mapping(config)
        self.capabilities: Capabilities = self.config.capabilities
        self._table = table if table is not None else matrix_outcome_table()
        self._clock = clock
        self._base = self.config.homeserver_url.rstrip("/")
        self._room = quote(self.config.room_id, safe="")
        self._login_lock = threading.Lock()
        self._journal_lock = threading.Lock()
        self._token: str | None = None
        self._closed = False
        cfg = self.config
        wire = httpx.HTTPTransport(
            retries=0,
            trust_env=False,
            limits=httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=0),
        )
        self._client = httpx.Client(
            transport=wire,
            timeout=httpx.Timeout(
                connect=cfg.connect_timeout, write=cfg.write_timeout, read=cfg.read_timeout, pool=cfg.connect_timeout
            ),
            follow_redirects=False,
            trust_env=False,
        )
        self.state_path = Path(cfg.state_path)
        self.journal_path = Path(cfg.state_path + ".txns")
        self._lock_file: Any = None
        self._journal_file: Any = None
        try:
            self._acquire_state_lock()
            self._state = self._load_or_create_state()
            self._journal = self._load_journal()
            self._journal_file = open(self.journal_path, "a", encoding="utf-8")  # closed in close()
            if self._journal_file.tell() and not _ends_with_newline(self.journal_path):
                self._journal_file.write("\n")  # end a line torn by a crash, so the next record stands alone
            self.login()
        except BaseException:
            self.close()
            raise

    # ---------------------------------------------------------------- state file and journal

    @property
    def send_timeout_seconds(self) -> float:
        """Seconds one send may wait in its phases added up (a free connection, connecting, writing, reading:
        ``connect_timeout * 2 + write_timeout + read_timeout``); a lower bound of the longest send (a login
        first, or a slow answer read in parts, takes longer). The dispatcher warns when its send lease is not
        longer (``atmostonce.runtime.Dispatcher``)."""
        cfg = self.config
        return cfg.connect_timeout * 2 + cfg.write_timeout + cfg.read_timeout

    def _acquire_state_lock(self) -> None:
        self.state_path.parent.mkdir(parents=True, exist_ok=True)
        f = open(str(self.state_path) + ".lock", "a+")  # held until close()
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            f.close()
            raise MatrixTransportError(
                f"state file {self.state_path} is in use by another transport (one device, one publisher at a time)"
            ) from exc
        self._lock_file = f

    def _write_state(self, state: Mapping[str, Any]) -> None:
        tmp = self.state_path.with_name(self.state_path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.state_path)
        _fsync_dir(self.state_path.parent)

    def _load_or_create_state(self) -> dict[str, Any]:
        if self.state_path.exists():
            try:
                state = json.loads(self.state_path.read_text("utf-8"))
            except ValueError as exc:
                raise MatrixTransportError(f"state file {self.state_path} is not JSON: {exc}") from exc
            if not isinstance(state, dict) or state.get("format") != _STATE_FORMAT or not state.get("device_id"):
                raise MatrixTransportError(f"state file {self.state_path} is not an atmostonce_matrix state file")
            return state
        # The device id is chosen here and written durably *before* the first login, so that a crash
        # between login and write cannot leave a device whose txnIds nobody can resend under.
        state = {
            "format": _STATE_FORMAT,
            "device_id": "ATMOSTONCE" + secrets.token_hex(5).upper(),
            "user": self.config.user,
            "user_id": None,
            "created_at": self._clock(),
        }
        self._write_state(state)
        return state

    def _load_journal(self) -> dict[str, tuple[float, str]]:
        """txnId -> (first send time, device). Lines of other devices are kept: a txnId first sent by
        another device (a lost or replaced state file) cannot be deduplicated by this one."""
        out: dict[str, tuple[float, str]] = {}
        if not self.journal_path.exists():
            return out
        with open(self.journal_path, encoding="utf-8") as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    row = json.loads(line)
                    txn, at, device = row["txn"], float(row["first_sent_at"]), row["device_id"]
                except (ValueError, KeyError, TypeError):
                    # a torn last line from a crash mid-append: the send after it never happened
                    continue
                if txn not in out:
                    out[txn] = (at, str(device))
        return out

    def _journal_first_send(self, txn: str, at: float) -> None:
        line = json.dumps({"txn": txn, "first_sent_at": at, "device_id": self._state["device_id"]}) + "\n"
        self._journal_file.write(line)
        self._journal_file.flush()
        os.fsync(self._journal_file.fileno())

    # ---------------------------------------------------------------- identity
    @property
    def device_id(self) -> str:
        return self._state["device_id"]

    @property
    def user_id(self) -> str | None:
        return self._state.get("user_id")

    @property
    def token_fingerprint(self) -> str | None:
        """A short digest of the current access token (to tell logins apart without showing the token)."""
        return digest_bytes(self._token.encode())[:12] if self._token else None

    def login(self) -> str:
        """Log in with the persisted device id; returns it. Raises :class:`MatrixTransportError`."""
        with self._login_lock:
            body = {
                "type": "m.login.password",
                "identifier": {"type": "m.id.user", "user": self.config.user},
                "password": self.config.password,
                "device_id": self.device_id,
                "initial_device_display_name": self.config.device_display_name,
            }
            try:
                r = self._client.post(self._base + "/_matrix/client/v3/login", json=body)
            except Exception as exc:
                raise MatrixTransportError(f"login failed: {type(exc).__name__}: {exc}") from exc
            doc = self._json(r)
            if r.status_code != 200 or not isinstance(doc.get("access_token"), str):
                raise MatrixTransportError(
                    f"login answered HTTP {r.status_code} {doc.get('errcode', '')}".strip(),
                    r.status_code,
                    doc.get("errcode"),
                )
            if doc.get("device_id") != self.device_id:
                raise MatrixTransportError(
                    f"the homeserver gave device {doc.get('device_id')!r}, not the persisted {self.device_id!r}: "
                    "txnId deduplication would not hold"
                )
            user_id = doc.get("user_id")
            if self._state.get("user_id") not in (None, user_id):
                raise MatrixTransportError(
                    f"state file {self.state_path} belongs to {self._state['user_id']}, not {user_id}"
                )
            if self._state.get("user_id") is None:
                self._state = {**self._state, "user_id": user_id}
                self._write_state(self._state)
            self._token = doc["access_token"]
            return self.device_id

    def _auth(self) -> dict[str, str]:
        if self._token is None:
            self.login()
        assert self._token is not None
        return {"Authorization": f"Bearer {self._token}"}

    @staticmethod
    def _json(response: httpx.Response) -> dict[str, Any]:
        try:
            doc = json.loads(response.content)
        except ValueError:
            return {}
        return doc if isinstance(doc, dict) else {}

    def _note_token(self, response: httpx.Response, doc: Mapping[str, Any]) -> None:
        if response.status_code == 401 and doc.get("errcode") == "M_UNKNOWN_TOKEN":
            self._token = None  # the next call logs in again, same device

    # ---------------------------------------------------------------- send
    def txn_id(self, request: WireRequest) -> str:
        """The Matrix transaction id for ``request``: its idempotency key (delivery key, ``.r<epoch>`` after a resend)."""
        return request.idempotency_key

    def wire_content(self, request: WireRequest) -> dict[str, Any]:
        """The event content sent for ``request``: a deep copy of its body plus the key at ``key_field``.

        Raises ``ValueError`` if the body already holds a different value at ``key_field``.
        """
        content = copy.deepcopy(dict(request.body))
        key = request.idempotency_key
        if content.get(self.config.key_field, key) != key:
            raise ValueError(f"the request body already sets {self.config.key_field!r} to another value")
        content[self.config.key_field] = key
        return content

    def resend_status(self, delivery_key: str, resend_epoch: int = 0) -> ResendStatus:
        """Whether a send of this key and epoch is inside the declared window (see :class:`ResendStatus`)."""
        txn = WireRequest(body={}, delivery_key=delivery_key, resend_epoch=resend_epoch).idempotency_key
        with self._journal_lock:
            return self._status(txn)

    def _status(self, txn: str) -> ResendStatus:
        first = self._journal.get(txn)
        if first is None:
            return ResendStatus(txn, self.device_id, None, None, None, self.config.resend_window_seconds)
        at, device = first
        age = max(0.0, self._clock() - at)
        return ResendStatus(txn, self.device_id, at, device, age, self.config.resend_window_seconds)

    def _result(self, c: Classification, detail: str, event_id: str | None = None, digest: str | None = None):
        if c.outcome == "success" and event_id is not None:
            return Sent(event_id, digest)
        if c.outcome == "not_sent":
            return NotSent(f"{c.row}: {detail}")
        return Unknown(f"{c.row}: {detail}")

    def send(self, request: WireRequest) -> SendResult:
        """PUT the event once under ``txn_id(request)`` and classify the result; never raises for a
        network or HTTP failure.

        Before any byte: a txnId first sent by another device is refused
        (``local:sent_by_another_device``), one first sent longer ago than the
        resend window too (``local:outside_resend_window``); a first send is journalled
        (fsync) or refused (``local:journal_unwritable``); without a token the
        transport logs in (``local:not_logged_in`` if that fails).
        """
        if self._closed:
            return self._result(self._table.for_error("invalid_request"), "the transport is closed")
        try:
            txn = self.txn_id(request)
            data = canonical_json(self.wire_content(request))
            url = (
                f"{self._base}/_matrix/client/v3/rooms/{self._room}/send/"
                f"{quote(self.config.event_type, safe='')}/{quote(txn, safe='')}"
            )
        except Exception as exc:  # not canonicalisable, bad key field: nothing was opened
            return self._result(self._table.for_error("invalid_request"), f"{type(exc).__name__}: {exc}")
        try:
            headers = self._auth() | {"Content-Type": "application/json"}
        except MatrixTransportError as exc:
            return self._result(self._table.for_local("not_logged_in"), str(exc))
        with self._journal_lock:
            status = self._status(txn)
            if not status.same_device:
                return self._result(
                    self._table.for_local("sent_by_another_device"),
                    f"txnId {txn} was first sent by device {status.first_device_id}, this is {self.device_id}",
                )
            if not status.within_window:
                return self._result(
                    self._table.for_local("outside_resend_window"),
                    f"txnId {txn} was first sent {status.age_seconds:.0f} s ago by device {self.device_id}; "
                    f"the declared resend window is {self.config.resend_window_seconds:.0f} s",
                )
            if status.first_sent_at is None:
                now = self._clock()
                try:
                    self._journal_first_send(txn, now)
                except (OSError, ValueError) as exc:
                    return self._result(self._table.for_local("journal_unwritable"), f"{type(exc).__name__}: {exc}")
                self._journal[txn] = (now, self.device_id)
        try:
            response = self._client.put(url, content=data, headers=headers)
        except Exception as exc:  # classified by the table; anything unrecognised is "other" -> unknown
            return self._result(self._table.for_error(error_kind(exc)), f"{type(exc).__name__}: {exc}")
        doc = self._json(response)
        self._note_token(response, doc)
        event_id = _event_id(doc.get("event_id"))
        errcode = doc.get("errcode") if isinstance(doc.get("errcode"), str) else None
        c = self._table.for_response(response.status_code, errcode, has_id=event_id is not None)
        detail = f"HTTP {response.status_code}" + (f" {errcode}" if errcode else "")
        retry_after = None
        if response.status_code == 429:
            ms = doc.get("retry_after_ms")
            if "retry_after_ms" in doc:
                detail += f" retry_after_ms={str(ms)[:64]}"
                if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:  # NaN is not >= 0
                    try:
                        retry_after = float(ms) / 1000.0
                    except OverflowError:  # an integer beyond a float: a pause of ever
                        retry_after = float("inf")
            if retry_after is None and "retry-after" in response.headers:
                if "retry_after_ms" not in doc:
                    detail += f" Retry-After={response.headers['retry-after'][:64]}"
                retry_after = retry_after_seconds(response.headers["retry-after"], response.headers.get("date"))
        result = self._result(c, detail, event_id, digest_bytes(response.content))
        if retry_after is not None and isinstance(result, NotSent):  # the retry waits at least that long
            result = NotSent(result.reason, retry_after=retry_after)
        return result

    # ---------------------------------------------------------------- read back / lookup
    def _get(self, path: str, what: str, params: Mapping[str, str] | None = None) -> tuple[httpx.Response, dict]:
        if self._closed:
            raise MatrixTransportError(f"{what}: the transport is closed")
        try:
            response = self._client.get(self._base + path, params=params, headers=self._auth())
        except MatrixTransportError:
            raise
        except Exception as exc:
            raise MatrixTransportError(f"{what} failed: {type(exc).__name__}: {exc}") from exc
        doc = self._json(response)
        self._note_token(response, doc)
        return response, doc

    def _ours(self, event: Mapping[str, Any]) -> bool:
        return (
            event.get("type") == self.config.event_type
            and event.get("sender") == self.user_id
            and event.get("room_id", self.config.room_id) == self.config.room_id
            and isinstance(event.get("content"), dict)
        )

    def read_back(self, remote_id: str) -> ReadBackResult:
        """``GET /rooms/{room}/event/{eventId}``: :class:`Found` with the content, :class:`NotFound` on 404.

        ``Found.body`` is ``None`` (never matches) for an event of another type,
        sender or room. Raises :class:`MatrixTransportError` on a network
        failure or another status.
        """
        response, doc = self._get(
            f"/_matrix/client/v3/rooms/{self._room}/event/{quote(remote_id, safe='')}", "read-back"
        )
        if response.status_code == 200:
            return Found(remote_id, dict(doc["content"]) if self._ours(doc) else None)
        if response.status_code == 404:
            return NotFound(f"HTTP 404 {doc.get('errcode', '')}".strip())
        raise MatrixTransportError(
            f"read-back got HTTP {response.status_code} {doc.get('errcode', '')}".strip(),
            response.status_code,
            doc.get("errcode"),
        )

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        """Find the event sent under this key and epoch in the room's history, newest first.

        Pages ``/messages`` (filtered to ``event_type`` and this user) and
        compares ``content[key_field]`` with the idempotency key; stops after
        ``lookup_max_events`` events. Returns :class:`Found` or
        :class:`NotFound` (never proof of absence: ``fenced_lookup`` is
        ``False``). Raises :class:`MatrixTransportError` when a page fails.
        """
        key = platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)
        if self.user_id is None:
            self.login()
        filt = json.dumps({"types": [self.config.event_type], "senders": [self.user_id]}, separators=(",", ":"))
        scanned, token = 0, None
        bound = self.config.lookup_max_events
        while scanned < bound:
            params = {"dir": "b", "limit": str(min(self.config.lookup_page_size, bound - scanned)), "filter": filt}
            if token is not None:
                params["from"] = token
            response, doc = self._get(f"/_matrix/client/v3/rooms/{self._room}/messages", "lookup", params)
            if response.status_code != 200:
                raise MatrixTransportError(
                    f"lookup got HTTP {response.status_code} {doc.get('errcode', '')}".strip(),
                    response.status_code,
                    doc.get("errcode"),
                )
            chunk = doc.get("chunk")
            if not isinstance(chunk, list):
                raise MatrixTransportError("lookup answered 200 without a chunk", 200)
            for event in chunk:
                if not isinstance(event, dict):
                    continue
                scanned += 1
                event_id = _event_id(event.get("event_id"))
                if event_id and self._ours(event) and event["content"].get(self.config.key_field) == key:
                    return Found(event_id, dict(event["content"]))
            token = doc.get("end")
            if not chunk or not isinstance(token, str):
                return NotFound(f"not in the room's history ({scanned} events of this sender scanned: all of them)")
        return NotFound(f"not among this sender's newest {bound} events (the lookup bound)")

    def matches(self, request: WireRequest, found: Found) -> bool:
        """Whether ``found.body`` equals the content sent for ``request`` (RFC 8785), key field included."""
        if found.body is None:
            return False
        try:
            return canonical_json(self.wire_content(request)) == canonical_json(dict(found.body))
        except Exception:
            return False

    def close(self) -> None:
        """Close connections and release the state file. Does not log out (that would delete the device)."""
        self._closed = True
        self._client.close()
        for f in (self._journal_file, self._lock_file):
            if f is not None:
                with contextlib.suppress(OSError):
                    f.close()
        self._journal_file = self._lock_file = None

    def __enter__(self) -> MatrixTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
