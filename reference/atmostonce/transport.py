"""The transport protocol: how the runtime talks to a platform (docs/design.md#no-automatic-resend, docs/design.md#response-is-not-proof).

A transport classifies every send into exactly one of three results, reads
objects back by remote id, and optionally looks a send up by its delivery key.
It declares its capabilities; only the runtime reads them.

Result shapes:

* :class:`Sent` (``remote_id``, ``response_digest``): the platform answered
  with an object id. Not proof yet: the runtime reads it back.
* :class:`NotSent` (``reason``): the transport can prove no byte reached the
  platform (connect refused, DNS failure, a documented 4xx rejection).
* :class:`Unknown` (``reason``): bytes may have left and no usable answer came.

``read_back(remote_id)`` returns :class:`Found` (with the object's canonical
body) or :class:`NotFound`. ``lookup(key, resend_epoch, fence_epoch)`` looks up the platform
idempotency key those compose (:func:`atmostonce.identity.platform_idempotency_key`, the key the
send went out under) and returns :class:`Found`, :class:`NotFound` or :class:`Unsupported`.

A transport must never retry on its own (docs/design.md#no-automatic-resend): one ``send`` call puts
at most one request on the wire.

:class:`AsyncTransport` is the same protocol for asyncio programs: ``send``, ``read_back`` and ``lookup``
are awaited, ``aclose`` closes it. A send task cancelled after authorization may already have written its
bytes, so it is never "not sent": whoever holds the send's lease records :func:`cancelled_send`, an
:class:`Unknown` (docs/design.md#the-outbox-service).
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from .identity import platform_idempotency_key

__all__ = [
    "AsyncTransport",
    "CANCELLED_SEND",
    "Capabilities",
    "Found",
    "LookupResult",
    "NotFound",
    "NotSent",
    "ReadBackResult",
    "SendResult",
    "Sent",
    "Transport",
    "Unknown",
    "Unsupported",
    "WireRequest",
    "cancelled_send",
    "retry_after_seconds",
]


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do.

    ``fenced_lookup``: a not-found answer of ``lookup`` proves absence. A transport may declare it
    only for a platform that keeps a **tombstone**: once its lookup has answered "absent" for an
    idempotency key, the platform refuses every later create carrying that key (one still in the
    network, a stale worker's, a proxy's replay). For ever; or for a retention R the platform
    documents, and then only if the platform also refuses, by its own clock, any create carrying the
    key that is older than R (a request-age bound it enforces, e.g. a signed timestamp), so that
    tombstone and age bound together still refuse every late create. The runtime cannot bound how
    long a network holds a request, so it has nothing else to respect: the declaration is the
    platform's promise. A lookup that fences only the requests that had already arrived proves
    nothing (docs/design.md, "A fence is a tombstone"). The retry after a fenced absence goes out
    under a fresh key (``WireRequest.fence_epoch``): the tombstone refuses the late original, not
    the retry.
    """

    read_back: bool = True
    lookup_by_key: bool = False
    fenced_lookup: bool = False
    retract: bool = False
    """The transport can delete or correct a published object by its remote id (a retraction, docs/platforms.md)."""


@dataclass(frozen=True)
class WireRequest:
    """The exact request the transport sends. ``body`` is JSON; its RFC 8785 digest is the request digest."""

    body: Mapping[str, Any]
    delivery_key: str
    resend_epoch: int = 0
    headers: Mapping[str, str] = field(default_factory=dict)
    action: str = "create"
    """``create`` (a new object), or for a retraction ``delete`` / ``correct`` the object ``object_id``."""
    object_id: str | None = None
    fence_epoch: int = 0
    """Bumped by each fenced absence (``reconcile_absent``): the retry after it goes out under a key the
    platform has not tombstoned (docs/design.md, "A fence is a tombstone")."""

    @property
    def idempotency_key(self) -> str:
        """The platform idempotency key (:func:`atmostonce.identity.platform_idempotency_key`): the
        delivery key plus the resend epoch (an operator re-send must not be deduplicated away) and
        the fence epoch (a retry after a fenced absence must not meet the tombstone)."""
        return platform_idempotency_key(self.delivery_key, self.resend_epoch, self.fence_epoch)


@dataclass(frozen=True)
class Sent:
    remote_id: str
    response_digest: str | None = None
    outcome: str = "send.success"


@dataclass(frozen=True)
class NotSent:
    """The platform proved nothing was taken. ``retry_after``: the seconds it asked to be left alone before the
    request comes again (an HTTP ``Retry-After``, Matrix's ``retry_after_ms``), or ``None``; the sweeper's
    retry of the intent waits at least that long (:class:`~atmostonce.runtime.RuntimeConfig`)."""

    reason: str
    outcome: str = "send.not_sent"
    retry_after: float | None = None


def retry_after_seconds(value: str | None, date: str | None = None, now: float | None = None) -> float | None:
    """The delay an HTTP ``Retry-After`` header asks for, in seconds (RFC 9110 section 10.2.3): a number of
    seconds (ASCII digits; one too large for a float is ``inf``), or an HTTP-date (read as GMT whatever zone it
    names, as HTTP dates are), counted from the response's ``Date`` header when it has one (the platform's clock
    on both sides, so the client's clock does not skew it) else from ``now`` (default: this machine's clock). A
    date in the past is 0. Returns ``None`` for a missing or unreadable value; never raises."""
    if value is None:
        return None
    text = value.strip()
    if text.isascii() and text.isdigit():
        try:
            return float(int(text))
        except (ValueError, OverflowError):  # more digits than int() reads, or beyond a float: a pause of ever
            return float("inf")
    until = _http_date(text)
    if until is None:
        return None
    start = _http_date(date.strip()) if date is not None else None
    if start is None:
        import time

        start = time.time() if now is None else now
    return max(0.0, until - start)


def _http_date(text: str) -> float | None:
    """An HTTP-date (IMF-fixdate, RFC 850 or asctime) as a POSIX time, read as GMT; ``None`` if unreadable."""
    import datetime
    from email.utils import parsedate_to_datetime

    try:
        at = parsedate_to_datetime(text)
        if at.tzinfo is None:  # asctime and "-0000" carry no zone: HTTP dates are GMT (RFC 9110 section 5.6.7)
            at = at.replace(tzinfo=datetime.UTC)
        return at.timestamp()
    except (TypeError, ValueError, IndexError, OverflowError, OSError):
        return None


@dataclass(frozen=True)
class Unknown:
    reason: str
    outcome: str = "send.unknown"


@dataclass(frozen=True)
class Found:
    remote_id: str
    body: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class NotFound:
    reason: str = "not found"


@dataclass(frozen=True)
class Unsupported:
    reason: str = "lookup by key is not supported"


SendResult = Sent | NotSent | Unknown
ReadBackResult = Found | NotFound
LookupResult = Found | NotFound | Unsupported


@runtime_checkable
class Transport(Protocol):
    """``name`` and ``protocol_version`` identify the transport in recovery descriptors."""

    name: str
    protocol_version: int
    capabilities: Capabilities

    def send(self, request: WireRequest) -> SendResult: ...
    def read_back(self, remote_id: str) -> ReadBackResult: ...
    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult: ...
    def matches(self, request: WireRequest, found: Found) -> bool: ...
    def close(self) -> None: ...


@runtime_checkable
class AsyncTransport(Protocol):
    """:class:`Transport` for asyncio: the same results, awaited. ``send`` never retries (one await, at most
    one request on the wire) and lets a cancellation propagate unclassified (see :func:`cancelled_send`)."""

    name: str
    protocol_version: int
    capabilities: Capabilities

    def send(self, request: WireRequest) -> Awaitable[SendResult]: ...
    def read_back(self, remote_id: str) -> Awaitable[ReadBackResult]: ...
    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> Awaitable[LookupResult]: ...
    def matches(self, request: WireRequest, found: Found) -> bool: ...
    def aclose(self) -> Awaitable[None]: ...


CANCELLED_SEND = "send cancelled after authorization: bytes may have left"
"""The reason recorded for a send whose task was cancelled (:func:`cancelled_send`)."""


def cancelled_send(detail: str = "") -> Unknown:
    """What a send whose task was cancelled after authorization is: :class:`Unknown` (the table's
    ``send.unknown``), never :class:`NotSent`. A cancelled await may have written the request's bytes and the
    platform may have acted on them; only a look at the platform (reconciliation) or a person settles it."""
    return Unknown(CANCELLED_SEND + (f" ({detail})" if detail else ""))
