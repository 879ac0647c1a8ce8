"""RFC 6901 JSON pointers: just get and set on plain dicts and lists (used by projections and transports)."""

from __future__ import annotations

from typing import Any

__all__ = ["MISSING", "pointer_get", "pointer_set", "split_pointer"]

MISSING: Any = object()


def split_pointer(pointer: str) -> list[str]:
    """Tokens of ``pointer`` (``""`` is the whole document). Raises ``ValueError`` if it does not start with ``/``."""
    if pointer == "":
        return []
    if not pointer.startswith("/"):
        raise ValueError(f"JSON pointer must be empty or start with '/': {pointer!r}")
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer[1:].split("/")]


def _step(doc: Any, token: str) -> Any:
    if isinstance(doc, dict):
        return doc.get(token, MISSING)
    if isinstance(doc, list) and token.isdigit() and (token == "0" or not token.startswith("0")):
        i = int(token)
        return doc[i] if i < len(doc) else MISSING
    return MISSING


def pointer_get(doc: Any, pointer: str) -> Any:
    """The value at ``pointer``, or :data:`MISSING`."""
    for token in split_pointer(pointer):
        doc = _step(doc, token)
        if doc is MISSING:
            return MISSING
    return doc


def pointer_set(doc: dict[str, Any], pointer: str, value: Any) -> None:
    """Set ``value`` at ``pointer`` in place, creating missing objects. Raises ``ValueError`` on a non-object parent."""
    tokens = split_pointer(pointer)
    if not tokens:
        raise ValueError("cannot set the whole document")
    cur: Any = doc
    for token in tokens[:-1]:
        if not isinstance(cur, dict):
            raise ValueError(f"cannot set {pointer!r}: a parent is not an object")
        cur = cur.setdefault(token, {})
    if not isinstance(cur, dict):
        raise ValueError(f"cannot set {pointer!r}: the parent is not an object")
    cur[tokens[-1]] = value
