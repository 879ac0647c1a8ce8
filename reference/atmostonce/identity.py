"""The named identities (docs/design.md#identities), shared by the model and every store.

Four identities, each its own type and function:

* :class:`SourceVersion`: a source's stable id plus its normalized visible body.
* :class:`ClaimId`: a source version plus the claim's own normalized content.
* :class:`DeliveryKey`: account, action kind, target identity and the canonical
  request projection (docs/design.md#two-rows-intents-and-attempts).
* :class:`AttemptToken`: random per attempt, never content-derived.

The three content-derived ones are SHA-256 over RFC 8785 canonical JSON of a
domain-tagged tuple; no clock value ever enters them. Text is normalized by a
versioned normalizer (:data:`NORMALIZER_VERSION`) whose version is part of the
hashed tuple and is recorded beside every hash, so a new normalizer mints new
ids visibly instead of silently merging or splitting history.

Errors: :class:`IdentityError` (a ``ValueError``) for values that have no
canonical form: NaN or infinite floats, non-string object keys, NUL bytes,
lone surrogates, empty required parts. Its ``code`` (an
:class:`~atmostonce.errors.IdentityCode`) and ``field`` say which.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import unicodedata
from collections.abc import Callable
from html.parser import HTMLParser
from typing import Any, NewType

import rfc8785

from .errors import IdentityCode

__all__ = [
    "NORMALIZERS",
    "NORMALIZER_VERSION",
    "AttemptToken",
    "ClaimId",
    "DeliveryKey",
    "IdentityError",
    "SourceVersion",
    "attempt_token",
    "canonical_json",
    "claim_id",
    "delivery_key",
    "digest_bytes",
    "load_canonical",
    "normalize_projection",
    "normalize_text",
    "platform_idempotency_key",
    "split_platform_idempotency_key",
    "raw_digest",
    "request_digest",
    "source_version",
    "text_digest",
    "visible_text",
]

NORMALIZER_VERSION = 1
"""Version of :func:`normalize_text`. Bump it (never edit v1 in place) when the rules change."""

DeliveryKey = NewType("DeliveryKey", str)
AttemptToken = NewType("AttemptToken", str)
SourceVersion = NewType("SourceVersion", str)
ClaimId = NewType("ClaimId", str)


class IdentityError(ValueError):
    """A value has no canonical form and cannot take part in an identity.

    Attributes: ``code`` (an :class:`~atmostonce.errors.IdentityCode`) and ``field`` (the part at fault, e.g.
    ``"target"`` or ``"version"``, or the path inside a JSON value, e.g. ``"$.at[0]"``; ``None`` when the
    value as a whole is at fault)."""

    def __init__(self, message: str, *, code: IdentityCode, field: str | None = None):
        self.code, self.field = code, field
        super().__init__(message)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "field": self.field}


# Characters a reader cannot see: zero-width space, zero-width no-break space (BOM), soft hyphen,
# word joiner, invisible separators. ZWJ (U+200D) and ZWNJ (U+200C) stay: they change how emoji
# and some scripts render.
_INVISIBLE = re.compile("[\u200b\ufeff\u00ad\u2060\u2061\u2062\u2063\u2064\u180e]")
_SPACES = "\t\u00a0\u1680\u2000-\u200a\u202f\u205f\u3000"
_TRAILING_WS = re.compile(f"[ {_SPACES}]+$", re.MULTILINE)
_INNER_WS = re.compile(f"[ {_SPACES}]+")
_BLANK_RUNS = re.compile(r"\n{3,}")


def _check_text(s: str, what: str) -> None:
    if "\x00" in s:
        raise IdentityError(f"{what} contains a NUL byte", code=IdentityCode.NUL_BYTE, field=what)
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise IdentityError(
            f"{what} contains a lone surrogate at index {exc.start}", code=IdentityCode.LONE_SURROGATE, field=what
        ) from exc


def normalize_text(text: str, version: int | None = None) -> str:
    """Normalize text for comparison and hashing with normalizer ``version`` (default: the current one).

    v1 rules, in order: Unicode NFC; invisible characters (zero-width space,
    BOM, soft hyphen, word joiner) are dropped; CRLF and lone CR become LF;
    tabs and the Unicode space characters (no-break, narrow, em/en, ideographic,
    ...) inside a line fold to one space; trailing spaces of
    each line are dropped; three or more newlines fold to two (one blank line);
    leading and trailing blank space of the whole text is dropped. Case and
    punctuation are kept: they change what a reader sees.

    Raises :class:`IdentityError` for NUL bytes, lone surrogates, or an unknown version.
    """
    version = NORMALIZER_VERSION if version is None else version
    fn = NORMALIZERS.get(version)
    if fn is None:
        raise IdentityError(f"unknown normalizer version {version}", code=IdentityCode.UNKNOWN_VERSION, field="version")
    if not isinstance(text, str):
        raise IdentityError(f"text must be str, not {type(text).__name__}", code=IdentityCode.NOT_STRING, field="text")
    _check_text(text, "text")
    return fn(text)


def _normalize_v1(text: str) -> str:
    if not isinstance(text, str):
        raise IdentityError(f"text must be str, not {type(text).__name__}", code=IdentityCode.NOT_STRING, field="text")
    _check_text(text, "text")
    t = unicodedata.normalize("NFC", text)
    t = _INVISIBLE.sub("", t)
    t = t.replace("\r\n", "\n").replace("\r", "\n")
    t = _TRAILING_WS.sub("", t)
    t = _INNER_WS.sub(" ", t)
    t = _BLANK_RUNS.sub("\n\n", t)
    return t.strip()


def _canonical_value(v: Any, path: str) -> Any:
    if isinstance(v, bool) or v is None:
        return v
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            raise IdentityError(
                f"{path}: NaN and infinities have no canonical JSON form", code=IdentityCode.NOT_FINITE, field=path
            )
        return v
    if isinstance(v, str):
        _check_text(v, path)
        return v
    if isinstance(v, dict):
        out = {}
        for k, x in v.items():
            if not isinstance(k, str):
                raise IdentityError(
                    f"{path}: object keys must be strings, got {type(k).__name__}",
                    code=IdentityCode.KEY_NOT_STRING,
                    field=path,
                )
            _check_text(k, f"{path} key")
            out[k] = _canonical_value(x, f"{path}.{k}")
        return out
    if isinstance(v, (list, tuple)):
        return [_canonical_value(x, f"{path}[{i}]") for i, x in enumerate(v)]
    raise IdentityError(f"{path}: {type(v).__name__} is not JSON-serializable", code=IdentityCode.NOT_JSON, field=path)


def canonical_json(value: Any) -> bytes:
    """RFC 8785 (JCS) canonical JSON bytes of ``value``.

    Raises :class:`IdentityError` for NaN, infinities, non-string keys,
    non-JSON types, NUL bytes and lone surrogates.
    """
    try:
        checked = _canonical_value(value, "$")
    except RecursionError as exc:
        raise IdentityError("value is nested too deeply", code=IdentityCode.TOO_DEEP) from exc
    try:
        return rfc8785.dumps(checked)
    except (rfc8785.CanonicalizationError, ValueError, TypeError, RecursionError) as exc:  # e.g. integers out of range
        raise IdentityError(f"no canonical JSON form: {exc}", code=IdentityCode.NOT_CANONICAL) from exc


_SAFE_INT = 2**53


def _parse_int(text: str) -> int | float:
    n = int(text)
    # RFC 8785 writes large floats (1e16) without an exponent; integers that big are refused on the way in
    return float(n) if abs(n) >= _SAFE_INT else n


def load_canonical(raw: str | bytes) -> Any:
    """Parse canonical JSON back into the values it was made from (exact round trip of :func:`canonical_json`)."""
    return json.loads(raw, parse_int=_parse_int)


def digest_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data`` (64 characters)."""
    return hashlib.sha256(data).hexdigest()


def _identity(domain: str, version: int, *parts: Any) -> str:
    return digest_bytes(canonical_json([domain, version, *parts]))


def _version(version: int | None) -> int:
    v = NORMALIZER_VERSION if version is None else version
    if v not in NORMALIZERS:
        raise IdentityError(f"unknown normalizer version {v}", code=IdentityCode.UNKNOWN_VERSION, field="version")
    return v


def normalize_projection(v: Any, version: int | None = None) -> Any:
    """``v`` with every string in it normalized by :func:`normalize_text` (objects and lists walked; other
    values kept): the form in which the delivery key hashes a request projection, and in which a read-back
    is compared with what was approved. Raises :class:`IdentityError` as :func:`normalize_text` does."""
    return _normalize_projection(v, _version(version))


def _normalize_projection(v: Any, version: int) -> Any:
    if isinstance(v, str):
        return normalize_text(v, version)
    if isinstance(v, dict):
        return {k: _normalize_projection(x, version) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_normalize_projection(x, version) for x in v]
    return v


def _require(name: str, value: str) -> None:
    if not isinstance(value, str) or not value.strip():
        code = IdentityCode.EMPTY if isinstance(value, str) else IdentityCode.NOT_STRING
        raise IdentityError(f"{name} must be a non-empty string", code=code, field=name)
    _check_text(value, name)


def delivery_key(
    account: str, action_kind: str, target: str, projection: Any, *, version: int | None = None
) -> DeliveryKey:
    """Stable key of one logical delivery (docs/design.md#two-rows-intents-and-attempts).

    ``projection`` is the canonical request you will send (JSON-like); its
    strings are normalized with :func:`normalize_text` before hashing, so NFC/NFD,
    CRLF/LF and trailing-space spellings share a key. Two action kinds with no
    text on the same target get distinct keys. Returns 64 hex characters.
    """
    _require("account", account)
    _require("action_kind", action_kind)
    _require("target", target)
    v = _version(version)
    return DeliveryKey(
        _identity("atmostonce/delivery-key", v, account, action_kind, target, _normalize_projection(projection, v))
    )


def platform_idempotency_key(delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> str:
    """The key a platform deduplicates (and tombstones) a create by: the delivery key, plus ``.r<n>``
    for an operator's resend epoch ``n`` and ``.f<m>`` for the fence epoch ``m`` (docs/design.md,
    "A fence is a tombstone"). Epoch 0 adds nothing, so a first send carries the bare delivery key.

    The one definition shared by the model, the stores (``Attempt.idempotency_key``) and every
    transport (``WireRequest.idempotency_key``). The delivery key itself never changes; each epoch
    bump mints a key no earlier request carried. Raises :class:`IdentityError` for an empty key or
    a negative or non-integer epoch.
    """
    _require("delivery_key", delivery_key)
    for name, n in (("resend_epoch", resend_epoch), ("fence_epoch", fence_epoch)):
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise IdentityError(
                f"{name} must be a non-negative integer, got {n!r}", code=IdentityCode.NOT_EPOCH, field=name
            )
    key = delivery_key
    if resend_epoch:
        key += f".r{resend_epoch}"
    if fence_epoch:
        key += f".f{fence_epoch}"
    return key


_EPOCH_SUFFIX = re.compile(r"^(?P<key>.+?)(?:\.r(?P<resend>[1-9][0-9]*))?(?:\.f(?P<fence>[1-9][0-9]*))?$", re.S)


def split_platform_idempotency_key(key: str) -> tuple[str, int, int]:
    """The inverse of :func:`platform_idempotency_key`: ``(delivery_key, resend_epoch, fence_epoch)``.

    For a platform or a test that must tell a duplicate of one delivery from its retry under the next
    fence epoch. Raises :class:`IdentityError` for an empty key."""
    _require("key", key)
    m = _EPOCH_SUFFIX.match(key)
    assert m is not None  # the pattern matches every non-empty string
    return m["key"], int(m["resend"] or 0), int(m["fence"] or 0)


def request_digest(wire: Any) -> str:
    """Digest of the exact outgoing request: SHA-256 of its RFC 8785 bytes (docs/design.md#approvals-and-per-target-dispatch-claims, docs/design.md#identities).

    Unlike the delivery key this is *not* normalized: an approval binds to bytes.
    """
    return digest_bytes(canonical_json(wire))


def source_version(source_id: str, body: str, *, version: int | None = None) -> SourceVersion:
    """Identity of one version of a source: stable id plus normalized visible body (docs/design.md#sources-and-the-freshness-fence)."""
    _require("source_id", source_id)
    v = _version(version)
    return SourceVersion(_identity("atmostonce/source-version", v, source_id, normalize_text(body, v)))


def claim_id(source: SourceVersion, content: Any, *, version: int | None = None) -> ClaimId:
    """Identity of a claim: the source version it rests on plus its own normalized content."""
    _require("source version", source)
    v = _version(version)
    return ClaimId(_identity("atmostonce/claim", v, source, _normalize_projection(content, v)))


def text_digest(text: str, *, version: int | None = None) -> str:
    """Digest of normalized text for the duplicate-text window (docs/design.md#the-duplicate-text-window); versioned like every identity."""
    v = _version(version)
    return _identity("atmostonce/text", v, normalize_text(text, v))


class _Visible(HTMLParser):
    _SKIP = {"script", "style", "noscript", "template", "head"}

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.depth = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self._SKIP:
            self.depth += 1
        elif tag in ("p", "br", "div", "li", "h1", "h2", "h3", "tr"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._SKIP and self.depth:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if not self.depth:
            self.parts.append(data)


def visible_text(html: str) -> str:
    """The text a reader sees in an HTML page: scripts, styles, the head and comments dropped.

    Page chrome that changes on every fetch (script tokens, timestamps in the head) then does not
    mint a new source version (docs/design.md#normalizer-versions).
    """
    parser = _Visible()
    parser.feed(html)
    parser.close()
    return "".join(parser.parts)


def raw_digest(raw: bytes) -> str:
    """Forensic hash of captured raw bytes: capture metadata, never an identity."""
    return digest_bytes(raw)


def attempt_token() -> AttemptToken:
    """A fresh random attempt token (128 bits, 32 hex characters)."""
    return AttemptToken(secrets.token_hex(16))


NORMALIZERS: dict[int, Callable[[str], str]] = {1: _normalize_v1}
"""Every normalizer still recognized, by version. A new version is added beside the old ones, never
over them: ``prepare_submission`` looks an intent up under every older version's key too, so a
normalizer change neither splits one delivery into two keys nor merges two deliveries into one."""
