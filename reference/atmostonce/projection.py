"""Read-back compares what was approved, not the platform's whole object (docs/design.md, "Read-back").

A platform answers a read-back with more than was sent: its own id, timestamps, an author, an HTML
rendering. None of that is a mismatch. What the delivery key and the approval digest cover is the
request, so a read-back confirms a send when the object holds the request's fields with the same
normalized values, and nothing else is compared.

A *projection* names the fields compared: pairs ``(request pointer, object pointer)`` of RFC 6901
JSON pointers, the first into the request body that was sent, the second into the body the platform
returns. With no projection every top-level field of the request is compared at the same name in the
object. Values are compared after :func:`atmostonce.identity.normalize_projection` (the text
normalizer the delivery key uses), as RFC 8785 canonical JSON.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .identity import IdentityError, canonical_json, normalize_projection
from .pointer import MISSING, pointer_get, split_pointer

__all__ = ["Comparison", "Projection", "check_projection", "compare", "default_projection"]

Projection = tuple[tuple[str, str], ...]
"""Pairs ``(request pointer, object pointer)``; empty: every top-level request field, at the same name."""


@dataclass(frozen=True)
class Comparison:
    """The result of comparing a read-back with the request.

    ``match``: every projected field is equal, or is a member absent from its object in both the request and
    the platform's object (an optional field this request did not carry), and at least one field was compared.
    ``field``: the request pointer of the first field that differs or is on one side only, or of the first
    field when none was compared (``None`` on a match, or ``""`` when the object is unreadable).
    ``sent`` / ``found``: the normalized projected values, by request pointer (a missing one is left out
    of ``found``); kept as evidence when the read-back does not confirm the send.
    """

    match: bool
    field: str | None
    sent: dict[str, Any] = dataclasses.field(default_factory=dict)  # (the class has a member named field)
    found: dict[str, Any] = dataclasses.field(default_factory=dict)

    def evidence(self) -> dict[str, Any]:
        """Plain JSON for the history: ``{"field": ..., "sent": {...}, "found": {...}}``."""
        return {"field": self.field, "sent": dict(self.sent), "found": dict(self.found)}


def _escape(name: str) -> str:
    return "/" + name.replace("~", "~0").replace("/", "~1")


def default_projection(body: Mapping[str, Any]) -> Projection:
    """Every top-level field of ``body``, compared at the same name (sorted, so the order is stable)."""
    return tuple((_escape(k), _escape(k)) for k in sorted(body))


def check_projection(pairs: Any) -> Projection:
    """``pairs`` as a :data:`Projection`: a mapping ``{request pointer: object pointer}`` or a sequence of
    pairs. Raises ``ValueError`` for anything else or a malformed pointer."""
    items = list(pairs.items()) if isinstance(pairs, Mapping) else pairs
    if isinstance(items, (str, bytes)) or not isinstance(items, Sequence):
        raise ValueError(
            f"a projection is a mapping or a list of (request pointer, object pointer) pairs, got {pairs!r}"
        )
    out = []
    for pair in items:
        if isinstance(pair, (str, bytes)) or not isinstance(pair, Sequence) or len(pair) != 2:
            raise ValueError(f"a projection entry is a (request pointer, object pointer) pair, got {pair!r}")
        a, b = pair
        if not isinstance(a, str) or not isinstance(b, str) or not split_pointer(a) or not split_pointer(b):
            raise ValueError(f"projection pointers must point inside a document (start with '/'), got {pair!r}")
        out.append((a, b))
    return tuple(out)


def _same(a: Any, b: Any) -> bool:
    try:
        return canonical_json(normalize_projection(a)) == canonical_json(normalize_projection(b))
    except (IdentityError, ValueError, TypeError):
        return False


def _shown(v: Any) -> Any:
    try:
        return normalize_projection(v)
    except (IdentityError, ValueError, TypeError):
        return repr(v)


def compare(sent: Mapping[str, Any], found: Mapping[str, Any] | None, projection: Projection = ()) -> Comparison:
    """Compare the request body ``sent`` with the platform's body ``found`` (``None``: unreadable) over
    ``projection`` (default: :func:`default_projection` of ``sent``). Never raises for odd values: an
    unreadable or non-canonicalisable value is a mismatch."""
    pairs = projection or default_projection(sent)
    if not isinstance(found, Mapping):
        return Comparison(False, "", {a: _shown(pointer_get(sent, a)) for a, _ in pairs}, {})
    first: str | None = None
    compared = 0
    s_out: dict[str, Any] = {}
    f_out: dict[str, Any] = {}
    for a, b in pairs:
        want, got = pointer_get(sent, a), pointer_get(found, b)
        s_out[a] = None if want is MISSING else _shown(want)
        if got is not MISSING:
            f_out[a] = _shown(got)
        if want is MISSING and got is MISSING and _absent_member(sent, a) and _absent_member(found, b):
            continue  # an optional member this request's object did not carry, nor the platform's
        compared += 1
        if first is None and (want is MISSING or got is MISSING or not _same(want, got)):
            first = a
    if first is None and compared == 0 and pairs:  # nothing was compared: nothing is confirmed
        first = pairs[0][0]
    return Comparison(first is None, first, s_out, f_out)


def _absent_member(doc: Any, pointer: str) -> bool:
    """Whether ``pointer`` names a member its parent object does not have (the parent itself resolves to an
    object): an optional field left out, not a pointer that fails on the document's shape."""
    tokens = split_pointer(pointer)
    parent: Any = doc
    for token in tokens[:-1]:
        parent = parent.get(token, MISSING) if isinstance(parent, Mapping) else MISSING
        if parent is MISSING:
            return False
    return isinstance(parent, Mapping) and bool(tokens) and tokens[-1] not in parent
