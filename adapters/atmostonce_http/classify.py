"""Classify one HTTP send as ``success``, ``not_sent`` or ``unknown`` from a table.

The rows live in ``spec/http_outcomes.toml`` (shipped in the wheel as
``atmostonce/_spec/http_outcomes.toml``); this module only loads them and looks
them up. Two lookups:

* :meth:`OutcomeTable.for_error` takes a failure *kind*, one of
  :data:`ERROR_KINDS`; :func:`error_kind` maps an exception raised while
  building or sending a request to its kind.
* :meth:`OutcomeTable.for_status` takes an HTTP status code, whether the
  response carried a usable object id, and the platform's "may already exist"
  statuses.

Both return a :class:`Classification` (``outcome``, ``row``, ``rule``).
Outcome names map to ``spec/table.toml`` as ``send.<outcome>``.

Errors: :class:`OutcomeTableError` (a ``ValueError``) when the file is missing,
is not TOML, names an unknown outcome or kind, or lacks a row for a kind; its
``code`` (an :class:`atmostonce_http.table_errors.OutcomeTableCode`), ``where``
and ``path`` say why and where.
"""

from __future__ import annotations

import functools
import socket
import ssl
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

import httpx

from .table_errors import OutcomeTableCode, OutcomeTableFileError

__all__ = [
    "ERROR_KINDS",
    "OUTCOMES",
    "Classification",
    "ErrorRow",
    "OutcomeTable",
    "OutcomeTableCode",
    "OutcomeTableError",
    "StatusRow",
    "error_kind",
    "load_outcome_table",
    "outcome_table",
    "outcomes_path",
    "parse_outcome_table",
]

OUTCOMES = ("success", "not_sent", "unknown")
"""The three send outcomes; ``spec/table.toml`` names them ``send.<outcome>``."""

ERROR_KINDS = (
    "invalid_request",
    "dns_failure",
    "connect_refused",
    "connect_timeout",
    "tls_handshake",
    "connect_error",
    "pool_timeout",
    "write_timeout",
    "write_error",
    "read_timeout",
    "read_error",
    "remote_protocol",
    "other",
)
"""Every failure kind :func:`error_kind` can return; the table must have exactly these rows."""

# Exception type -> kind, first match wins (timeouts before their error parents).
_EXCEPTION_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (httpx.ConnectTimeout, "connect_timeout"),
    (httpx.PoolTimeout, "pool_timeout"),
    (httpx.WriteTimeout, "write_timeout"),
    (httpx.ReadTimeout, "read_timeout"),
    (httpx.ConnectError, "connect_error"),
    (httpx.WriteError, "write_error"),
    (httpx.ReadError, "read_error"),
    (httpx.RemoteProtocolError, "remote_protocol"),
    (httpx.UnsupportedProtocol, "invalid_request"),
    (httpx.InvalidURL, "invalid_request"),
)

# A ConnectError is refined by the OS/TLS error that caused it, first match wins.
_CONNECT_CAUSES: tuple[tuple[type[BaseException], str], ...] = (
    (socket.gaierror, "dns_failure"),
    (ssl.SSLError, "tls_handshake"),
    (ConnectionRefusedError, "connect_refused"),
)


class OutcomeTableError(OutcomeTableFileError):
    """``http_outcomes.toml`` (or ``matrix_outcomes.toml``) is missing, malformed, or inconsistent with
    :data:`ERROR_KINDS`.

    Attributes (those of :class:`~atmostonce_http.table_errors.OutcomeTableFileError`): ``code`` (an
    :class:`OutcomeTableCode`), ``where`` (the path inside the table of the field, row or section at fault,
    e.g. ``"errors.read_timeout.outcome"``, ``"statuses[1]"``, ``"errcodes[0].statuses"``; ``None`` when the
    whole file is) and ``path`` (the file; ``None`` for a table parsed from a mapping)."""


Code = OutcomeTableCode
_E = TypeVar("_E", bound=OutcomeTableFileError)
_T = TypeVar("_T")


@dataclass(frozen=True)
class Classification:
    """One looked-up row: ``outcome`` in :data:`OUTCOMES`, ``row`` names the row, ``rule`` says why."""

    outcome: str
    row: str
    rule: str


@dataclass(frozen=True)
class ErrorRow:
    kind: str
    outcome: str
    rule: str


@dataclass(frozen=True)
class StatusRow:
    """Matches ``codes``, or ``low <= status <= high``, or (``may_exist``) the platform's may-exist statuses."""

    outcome: str
    rule: str
    codes: tuple[int, ...] = ()
    low: int | None = None
    high: int | None = None
    may_exist: bool = False
    without_id: str | None = None

    @property
    def name(self) -> str:
        if self.may_exist:
            return "status:may_exist"
        if self.codes:
            return "status:" + ",".join(map(str, self.codes))
        return f"status:{self.low}-{self.high}"

    def matches(self, status: int, may_exist_statuses: Iterable[int]) -> bool:
        if self.may_exist:
            return status in set(may_exist_statuses)
        if self.codes:
            return status in self.codes
        return self.low is not None and self.high is not None and self.low <= status <= self.high


@dataclass(frozen=True)
class OutcomeTable:
    """The loaded table: ``errors`` (kind -> row), ordered ``statuses`` rows, and the ``default`` outcome."""

    errors: Mapping[str, ErrorRow]
    statuses: tuple[StatusRow, ...]
    default: str

    def for_error(self, kind: str) -> Classification:
        """Row for a failure kind. Raises ``KeyError`` for a kind not in :data:`ERROR_KINDS`."""
        row = self.errors[kind]
        return Classification(row.outcome, f"error:{kind}", row.rule)

    def for_status(self, status: int, *, has_id: bool, may_exist_statuses: Iterable[int] = (409,)) -> Classification:
        """Row for an HTTP ``status``; ``has_id`` says whether the response named a usable object id."""
        may_exist = tuple(may_exist_statuses)
        for row in self.statuses:
            if row.matches(status, may_exist):
                if row.without_id is not None and not has_id:
                    return Classification(row.without_id, row.name + ":without_id", row.rule)
                return Classification(row.outcome, row.name, row.rule)
        return Classification(self.default, "default", "no row matched: when in doubt, unknown")


def error_kind(exc: BaseException) -> str:
    """Map an exception raised while sending to one of :data:`ERROR_KINDS` (``other`` if unrecognised)."""
    for exc_type, kind in _EXCEPTION_KINDS:
        if isinstance(exc, exc_type):
            if kind == "connect_error":
                return _connect_cause(exc)
            return kind
    return "other"


def _connect_cause(exc: BaseException) -> str:
    seen: set[int] = set()
    stack: list[BaseException | None] = [exc.__cause__, exc.__context__]
    while stack:
        cur = stack.pop(0)
        if cur is None or id(cur) in seen:
            continue
        seen.add(id(cur))
        for cause_type, kind in _CONNECT_CAUSES:
            if isinstance(cur, cause_type):
                return kind
        stack.extend((cur.__cause__, cur.__context__))
    return "connect_error"


def spec_file(name: str, error: type[OutcomeTableFileError] = OutcomeTableError) -> Path:
    """Where the classification table ``name`` is: beside ``table.toml`` in the wheel's ``_spec`` or the repo's
    ``spec/``; raises ``error`` (code ``not_found``) when neither holds the table. Shared by every transport's
    outcome table."""
    from atmostonce.table import TableError, spec_dir

    try:
        return spec_dir() / name
    except TableError as exc:
        raise error(str(exc), code=Code.NOT_FOUND, path=exc.path) from exc


def outcomes_path() -> Path:
    """Where ``http_outcomes.toml`` is: beside ``table.toml`` in the wheel's ``_spec`` or the repo's ``spec/``."""
    return spec_file("http_outcomes.toml")


def kinds_fault(rows: Mapping[str, Any], kinds: Iterable[str], section: str) -> tuple[OutcomeTableCode, str] | None:
    """Why a section keyed by kind (``[errors]``, ``[local]``) is not exactly one row per kind in ``kinds``, and
    where: the first kind without a row (``missing``), else the first row of no kind (``unknown_field``); ``None``
    when it is exactly one row per kind."""
    missing, extra = set(kinds) - set(rows), set(rows) - set(kinds)
    if missing:
        return Code.MISSING, f"{section}.{min(missing)}"
    if extra:
        return Code.UNKNOWN_FIELD, f"{section}.{min(extra)}"
    return None


def _outcome(value: Any, label: str, where: str) -> str:
    """``value`` if it is one of :data:`OUTCOMES`; ``label`` names the row in the message, ``where`` the value."""
    if value not in OUTCOMES:
        raise OutcomeTableError(
            f"{label}: outcome {value!r} is not one of {OUTCOMES}", code=Code.UNKNOWN_OUTCOME, where=where
        )
    return value


def _status_row(raw: Mapping[str, Any], i: int) -> StatusRow:
    where = f"statuses[{i}]"
    selectors = [k for k in ("may_exist", "codes", "range") if k in raw]
    if len(selectors) != 1:
        raise OutcomeTableError(
            f"{where}: needs exactly one of may_exist, codes, range (got {selectors})", code=Code.SELECTOR, where=where
        )
    unknown = set(raw) - {"may_exist", "codes", "range", "outcome", "without_id", "rule"}
    if unknown:
        raise OutcomeTableError(
            f"{where}: unknown fields {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=f"{where}.{min(unknown)}"
        )
    outcome = _outcome(raw.get("outcome"), where, f"{where}.outcome")
    without_id = raw.get("without_id")
    if without_id is not None:
        _outcome(without_id, where + ".without_id", where + ".without_id")
        if without_id == "success":
            raise OutcomeTableError(
                f"{where}: a response without an id can never be success",
                code=Code.SUCCESS_UNPROVEN,
                where=f"{where}.without_id",
            )
    if outcome == "success" and without_id is None:
        raise OutcomeTableError(
            f"{where}: a success row must say what a response without an id is (without_id)",
            code=Code.MISSING,
            where=f"{where}.without_id",
        )
    rule = str(raw.get("rule", ""))
    if "may_exist" in raw:
        if raw["may_exist"] is not True:
            raise OutcomeTableError(
                f"{where}: may_exist must be true", code=Code.INVALID_VALUE, where=f"{where}.may_exist"
            )
        return StatusRow(outcome, rule, may_exist=True, without_id=without_id)
    if "codes" in raw:
        codes = raw["codes"]
        if not isinstance(codes, list) or not codes or not all(isinstance(c, int) for c in codes):
            raise OutcomeTableError(
                f"{where}: codes must be a non-empty list of integers", code=Code.INVALID_VALUE, where=f"{where}.codes"
            )
        return StatusRow(outcome, rule, codes=tuple(codes), without_id=without_id)
    rng = raw["range"]
    if not (isinstance(rng, list) and len(rng) == 2 and all(isinstance(c, int) for c in rng) and rng[0] <= rng[1]):
        raise OutcomeTableError(
            f"{where}: range must be [low, high] integers with low <= high",
            code=Code.INVALID_VALUE,
            where=f"{where}.range",
        )
    return StatusRow(outcome, rule, low=rng[0], high=rng[1], without_id=without_id)


def parse_outcome_table(raw: Mapping[str, Any]) -> OutcomeTable:
    """Validate parsed TOML and build an :class:`OutcomeTable`. Raises :class:`OutcomeTableError`."""
    if raw.get("format") != 1:
        raise OutcomeTableError(
            f"unsupported format {raw.get('format')!r} (expected 1)", code=Code.FORMAT, where="format"
        )
    default = _outcome(raw.get("default"), "default", "default")
    if default != "unknown":
        raise OutcomeTableError(
            "default must be 'unknown': when in doubt, never claim not_sent",
            code=Code.DEFAULT_NOT_UNKNOWN,
            where="default",
        )
    errors_raw = raw.get("errors")
    if not isinstance(errors_raw, dict):
        raise OutcomeTableError("missing [errors] table", code=Code.MISSING, where="errors")
    fault = kinds_fault(errors_raw, ERROR_KINDS, "errors")
    if fault is not None:
        missing = set(ERROR_KINDS) - set(errors_raw)
        extra = set(errors_raw) - set(ERROR_KINDS)
        raise OutcomeTableError(
            f"[errors] rows must be exactly ERROR_KINDS: missing {sorted(missing)}, extra {sorted(extra)}",
            code=fault[0],
            where=fault[1],
        )
    errors: dict[str, ErrorRow] = {}
    for kind, row in errors_raw.items():
        if not isinstance(row, dict):
            raise OutcomeTableError(f"errors.{kind}: must be a table", code=Code.WRONG_TYPE, where=f"errors.{kind}")
        outcome = _outcome(row.get("outcome"), f"errors.{kind}", f"errors.{kind}.outcome")
        if outcome == "success":
            raise OutcomeTableError(
                f"errors.{kind}: a failure can never be success",
                code=Code.SUCCESS_UNPROVEN,
                where=f"errors.{kind}.outcome",
            )
        errors[kind] = ErrorRow(kind, outcome, str(row.get("rule", "")))
    statuses_raw = raw.get("statuses")
    if not isinstance(statuses_raw, list) or not statuses_raw:
        raise OutcomeTableError("missing [[statuses]] rows", code=Code.MISSING, where="statuses")
    statuses = tuple(_status_row(r, i) for i, r in enumerate(statuses_raw))
    return OutcomeTable(MappingProxyType(errors), statuses, default)


def read_toml(p: Path, error: type[OutcomeTableFileError] = OutcomeTableError) -> dict[str, Any]:
    """Parse a classification table file; raises ``error`` (code ``not_found`` or ``not_toml``, ``path``
    the file) when it is missing or not TOML."""
    try:
        return tomllib.loads(p.read_text("utf-8"))
    except FileNotFoundError as exc:
        raise error(f"{p} not found", code=Code.NOT_FOUND, path=str(p)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{p} is not valid TOML: {exc}", code=Code.NOT_TOML, path=str(p)) from exc


def load_file(p: Path, parse: Callable[[dict[str, Any]], _T], error: type[_E]) -> _T:
    """``parse`` the classification table file ``p``; an ``error`` it raises names ``p`` as its ``path``. Shared
    by every transport's outcome table."""
    raw = read_toml(p, error)
    try:
        return parse(raw)
    except error as exc:
        if exc.path is None:
            exc.path = str(p)
        raise


def load_outcome_table(path: str | Path | None = None) -> OutcomeTable:
    """Read and validate the table at ``path`` (default :func:`outcomes_path`). Raises :class:`OutcomeTableError`."""
    return load_file(Path(path) if path is not None else outcomes_path(), parse_outcome_table, OutcomeTableError)


@functools.cache
def outcome_table() -> OutcomeTable:
    """The shipped table, loaded once."""
    return load_outcome_table()
