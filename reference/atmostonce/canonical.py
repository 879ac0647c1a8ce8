"""Canonical JSON bytes for intake, fast: :func:`canonical_bytes` writes the common case with the :mod:`json`
module's C encoder and everything else through :func:`atmostonce.identity.canonical_json`, with the same bytes
and the same errors either way (docs/performance.md, "Python per publish").

The identities (delivery key, source version, claim, text digest) keep :func:`~atmostonce.identity.canonical_json`
itself: this module only spares the intake's own encodings of a request and of a JSON argument (the request's
stored form and digest, a descriptor, a detail), which are compared byte for byte with that function's output
(tests/test_identity_format.py)."""

from __future__ import annotations

import json
from typing import Any

from .identity import canonical_json

__all__ = ["canonical_bytes"]

_JCS_INT = 2**53 - 1  # RFC 8785 writes numbers as IEEE doubles: larger integers have no exact form
_PLAIN_DEPTH = 64  # deeper values take the checked path, which names a value too deep exactly as before
_ENCODE = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), sort_keys=True, allow_nan=False).encode


def _plain(v: Any, depth: int = 0) -> bool:
    """Whether ``v`` is JSON whose RFC 8785 form is what :mod:`json`'s encoder writes with sorted keys, no
    spaces and no ASCII escaping: objects (exactly ``dict``) with keys of exactly ``str`` inside the Basic
    Multilingual Plane (where sorting by code point and by UTF-16 unit agree), arrays (``list``, ``tuple``),
    strings (exactly ``str``) without NUL, booleans, ``None`` and integers (exactly ``int``) of at most 53 bits,
    nested at most :data:`_PLAIN_DEPTH` deep. Subclasses are not plain: their own ordering, items or conversions
    are what the checked path reads. Floats are not plain: RFC 8785 writes them as ECMAScript does, not as
    :func:`repr`."""
    t = type(v)
    if t is str:
        return "\x00" not in v
    if v is None or t is bool:
        return True
    if t is int:
        return bool(-_JCS_INT <= v <= _JCS_INT)
    if depth >= _PLAIN_DEPTH:
        return False
    if t is dict:
        for k, x in v.items():
            if type(k) is not str or "\x00" in k or (not k.isascii() and max(k) > "\uffff"):
                return False
            if not _plain(x, depth + 1):
                return False
        return True
    if t is list or t is tuple:
        return all(_plain(x, depth + 1) for x in v)
    return False


def canonical_bytes(value: Any) -> bytes:
    """:func:`~atmostonce.identity.canonical_json` of ``value``: the same RFC 8785 bytes, and for a value that has
    none the same :class:`~atmostonce.identity.IdentityError` (its ``code`` and ``field``), which it raises."""
    try:
        if _plain(value):  # the common case, by the C encoder
            return _ENCODE(value).encode("utf-8")
    except (UnicodeEncodeError, RecursionError):
        pass  # a lone surrogate, or a caller already deep in its stack: the checked path names it
    return canonical_json(value)
