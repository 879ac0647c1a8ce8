"""A scripted in-memory platform for the runtime cases: it counts every request it receives.

The platform keeps no idempotency-key dedupe, so a resend is a visible second
object: a case that expects ``objects == 1`` after faults and maintenance is
checking that nothing was sent twice.

Faults a case can inject into one ``send`` (``fault.kind``):

* ``connect_refused``: nothing reaches the platform; the transport proves it (``send.not_sent``).
* ``error_before_write``: the request arrives, the platform fails before creating
  anything, and the answer is lost (``send.unknown``).
* ``error_after_write``: the object is created, then the answer is lost (``send.unknown``).
* ``read_lag``: the object is created and acknowledged, but the first read-back does not find it.
* ``read_back_differs``: the platform stores different content than was sent.

Lookup capabilities (``configure_platform``): ``none`` (read-back only), ``unfenced``
(a not-found lookup proves nothing) or ``fenced`` (a not-found lookup proves absence).
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from collections.abc import Mapping
from typing import Any

from ..identity import platform_idempotency_key
from ..transport import (
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

__all__ = ["LOOKUPS", "PLATFORM_FAULTS", "ScriptedPlatform"]

PLATFORM_FAULTS = ("connect_refused", "error_before_write", "error_after_write", "read_lag", "read_back_differs")
LOOKUPS = ("none", "unfenced", "fenced")


class ScriptedPlatform:
    """A :class:`~atmostonce.transport.Transport` over an in-memory platform with per-send faults."""

    name = "atmostonce.conformance.platform"
    protocol_version = 1

    def __init__(self, lookup: str = "none"):
        self.configure(lookup)
        self.received: Counter[str] = Counter()  # delivery key -> requests that reached the platform
        self.objects: dict[str, dict[str, Any]] = {}  # remote id -> object
        self._lagging: set[str] = set()
        self._ids = itertools.count(1)
        self.next_fault: str | None = None

    def configure(self, lookup: str) -> None:
        if lookup not in LOOKUPS:
            raise ValueError(f"lookup must be one of {LOOKUPS}, got {lookup!r}")
        self.lookup_mode = lookup
        self.capabilities = Capabilities(
            read_back=True, lookup_by_key=lookup != "none", fenced_lookup=lookup == "fenced"
        )

    # -- the transport protocol -----------------------------------------------------------
    def send(self, request: WireRequest) -> SendResult:
        fault, self.next_fault = self.next_fault, None
        if fault == "connect_refused":
            return NotSent("connect refused")
        self.received[request.delivery_key] += 1
        if fault == "error_before_write":
            return Unknown("server error before write; answer lost")
        rid = f"obj-{next(self._ids)}"
        body = copy.deepcopy(dict(request.body))
        if fault == "read_back_differs":
            body = {**body, "altered_by_platform": True}
        self.objects[rid] = {
            "delivery_key": request.delivery_key,
            "idempotency_key": request.idempotency_key,
            "body": body,
        }
        if fault == "error_after_write":
            return Unknown("connection reset after write")
        if fault == "read_lag":
            self._lagging.add(rid)
        return Sent(rid)

    def read_back(self, remote_id: str) -> ReadBackResult:
        if remote_id in self._lagging:
            self._lagging.discard(remote_id)
            return NotFound("not visible yet")
        obj = self.objects.get(remote_id)
        return NotFound() if obj is None else Found(remote_id, copy.deepcopy(obj["body"]))

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        if self.lookup_mode == "none":
            return Unsupported()
        want = platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)
        for rid, obj in self.objects.items():
            if obj["idempotency_key"] == want:
                return Found(rid, copy.deepcopy(obj["body"]))
        return NotFound()

    def matches(self, request: WireRequest, found: Found) -> bool:
        return found.body is not None and dict(found.body) == dict(request.body)

    def close(self) -> None:
        pass

    # -- what a case reads ------------------------------------------------------------------
    def counts(self, key: str | None = None) -> Mapping[str, int]:
        """``sends``: requests that reached the platform; ``objects``: objects it holds (for ``key``, or all)."""
        if key is None:
            return {"sends": sum(self.received.values()), "objects": len(self.objects)}
        return {
            "sends": self.received[key],
            "objects": sum(1 for o in self.objects.values() if o["delivery_key"] == key),
        }
