"""Any Python call as a transport: wrap a user's ``send``, ``read_back`` and ``lookup`` callables.

:class:`FunctionTransport` implements :class:`atmostonce.transport.Transport` for a platform reached
through an SDK (smtplib, a chat client, a payments client) instead of a REST API described as data.

* ``send(request)`` gets the :class:`atmostonce.transport.WireRequest` (``body``, ``delivery_key``,
  ``idempotency_key``: put the last into the platform's idempotency field, a ``Message-ID``, a
  ``txnId``) and makes ONE attempt (turn the SDK's own retries off). It returns the platform's id for
  the object (``str`` or ``int``), or an object carrying it (a mapping's ``"id"``, an object's ``.id``,
  or whatever ``remote_id(obj)`` extracts), or a :class:`Sent` / :class:`NotSent` / :class:`Unknown`
  it classified itself. A return without a usable id is unknown: the object cannot be named.
  An exception is classified by ``spec/exception_outcomes.toml`` (:mod:`atmostonce_function.classify`)
  plus ``extra_rows``; one nobody classified is unknown, never not sent.
* ``read_back(remote_id)`` (optional) returns the object as a mapping (compared over ``projection``
  with what was approved, ``atmostonce.projection``), or ``None`` when there is no such object.
* ``lookup(idempotency_key)`` (optional) returns ``None`` when nothing carries the key, else the
  object (a mapping, compared like a read-back) or its id. ``lookup_fenced=True`` only for a platform
  whose lookup leaves a tombstone (docs/design.md, "A fence is a tombstone").

A failing ``read_back`` or ``lookup`` raises :class:`FunctionTransportError` (never "not found").
The transport never retries: one :meth:`FunctionTransport.send` calls ``send`` exactly once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from atmostonce.errors import AtMostOnceError
from atmostonce.identity import canonical_json, digest_bytes, platform_idempotency_key
from atmostonce.projection import Comparison, check_projection
from atmostonce.records import exception_reason, storable_reason
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
    Unsupported,
    WireRequest,
)
from atmostonce_http.transport import compare_approved, usable_id

from .classify import ExceptionTable, exception_table

__all__ = ["FunctionTransport", "FunctionTransportError", "usable_id"]

_RESULTS: dict[str, type[NotSent] | type[Unknown]] = {NotSent.outcome: NotSent, Unknown.outcome: Unknown}


class FunctionTransportError(AtMostOnceError):
    """A read-back or lookup callable raised or answered something unusable: no evidence either way."""


def _default_remote_id(obj: Any) -> Any:
    if isinstance(obj, Mapping):
        return obj.get("id")
    if isinstance(obj, (str, int)):
        return obj
    return getattr(obj, "id", None)


class FunctionTransport:
    """The :class:`atmostonce.transport.Transport` around user callables (see the module docstring).

    ``name`` identifies the platform in recovery descriptors: keep it stable for one platform (the
    reconciler parks an intent sent under another name). ``projection``: pairs or a mapping of
    ``request pointer -> object pointer`` (empty: every top-level request field at the same name).
    ``extra_rows``: rows in the format of ``spec/exception_outcomes.toml``, consulted before the
    shipped rows of the same class; ``table`` replaces the shipped table.
    """

    protocol_version = 1

    def __init__(
        self,
        send: Callable[[WireRequest], Any],
        read_back: Callable[[str], Any] | None = None,
        lookup: Callable[[str], Any] | None = None,
        *,
        name: str = "function",
        projection: Any = (),
        remote_id: Callable[[Any], Any] | None = None,
        extra_rows: Iterable[Mapping[str, Any]] = (),
        table: ExceptionTable | None = None,
        lookup_fenced: bool = False,
        retract: bool = False,
        close: Callable[[], None] | None = None,
    ):
        if not callable(send):
            raise ValueError("send must be callable")
        for what, fn in (("read_back", read_back), ("lookup", lookup), ("remote_id", remote_id), ("close", close)):
            if fn is not None and not callable(fn):
                raise ValueError(f"{what} must be callable or None")
        if lookup_fenced and lookup is None:
            raise ValueError("lookup_fenced needs a lookup")
        if not isinstance(name, str) or not name:
            raise ValueError("name must be a non-empty string")
        self.name = name
        self._send, self._read_back, self._lookup, self._close = send, read_back, lookup, close
        self._remote_id = remote_id or _default_remote_id
        self.projection = check_projection(projection)
        base = table if table is not None else exception_table()
        extra = tuple(extra_rows)
        self.table: ExceptionTable = base.with_rows(extra) if extra else base
        self.capabilities = Capabilities(
            read_back=read_back is not None,
            lookup_by_key=lookup is not None,
            fenced_lookup=lookup_fenced,
            retract=retract,
        )

    # ---------------------------------------------------------------- send
    def classify(self, exc: BaseException) -> SendResult:
        """The result for an exception ``send`` raised: :class:`NotSent` or :class:`Unknown`, whose
        ``reason`` starts with the row that decided (``exception:builtins.ConnectionRefusedError: ...``)."""
        c = self.table.classify(exc)
        return _RESULTS[c.outcome](storable_reason(f"{c.row}: {exception_reason(exc)}"))

    def send(self, request: WireRequest) -> SendResult:
        """Call ``send(request)`` once; never raises for an :class:`Exception` the callable raised.

        A ``BaseException`` that is not an ``Exception`` (``KeyboardInterrupt``, ``SystemExit``) is not
        caught: the worker stops mid-send, and the sweeper turns the send lease into ``indeterminate``."""
        try:
            answer = self._send(request)
        except Exception as exc:  # classified by the table; anything it does not know is unknown
            return self.classify(exc)
        if isinstance(answer, (Sent, NotSent, Unknown)):
            return answer
        try:
            remote_id = usable_id(self._remote_id(answer))
        except Exception as exc:  # the send went through; only its id could not be read
            return Unknown(storable_reason(f"remote_id: {exception_reason(exc)}"))
        if remote_id is None:
            return Unknown(f"send returned no usable remote id ({type(answer).__name__})")
        return Sent(remote_id, _digest(answer))

    # ---------------------------------------------------------------- read back / lookup
    def _call(self, what: str, fn: Callable[[str], Any], arg: str) -> Any:
        try:
            return fn(arg)
        except Exception as exc:
            raise FunctionTransportError(f"{what} failed: {exception_reason(exc)}") from exc

    def read_back(self, remote_id: str) -> ReadBackResult:
        """:class:`Found` with the mapping ``read_back(remote_id)`` returned, or :class:`NotFound` for ``None``.

        Raises :class:`FunctionTransportError` without a read-back callable, when it raises, or when it
        returns anything else."""
        if self._read_back is None:
            raise FunctionTransportError("no read_back callable")
        answer = self._call("read-back", self._read_back, remote_id)
        if isinstance(answer, (Found, NotFound)):
            return answer
        if answer is None:
            return NotFound("read_back returned None")
        if not isinstance(answer, Mapping):
            raise FunctionTransportError(f"read_back returned a {type(answer).__name__}, not a mapping or None")
        return Found(remote_id, answer)

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        """Call ``lookup`` with the platform idempotency key those compose (the key the send carried).

        :class:`Unsupported` without a lookup callable; :class:`NotFound` for ``None``; :class:`Found`
        for a mapping (with its id) or an id. Raises :class:`FunctionTransportError` when the callable
        raises, or returns an object without a usable id."""
        if self._lookup is None:
            return Unsupported("no lookup callable")
        key = platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)
        answer = self._call("lookup", self._lookup, key)
        if isinstance(answer, (Found, NotFound, Unsupported)):
            return answer
        if answer is None:
            return NotFound("lookup returned None")
        try:
            remote_id = usable_id(self._remote_id(answer))
        except Exception as exc:
            raise FunctionTransportError(f"lookup: remote_id: {exception_reason(exc)}") from exc
        if remote_id is None:
            raise FunctionTransportError(f"lookup returned a {type(answer).__name__} without a usable id")
        return Found(remote_id, answer if isinstance(answer, Mapping) else None)

    def compare(self, request: WireRequest, found: Found) -> Comparison:
        """Compare ``found.body`` with what was approved (the request body; for a correction, the corrected
        body) over ``projection``. Fields the platform adds are never a mismatch."""
        return compare_approved(request, found, self.projection)

    def matches(self, request: WireRequest, found: Found) -> bool:
        return self.compare(request, found).match

    def close(self) -> None:
        """Call the ``close`` callable, if any."""
        if self._close is not None:
            self._close()

    def __enter__(self) -> FunctionTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _digest(answer: Any) -> str | None:
    if not isinstance(answer, Mapping):
        return None
    try:
        return digest_bytes(canonical_json(answer))
    except (TypeError, ValueError):
        return None
