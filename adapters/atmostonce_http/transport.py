"""An HTTP transport for any JSON REST API, configured by data (docs/design.md#no-automatic-resend, docs/design.md#response-is-not-proof).

:class:`HttpTransport` implements :class:`atmostonce.transport.Transport` on
httpx. One :meth:`HttpTransport.send` puts at most one request on the wire:
httpx retries are off (``HTTPTransport(retries=0)``), redirects are not
followed, and keep-alive is off so every send opens its own connection (a
stale pooled connection can never turn a clean refusal into an unknown).
Results are classified by the table in ``spec/http_outcomes.toml`` (see
:mod:`atmostonce_http.classify`).

:class:`HttpPlatformConfig` describes a platform: where to create, where the
object id comes back, how to read an object back and look one up by key.
All durations are in seconds.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import math
import re
import ssl
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, unquote, urlsplit

import httpx

from atmostonce.errors import AtMostOnceError
from atmostonce.identity import canonical_json, digest_bytes, platform_idempotency_key
from atmostonce.projection import Comparison, Projection, check_projection, compare
from atmostonce.records import usable_remote_id
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
    retry_after_seconds,
)

from ._pointer import MISSING, pointer_get, pointer_set, split_pointer
from .classify import Classification, OutcomeTable, error_kind, outcome_table

__all__ = ["AsyncHttpTransport", "HttpPlatformConfig", "HttpTransport", "HttpTransportError", "sink_config"]

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_BAD_VALUE = re.compile(r"[\r\n\x00]")
_METHODS = ("POST", "PUT", "PATCH")
_FRAMING = frozenset(
    {"content-length", "transfer-encoding", "host", "connection", "keep-alive", "te", "trailer", "upgrade"}
)


def compare_approved(request: WireRequest, found: Found, projection: Projection) -> Comparison:
    """Compare ``found.body`` with what was approved for ``request`` (its body; for a correction, the corrected
    body) over ``projection``; a correction without a corrected object is a mismatch. Shared by the transports
    whose read-back compares bodies."""
    sent = request.body.get("correction") if request.action == "correct" else request.body
    if not isinstance(sent, Mapping):
        return Comparison(False, "", {}, {})
    return compare(sent, found.body, projection)


def _json(content: bytes) -> Any:
    """``json.loads``, with a body nested too deeply for the parser (``RecursionError``) counted as not JSON
    (``ValueError``): an answer nobody can read, whatever its status."""
    try:
        return json.loads(content)
    except RecursionError as exc:
        raise ValueError("the JSON is nested too deeply to parse") from exc


class HttpTransportError(AtMostOnceError):
    """A read-back or lookup got no usable answer (network failure or unexpected status).

    Raised instead of returning :class:`NotFound`, so that a failed lookup can
    never pass for proven absence. ``status`` is the HTTP status, or ``None``.
    """

    def __init__(self, message: str, status: int | None = None):
        super().__init__(message)
        self.status = status


def _check_header(name: Any, value: Any) -> None:
    if not isinstance(name, str) or not _TOKEN.match(name):
        raise ValueError(f"invalid header name {name!r}")
    if name.lower() in _FRAMING:
        raise ValueError(f"header {name!r} is set by the transport, not by the caller")
    if not isinstance(value, str) or _BAD_VALUE.search(value):
        raise ValueError(f"invalid value for header {name!r}")


def _seconds(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


def _check_plain_type(name: str, hint: Any, value: Any) -> None:
    """``value`` (parsed JSON) has the plain type field ``name`` is annotated with; else ``ValueError``.
    A tuple field takes a JSON array (or, for ``headers`` and ``projection``, an object); what is inside
    it is checked by ``__post_init__``."""
    options = typing.get_args(hint) if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,)
    for t in options:
        t = typing.get_origin(t) or t
        if t is type(None) and value is None:
            return
        if t is bool and isinstance(value, bool):
            return
        if t is int and isinstance(value, int) and not isinstance(value, bool):
            return
        if t is float and isinstance(value, (int, float)) and not isinstance(value, bool):
            return
        if t is str and isinstance(value, str):
            return
        if t is tuple and (
            isinstance(value, (list, tuple)) or (name in _MAPPING_FIELDS and isinstance(value, Mapping))
        ):
            return
    want = " or ".join(_JSON_NAMES.get(typing.get_origin(t) or t, str(t)) for t in options)
    if name in _MAPPING_FIELDS:
        want += " or an object"
    raise ValueError(f"platform config {name} must be {want}, got {json.dumps(value, default=repr)}")


_MAPPING_FIELDS = frozenset({"headers", "projection"})
_JSON_NAMES = {str: "a string", bool: "true or false", int: "an integer", float: "a number", tuple: "an array"}
_JSON_NAMES[type(None)] = "null"


@dataclass(frozen=True)
class HttpPlatformConfig:
    """How to talk to one JSON REST platform. Immutable; every field is plain data.

    * ``base_url``: ``http://`` or ``https://`` origin plus optional prefix; paths are appended.
    * ``create_path`` / ``create_method``: where and how to create (POST, PUT or PATCH);
      ``{key}`` in the path is replaced by the URL-quoted idempotency key.
    * ``id_pointer``: RFC 6901 pointer to the object id in the create (and lookup) response
      body; or ``id_from_location=True`` to take the last path segment of ``Location``.
    * ``read_back_path``: template with ``{id}``; ``None`` disables read-back.
    * ``lookup_path``: template with ``{key}`` (the idempotency key); ``None``: no lookup.
    * ``delete_path`` / ``update_path`` (+ ``update_method``, PUT or PATCH): templates with ``{id}``
      for retractions (delete, correct) of a published object; ``None``: that retraction is unsupported.
    * ``body_pointer``: where the posted body sits in a read-back response (``""``: all of it).
    * ``projection``: which fields of the read-back object are compared with which fields of the request
      (pairs of RFC 6901 pointers ``(request pointer, object pointer)``, or a mapping of them; empty: every
      top-level request field at the same name). Only these are compared, after text normalization: the
      platform's own additions (ids, timestamps, renderings) are never a mismatch (``atmostonce.projection``).
    * ``lookup_id_pointer`` / ``lookup_body_pointer``: the id and the body in a lookup response (``None``:
      ``id_pointer`` and ``body_pointer``). A lookup answering a JSON array (a filtered collection, as
      ``GET /posts?key=...`` on most REST servers) is read as its one element; an empty array is "not found".
    * ``lookup_key_pointer``: where an object the lookup answers holds the idempotency key (``None``:
      ``key_field``, the body's copy of it). The lookup takes only an object holding the key it asked for:
      in an array, the element that holds it; an answer whose objects all hold other keys (the platform
      ignored the filter, or the path names the wrong parameter) and an array of several objects of which
      none can be told apart by the key are errors of the lookup, never "found" nor "not found"
      (docs/design.md#a-lookup-must-answer-for-its-key).
    * ``lookup_collection_pointer``: where that array sits when the platform wraps it (``"/data"`` for
      ``{"data": [...]}``, ``"/results"``, ...); the id and body pointers then point into the element found.
      An answer without an array there is an error of the lookup, never "not found". ``None``: the answer
      itself (an array, or the object found).
    * ``idempotency_header``: header carrying the idempotency key (``None``: not sent).
    * ``key_field``: pointer at which the idempotency key is embedded in the body (``None``: not embedded).
    * ``may_exist_statuses``: 4xx codes meaning "may already exist" (classified unknown).
    * ``connect_timeout`` / ``write_timeout`` / ``read_timeout``: seconds (connect also bounds waiting for a pool slot).
    * ``lookup_fenced``: a not-found lookup proves absence. Declare it only for a platform whose
      lookup leaves a tombstone: after answering "not found" for a key it refuses every later create
      carrying that key, for ever, or for a documented retention R together with its own refusal of
      any create with that key older than R (``Capabilities.fenced_lookup`` states the contract). A
      lookup that fences only the requests that had already arrived does not qualify: a request still
      in the network would land after the answer (docs/design.md, "A fence is a tombstone").
    * ``headers``: static extra headers as ``(name, value)`` pairs; ``verify`` / ``ca_file``: TLS checking;
      ``trust_env``: honour proxy environment variables (off: a proxy would blur the classification);
      ``max_connections``: concurrent sends.

    Raises ``ValueError`` on an invalid field.
    """

    base_url: str
    create_path: str = "/"
    create_method: str = "POST"
    id_pointer: str | None = "/id"
    id_from_location: bool = False
    read_back_path: str | None = None
    lookup_path: str | None = None
    delete_path: str | None = None
    update_path: str | None = None
    update_method: str = "PUT"
    body_pointer: str = ""
    projection: tuple[tuple[str, str], ...] = ()
    lookup_id_pointer: str | None = None
    lookup_body_pointer: str | None = None
    lookup_collection_pointer: str | None = None
    lookup_key_pointer: str | None = None
    idempotency_header: str | None = "Idempotency-Key"
    key_field: str | None = None
    may_exist_statuses: tuple[int, ...] = (409,)
    connect_timeout: float = 5.0
    write_timeout: float = 10.0
    read_timeout: float = 30.0
    lookup_fenced: bool = False
    headers: tuple[tuple[str, str], ...] = ()
    verify: bool = True
    ca_file: str | None = None
    trust_env: bool = False
    max_connections: int = 100

    def __post_init__(self) -> None:
        if not isinstance(self.base_url, str) or not re.match(r"^https?://[^/]", self.base_url):
            raise ValueError(f"base_url must be an http:// or https:// URL, got {self.base_url!r}")
        for name in ("create_path", "read_back_path", "lookup_path", "delete_path", "update_path"):
            path = getattr(self, name)
            if path is not None and (not isinstance(path, str) or not path.startswith("/")):
                raise ValueError(f"{name} must start with '/', got {path!r}")
        if self.read_back_path is not None and "{id}" not in self.read_back_path:
            raise ValueError("read_back_path must contain {id}")
        if self.lookup_path is not None and "{key}" not in self.lookup_path:
            raise ValueError("lookup_path must contain {key}")
        for name in ("delete_path", "update_path"):
            if getattr(self, name) is not None and "{id}" not in getattr(self, name):
                raise ValueError(f"{name} must contain {{id}}")
        if str(self.update_method).upper() not in ("PUT", "PATCH"):
            raise ValueError(f"update_method must be PUT or PATCH, got {self.update_method!r}")
        object.__setattr__(self, "update_method", str(self.update_method).upper())
        method = str(self.create_method).upper()
        if method not in _METHODS:
            raise ValueError(f"create_method must be one of {_METHODS}, got {self.create_method!r}")
        object.__setattr__(self, "create_method", method)
        if not self.id_from_location:
            if self.id_pointer is None:
                raise ValueError("set id_pointer or id_from_location=True")
            split_pointer(self.id_pointer)
        split_pointer(self.body_pointer)
        for name in ("lookup_id_pointer", "lookup_body_pointer", "lookup_collection_pointer", "lookup_key_pointer"):
            if getattr(self, name) is not None:
                split_pointer(getattr(self, name))
        object.__setattr__(self, "projection", check_projection(self.projection))
        if self.key_field is not None and not split_pointer(self.key_field):
            raise ValueError("key_field must point inside the body, e.g. '/idempotency_key'")
        if self.idempotency_header is not None:
            _check_header(self.idempotency_header, "x")
        statuses = tuple(self.may_exist_statuses)
        if not all(isinstance(s, int) and not isinstance(s, bool) and 400 <= s <= 499 for s in statuses):
            raise ValueError(f"may_exist_statuses must be 4xx integers, got {self.may_exist_statuses!r}")
        object.__setattr__(self, "may_exist_statuses", statuses)
        for name in ("connect_timeout", "write_timeout", "read_timeout"):
            _seconds(name, getattr(self, name))
        if self.lookup_fenced and self.lookup_path is None:
            raise ValueError("lookup_fenced needs a lookup_path")
        pairs = tuple(tuple(p) for p in self.headers)
        for pair in pairs:
            if len(pair) != 2:
                raise ValueError(f"headers must be (name, value) pairs, got {pair!r}")
            _check_header(*pair)
        object.__setattr__(self, "headers", pairs)
        if (
            isinstance(self.max_connections, bool)
            or not isinstance(self.max_connections, int)
            or self.max_connections < 1
        ):
            raise ValueError(f"max_connections must be a positive integer, got {self.max_connections!r}")

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> HttpPlatformConfig:
        """Build from plain data (e.g. parsed TOML/JSON). ``headers`` may be a mapping.

        Raises ``ValueError`` for data that is not a mapping, unknown keys, a missing ``base_url``, a value
        of the wrong JSON type for its field (a string where a boolean belongs, a number for a path) or an
        invalid value.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"platform config must be a JSON object of fields, got {type(data).__name__}")
        names = {f.name for f in dataclasses.fields(cls)}
        if not all(isinstance(k, str) for k in data):
            raise ValueError("platform config keys must be strings")
        unknown = set(data) - names
        if unknown:
            raise ValueError(f"unknown platform config keys: {sorted(unknown)}")
        if "base_url" not in data:
            raise ValueError("platform config needs base_url")
        hints = typing.get_type_hints(cls)
        for name, value in data.items():
            _check_plain_type(name, hints[name], value)
        kwargs = dict(data)
        if isinstance(kwargs.get("headers"), Mapping):
            kwargs["headers"] = tuple(kwargs["headers"].items())
        if "may_exist_statuses" in kwargs:
            kwargs["may_exist_statuses"] = tuple(kwargs["may_exist_statuses"])
        return cls(**kwargs)

    def as_mapping(self) -> dict[str, Any]:
        """Plain-data form; ``HttpPlatformConfig.from_mapping(c.as_mapping()) == c``."""
        out = dataclasses.asdict(self)
        out["may_exist_statuses"] = list(self.may_exist_statuses)
        out["headers"] = dict(self.headers)
        out["projection"] = [list(p) for p in self.projection]
        return out

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(
            read_back=self.read_back_path is not None,
            lookup_by_key=self.lookup_path is not None,
            fenced_lookup=self.lookup_fenced and self.lookup_path is not None,
            retract=self.delete_path is not None or self.update_path is not None,
        )


def sink_config(base_url: str, **overrides: Any) -> HttpPlatformConfig:
    """Config for :class:`atmostonce_http.sink.PlatformSink` at ``base_url``: the shipped profile
    ``spec/platforms/local_sink.toml`` with ``base_url`` filled in; ``overrides`` replace fields.

    The sink dedupes by ``Idempotency-Key`` but its
    lookup is not fenced: with read lag a missing object may still exist.
    """
    from .profile import load_profile  # the shipped profile spec/platforms/local_sink.toml

    cfg = load_profile("local_sink", base_url=base_url).config
    assert cfg is not None
    return dataclasses.replace(cfg, **overrides) if overrides else cfg


def usable_id(value: Any) -> str | None:
    """``value`` as a remote id, or ``None`` when it is not one the store can keep
    (:func:`atmostonce.records.usable_remote_id`, the rule the Dispatcher applies to every transport's answer)."""
    return usable_remote_id(value)


class _HttpCore:
    """What the sync and the async HTTP transports share: the config, the request they build, and how an
    answer is read (the outcome table of ``spec/http_outcomes.toml``, the id and body pointers). Only the
    client that puts the request on the wire differs; neither retries (``retries=0``, no redirects, no
    keep-alive)."""

    name = "http"
    protocol_version = 1

    def __init__(self, config: HttpPlatformConfig | Mapping[str, Any], *, table: OutcomeTable | None = None):
        self.config = config if isinstance(config, HttpPlatformConfig) else HttpPlatformConfig.from_mapping(config)
        self.capabilities: Capabilities = self.config.capabilities
        self._table = table if table is not None else outcome_table()
        self._base = self.config.base_url.rstrip("/")

    @property
    def send_timeout_seconds(self) -> float:
        """Seconds one send may wait in its phases added up: a free connection (bounded by ``connect_timeout``),
        connecting, writing, reading (``connect_timeout * 2 + write_timeout + read_timeout``). A lower bound of
        the longest send: each read is bounded, not the whole answer. The dispatcher warns when its send lease
        is not longer (``atmostonce.runtime.Dispatcher``)."""
        cfg = self.config
        return cfg.connect_timeout * 2 + cfg.write_timeout + cfg.read_timeout

    def _client_options(self) -> dict[str, Any]:
        """The keyword arguments of the httpx client (either kind); its transport is passed beside them."""
        cfg = self.config
        return {
            "timeout": httpx.Timeout(
                connect=cfg.connect_timeout, write=cfg.write_timeout, read=cfg.read_timeout, pool=cfg.connect_timeout
            ),
            "follow_redirects": False,
            "trust_env": cfg.trust_env,
            "headers": dict(cfg.headers),
        }

    def _wire_options(self) -> dict[str, Any]:
        """The keyword arguments of the httpx connection layer: no retries, no kept-alive connection."""
        cfg = self.config
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=cfg.ca_file) if cfg.ca_file else cfg.verify
        return {
            "retries": 0,
            "verify": verify,
            "trust_env": cfg.trust_env,
            "limits": httpx.Limits(max_connections=cfg.max_connections, max_keepalive_connections=0),
        }

    # ---------------------------------------------------------------- send
    def wire_body(self, request: WireRequest) -> dict[str, Any]:
        """The JSON document sent for ``request``: a deep copy of its body (for a correction, of the
        corrected body) with the key at ``key_field``.

        Raises ``ValueError`` if the key cannot be embedded or a correction has no corrected body.
        """
        source: Any = request.body  # the request body, or its correction (checked to be an object)
        if request.action == "correct":
            source = request.body.get("correction")
            if not isinstance(source, Mapping):
                raise ValueError("a correction needs a 'correction' object")
        body = copy.deepcopy(dict(source))
        if self.config.key_field is not None:
            pointer_set(body, self.config.key_field, request.idempotency_key)
        return body

    def _url(self, template: str, **values: str) -> str:
        path = template
        for name, value in values.items():
            path = path.replace("{" + name + "}", quote(value, safe=""))
        return self._base + path

    def _build(self, client: httpx.Client | httpx.AsyncClient, request: WireRequest) -> httpx.Request:
        if client.is_closed:
            raise ValueError("the transport is closed")
        content = canonical_json(self.wire_body(request))
        headers = httpx.Headers()
        for name, value in request.headers.items():
            _check_header(name, value)
            headers[name] = value
        headers["Content-Type"] = "application/json"  # item assignment replaces any casing
        if self.config.idempotency_header is not None:
            _check_header(self.config.idempotency_header, request.idempotency_key)
            headers[self.config.idempotency_header] = request.idempotency_key
        if request.action == "create":
            url = self._url(self.config.create_path, key=request.idempotency_key)
            return client.build_request(self.config.create_method, url, content=content, headers=headers)
        path = self.config.delete_path if request.action == "delete" else self.config.update_path
        if path is None or not request.object_id:
            raise ValueError(f"this platform config cannot {request.action} an object (no path, or no object id)")
        url = self._url(path, id=request.object_id)
        if request.action == "delete":
            return client.build_request("DELETE", url, headers=headers)
        return client.build_request(self.config.update_method, url, content=content, headers=headers)

    def _created_id(self, response: httpx.Response) -> str | None:
        if self.config.id_from_location:
            location = response.headers.get("location")
            if not location:
                return None
            segments = [s for s in urlsplit(location).path.split("/") if s]
            return usable_id(unquote(segments[-1])) if segments else None
        try:
            doc = _json(response.content)
        except ValueError:
            return None
        return usable_id(pointer_get(doc, self.config.id_pointer or ""))

    def _result(
        self, c: Classification, detail: str, remote_id: str | None = None, digest: str | None = None
    ) -> SendResult:
        if c.outcome == "success" and remote_id is not None:
            return Sent(remote_id, digest)
        if c.outcome == "not_sent":
            return NotSent(f"{c.row}: {detail}")
        return Unknown(f"{c.row}: {detail}")

    def _unprepared(self, exc: BaseException) -> SendResult:
        """A request that could not be built: nothing was sent (the ``invalid_request`` row)."""
        return self._result(self._table.for_error("invalid_request"), f"{type(exc).__name__}: {exc}")

    def _failed(self, exc: BaseException) -> SendResult:
        """The client raised while sending: classified by the table; anything unrecognised is "other" (unknown)."""
        return self._result(self._table.for_error(error_kind(exc)), f"{type(exc).__name__}: {exc}")

    def _answered(self, request: WireRequest, response: httpx.Response) -> SendResult:
        """Classify the platform's answer to ``request``."""
        if request.action != "create":  # a retraction acts on a known object: read-back decides
            if request.action == "delete" and response.status_code in (404, 410):
                return Sent(str(request.object_id), digest_bytes(response.content))  # already gone
            c = self._table.for_status(response.status_code, has_id=True, may_exist_statuses=())
            return self._result(c, f"HTTP {response.status_code}", request.object_id, digest_bytes(response.content))
        remote_id = self._created_id(response)
        c = self._table.for_status(
            response.status_code, has_id=remote_id is not None, may_exist_statuses=self.config.may_exist_statuses
        )
        result = self._result(c, f"HTTP {response.status_code}", remote_id, digest_bytes(response.content))
        if isinstance(result, NotSent) and "retry-after" in response.headers:
            # the platform took nothing and asked for a pause (a 429, a 503): the retry waits at least that long
            value = response.headers["retry-after"]
            seconds = retry_after_seconds(value, response.headers.get("date"))
            result = NotSent(f"{result.reason} Retry-After={value[:64]}", retry_after=seconds)
        return result

    # ---------------------------------------------------------------- read back / lookup
    def _body_of(self, response: httpx.Response) -> Mapping[str, Any] | None:
        try:
            doc = _json(response.content)
        except ValueError:
            return None
        body = pointer_get(doc, self.config.body_pointer)
        return body if isinstance(body, dict) else None

    def _read_back_url(self, remote_id: str) -> str:
        if self.config.read_back_path is None:
            raise HttpTransportError("read-back is not configured (read_back_path is None)")
        return self._url(self.config.read_back_path, id=remote_id)

    def _read_back_result(self, remote_id: str, response: httpx.Response) -> ReadBackResult:
        if response.status_code == 200:
            return Found(remote_id, self._body_of(response))
        if response.status_code in (404, 410):
            return NotFound(f"HTTP {response.status_code}")
        raise HttpTransportError(f"read-back got HTTP {response.status_code}", response.status_code)

    def _lookup_url(self, delivery_key: str, resend_epoch: int, fence_epoch: int) -> str | None:
        if self.config.lookup_path is None:
            return None
        return self._url(self.config.lookup_path, key=self._lookup_key(delivery_key, resend_epoch, fence_epoch))

    @staticmethod
    def _lookup_key(delivery_key: str, resend_epoch: int, fence_epoch: int) -> str:
        """The idempotency key the send carried, which the lookup asks for."""
        return platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)

    def _answer_for(self, doc: Any, key: str) -> Any:
        """The object of a lookup's answer ``doc`` that is the one sent under ``key``: ``None`` for an empty
        array ("not found"). Raises :class:`HttpTransportError` when the answer cannot be for ``key``: neither
        an object nor an array of objects (``null``, ``[null]``), an object holding another key at
        ``lookup_key_pointer`` (or ``key_field``), an array holding only other keys, or several objects none of
        which holds a key (docs/design.md#a-lookup-must-answer-for-its-key)."""
        cfg = self.config
        at = cfg.lookup_key_pointer if cfg.lookup_key_pointer is not None else cfg.key_field
        # only an empty array or a 404 says "not found": ``null``, a number, a string, or an array holding
        # anything but objects says nothing about the key
        if not isinstance(doc, (dict, list)) or (isinstance(doc, list) and not all(isinstance(o, dict) for o in doc)):
            raise HttpTransportError(
                f"lookup for {key!r} answered 200 with neither an object nor an array of them", 200
            )
        if not isinstance(doc, list):
            held = MISSING if at is None else pointer_get(doc, at)
            if held not in (MISSING, None) and held != key:
                raise HttpTransportError(f"lookup for {key!r} answered an object holding the key {held!r}", 200)
            return doc
        if not doc:
            return None
        held = [MISSING if at is None else pointer_get(o, at) for o in doc]
        held = [MISSING if k is None else k for k in held]  # a null key is no key
        mine = [o for o, k in zip(doc, held, strict=True) if k == key]
        if mine:
            return mine[0]
        if any(k is not MISSING for k in held):
            raise HttpTransportError(
                f"lookup for {key!r} answered {len(doc)} object(s), none holding that key at {at!r}: "
                "the platform did not filter by it",
                200,
            )
        if len(doc) > 1:
            where = "they hold no key at " + repr(at) if at is not None else "no lookup_key_pointer names its key"
            raise HttpTransportError(
                f"lookup for {key!r} answered {len(doc)} objects and which one was sent under it cannot be told: "
                + where,
                200,
            )
        return doc[0]

    def _lookup_result(self, response: httpx.Response, key: str) -> LookupResult:
        if response.status_code == 501:
            return Unsupported("platform answered 501 to the lookup")
        if response.status_code == 404:
            return NotFound("HTTP 404")
        if response.status_code != 200:
            raise HttpTransportError(f"lookup got HTTP {response.status_code}", response.status_code)
        try:
            doc = _json(response.content)
        except ValueError as exc:
            raise HttpTransportError("lookup answered 200 with a body that is not JSON", 200) from exc
        cfg = self.config
        if cfg.lookup_collection_pointer is not None:  # a collection the platform wraps: {"data": [...]}
            doc = pointer_get(doc, cfg.lookup_collection_pointer)
            if not isinstance(doc, list):
                raise HttpTransportError(
                    f"lookup answered 200 without an array at {cfg.lookup_collection_pointer!r}", 200
                )
        doc = self._answer_for(doc, key)
        if doc is None:
            return NotFound("HTTP 200, empty list")
        pointer = cfg.lookup_id_pointer or (cfg.id_pointer if cfg.id_pointer is not None else "/id")
        remote_id = usable_id(pointer_get(doc, pointer))
        if remote_id is None:
            raise HttpTransportError("lookup answered 200 without a usable id", 200)
        body = pointer_get(doc, cfg.lookup_body_pointer if cfg.lookup_body_pointer is not None else cfg.body_pointer)
        return Found(remote_id, body if isinstance(body, dict) else None)

    def compare(self, request: WireRequest, found: Found) -> Comparison:
        """Compare ``found.body`` with what was approved for ``request`` (its body; for a correction, the
        corrected body) over the config's ``projection`` (``atmostonce.projection.compare``). Fields the
        platform adds are ignored; so is the idempotency key at ``key_field``."""
        return compare_approved(request, found, self.config.projection)

    def matches(self, request: WireRequest, found: Found) -> bool:
        """Whether the read-back confirms ``request``: :meth:`compare` found every projected field equal."""
        return self.compare(request, found).match


class HttpTransport(_HttpCore):
    """The :class:`atmostonce.transport.Transport` for a JSON REST platform.

    ``HttpTransport(config)`` takes an :class:`HttpPlatformConfig` or a mapping
    for :meth:`HttpPlatformConfig.from_mapping` (``ValueError`` if invalid).
    Use as a context manager or call :meth:`close`.
    """

    def __init__(self, config: HttpPlatformConfig | Mapping[str, Any], *, table: OutcomeTable | None = None):
        super().__init__(config, table=table)
        self._client = httpx.Client(transport=httpx.HTTPTransport(**self._wire_options()), **self._client_options())

    def _prepare(self, request: WireRequest) -> httpx.Request:
        return self._build(self._client, request)

    def send(self, request: WireRequest) -> SendResult:
        """Send ``request`` once and classify the result; never raises for a network or HTTP failure.

        Returns :class:`Sent` (``remote_id``, SHA-256 of the response body),
        :class:`NotSent` or :class:`Unknown`, whose ``reason`` starts with the
        table row that decided (e.g. ``error:connect_refused``, ``status:500-599``).
        The idempotency key sent is ``request.idempotency_key``.
        """
        try:
            prepared = self._prepare(request)
        except (ValueError, TypeError, httpx.InvalidURL) as exc:
            return self._unprepared(exc)
        try:
            response = self._client.send(prepared, follow_redirects=False)
        except Exception as exc:  # classified by the table; anything unrecognised is "other" -> unknown
            return self._failed(exc)
        return self._answered(request, response)

    def _get(self, url: str, what: str) -> httpx.Response:
        try:
            return self._client.get(url, follow_redirects=False)
        except Exception as exc:
            raise HttpTransportError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    def read_back(self, remote_id: str) -> ReadBackResult:
        """GET the object: :class:`Found` (``body`` at ``body_pointer``, ``None`` if unreadable) or :class:`NotFound` on 404/410.

        Raises :class:`HttpTransportError` when read-back is not configured, on a
        network failure, or on any other status.
        """
        return self._read_back_result(remote_id, self._get(self._read_back_url(remote_id), "read-back"))

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        """Find the object sent under ``delivery_key`` and ``resend_epoch`` by its idempotency key.

        Returns :class:`Unsupported` without a ``lookup_path`` or when the
        platform answers 501, :class:`NotFound` on 404, :class:`Found` on 200
        with a usable id at ``id_pointer``. Raises :class:`HttpTransportError`
        on a network failure, any other status, or a 200 without an id.
        """
        url = self._lookup_url(delivery_key, resend_epoch, fence_epoch)
        if url is None:
            return Unsupported("no lookup_path configured")
        return self._lookup_result(self._get(url, "lookup"), self._lookup_key(delivery_key, resend_epoch, fence_epoch))

    def close(self) -> None:
        """Close the connection pool. Idempotent."""
        self._client.close()

    def __enter__(self) -> HttpTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AsyncHttpTransport(_HttpCore):
    """The :class:`atmostonce.transport.AsyncTransport` for a JSON REST platform, on ``httpx.AsyncClient``.

    The same config, request and classification as :class:`HttpTransport` (one outcome table, one reading of
    the answer); only the client is asynchronous. One ``await send(...)`` puts at most one request on the
    wire: retries off, no redirects followed, no kept-alive connection.

    Cancellation: a ``send`` task cancelled while its request is on its way is never classified: the
    ``CancelledError`` propagates (nothing is returned, so nothing can say "not sent"). By then bytes may
    have left, so whoever holds the send's lease records it as unknown
    (:func:`atmostonce.transport.cancelled_send`, docs/design.md#the-outbox-service).
    Use as an async context manager or call :meth:`aclose`.
    """

    def __init__(self, config: HttpPlatformConfig | Mapping[str, Any], *, table: OutcomeTable | None = None):
        super().__init__(config, table=table)
        self._client = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(**self._wire_options()), **self._client_options()
        )

    async def send(self, request: WireRequest) -> SendResult:
        """Send ``request`` once and classify the result as :meth:`HttpTransport.send` does; never raises for
        a network or HTTP failure. A cancellation propagates (see the class)."""
        try:
            prepared = self._build(self._client, request)
        except (ValueError, TypeError, httpx.InvalidURL) as exc:
            return self._unprepared(exc)
        try:
            response = await self._client.send(prepared, follow_redirects=False)
        except Exception as exc:  # CancelledError is a BaseException: it is not classified, it propagates
            return self._failed(exc)
        return self._answered(request, response)

    async def _get(self, url: str, what: str) -> httpx.Response:
        try:
            return await self._client.get(url, follow_redirects=False)
        except Exception as exc:
            raise HttpTransportError(f"{what} failed: {type(exc).__name__}: {exc}") from exc

    async def read_back(self, remote_id: str) -> ReadBackResult:
        """As :meth:`HttpTransport.read_back`."""
        return self._read_back_result(remote_id, await self._get(self._read_back_url(remote_id), "read-back"))

    async def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        """As :meth:`HttpTransport.lookup`."""
        url = self._lookup_url(delivery_key, resend_epoch, fence_epoch)
        if url is None:
            return Unsupported("no lookup_path configured")
        return self._lookup_result(
            await self._get(url, "lookup"), self._lookup_key(delivery_key, resend_epoch, fence_epoch)
        )

    async def aclose(self) -> None:
        """Close the connection pool. Idempotent."""
        await self._client.aclose()

    async def __aenter__(self) -> AsyncHttpTransport:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
