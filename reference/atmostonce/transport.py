"""The transport protocol: how the runtime talks to a platform (seed 004 M3, M4).

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
body) or :class:`NotFound`. ``lookup(key)`` returns :class:`Found`,
:class:`NotFound` or :class:`Unsupported`.

A transport must never retry on its own (seed 004 M3): one ``send`` call puts
at most one request on the wire.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

__all__ = [
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
]


@dataclass(frozen=True)
class Capabilities:
    """What a transport can do. ``fenced_lookup``: a not-found lookup proves absence."""

    read_back: bool = True
    lookup_by_key: bool = False
    idempotent_resend: bool = False
    fenced_lookup: bool = False
    resend_window_seconds: float | None = None
    retract: bool = False
    """The transport can delete or correct a published object by its remote id (issue 5: a retraction)."""


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

    @property
    def idempotency_key(self) -> str:
        """Delivery key plus resend epoch: an operator re-send must not be deduplicated away (issue 4)."""
        return self.delivery_key if self.resend_epoch == 0 else f"{self.delivery_key}.r{self.resend_epoch}"


@dataclass(frozen=True)
class Sent:
    remote_id: str
    response_digest: str | None = None
    outcome: str = "send.success"


@dataclass(frozen=True)
class NotSent:
    reason: str
    outcome: str = "send.not_sent"


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
    def lookup(self, delivery_key: str, resend_epoch: int = 0) -> LookupResult: ...
    def matches(self, request: WireRequest, found: Found) -> bool: ...
    def close(self) -> None: ...
