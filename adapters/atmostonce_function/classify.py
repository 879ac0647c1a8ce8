"""Classify an exception raised by a user's send callable as not sent or unknown, from a table.

The rows live in ``spec/exception_outcomes.toml`` (shipped in the wheel as
``atmostonce/_spec/exception_outcomes.toml``); this module loads them, checks them and looks an
exception up. A row names an exception class by its dotted name (``module.QualName``, as
:func:`dotted_name` spells it: ``builtins.ConnectionRefusedError``, ``smtplib.SMTPDataError``),
an outcome, the rule (why), and optionally an integer ``attribute`` of the exception with the
``codes`` or ``range`` it must hold.

:meth:`ExceptionTable.classify` walks the exception's class and its bases in MRO order (most
specific first) and, for each class, its rows in order; the first row that matches decides. None
matching: the table's ``default``, which the loader holds to the unknown outcome: an exception the
table does not know is never "not sent". Only the raised exception's own class is looked at, never
its ``__cause__``: an SDK that retried internally may have wrapped only its last attempt's error.

Outcome names are those of ``spec/http_outcomes.toml`` (``not_sent``, ``unknown``): the short
names of the send outcomes the runtime records (:class:`atmostonce.transport.NotSent`,
:class:`atmostonce.transport.Unknown`), each checked against the loaded ``spec/table.toml``. None
is typed here: they are read from the result classes and the table.

Errors: :class:`ExceptionTableError` (a ``ValueError``) when the file is missing, is not TOML,
or a row is malformed (an unknown outcome name, a bad dotted name, no rule, ...); its ``code`` (an
:class:`atmostonce_http.table_errors.OutcomeTableCode`), ``where`` (e.g. ``rows[0].outcome``) and
``path`` say why and where.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from atmostonce.table import spec_dir, table
from atmostonce.transport import NotSent, Unknown
from atmostonce_http.classify import load_file, spec_file
from atmostonce_http.table_errors import OutcomeTableCode, OutcomeTableFileError

__all__ = [
    "CATCH_ALL",
    "Classification",
    "ExceptionRow",
    "ExceptionTable",
    "ExceptionTableError",
    "OutcomeTableCode",
    "dotted_name",
    "exception_outcomes_path",
    "exception_table",
    "failure_outcomes",
    "load_exception_table",
    "parse_exception_table",
    "parse_rows",
]

CATCH_ALL = ("builtins.BaseException", "builtins.Exception")
"""Classes a ``not_sent`` row may not name: it would make every exception nobody classified "not sent"."""

_DOTTED = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)+$")
_ATTRIBUTE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ROW_FIELDS = frozenset({"exception", "outcome", "rule", "attribute", "codes", "range"})


class ExceptionTableError(OutcomeTableFileError):
    """``exception_outcomes.toml`` (or a row passed in) is missing, malformed or names an unknown outcome.

    Attributes (those of :class:`~atmostonce_http.table_errors.OutcomeTableFileError`): ``code`` (an
    :class:`OutcomeTableCode`: ``unknown_outcome``, ``not_sent_unproven`` for a catch-all class made not sent,
    ``unreachable``, ...), ``where`` (the path of the field or row at fault: ``"rows[0].outcome"``,
    ``"rows[2]"``, ``"default"``, ``"extra_rows[0].rule"`` for rows given to :meth:`ExceptionTable.with_rows`;
    ``None`` when the whole file is) and ``path`` (the file; ``None`` for rows passed in)."""


Code = OutcomeTableCode


def dotted_name(cls: type) -> str:
    """The name a row uses for ``cls``: ``cls.__module__ + "." + cls.__qualname__``."""
    return f"{cls.__module__}.{cls.__qualname__}"


def _short(outcome: str) -> str:
    return outcome.partition(".")[2]


@functools.cache
def failure_outcomes() -> Mapping[str, str]:
    """Row outcome name -> the table's outcome name, for the results an exception can have (not sent,
    unknown), read from :class:`NotSent` / :class:`Unknown` and checked against ``spec/table.toml``.

    Raises :class:`ExceptionTableError` if the table does not know one of them."""
    out: dict[str, str] = {}
    outcomes = table().outcomes
    for result in (NotSent, Unknown):
        full = result.outcome
        if full not in outcomes:
            raise ExceptionTableError(
                f"{result.__name__}.outcome {full!r} is not an outcome of spec/table.toml",
                code=Code.UNKNOWN_OUTCOME,
                path=str(spec_dir() / "table.toml"),
            )
        out[_short(full)] = full
    return MappingProxyType(out)


@dataclass(frozen=True)
class Classification:
    """The row that decided: ``outcome`` is the table's outcome name (e.g. ``send.not_sent``), ``row``
    names the row (``exception:smtplib.SMTPDataError[smtp_code=500-599]``, or ``default``), ``rule`` says why."""

    outcome: str
    row: str
    rule: str


@dataclass(frozen=True)
class ExceptionRow:
    """One row. ``outcome`` is the table's outcome name; ``codes`` / ``low``..``high`` apply to ``attribute``."""

    exception: str
    outcome: str
    rule: str
    attribute: str | None = None
    codes: tuple[int, ...] = ()
    low: int | None = None
    high: int | None = None

    @property
    def name(self) -> str:
        if self.attribute is None:
            return f"exception:{self.exception}"
        held = ",".join(map(str, self.codes)) if self.codes else f"{self.low}-{self.high}"
        return f"exception:{self.exception}[{self.attribute}={held}]"

    def matches(self, exc: BaseException) -> bool:
        if self.attribute is None:
            return True
        value: Any = exc
        try:
            for part in self.attribute.split("."):
                value = getattr(value, part, None)
        except Exception:  # an SDK error whose attribute lookup itself raises: the row does not match
            return False
        if isinstance(value, bool) or not isinstance(value, int):
            return False
        if self.codes:
            return value in self.codes
        return self.low is not None and self.high is not None and self.low <= value <= self.high


@dataclass(frozen=True)
class ExceptionTable:
    """The loaded rows by class name (each list in lookup order) and the ``default`` outcome."""

    rows: Mapping[str, tuple[ExceptionRow, ...]]
    default: str

    def classify(self, exc: BaseException) -> Classification:
        """The first row, walking ``type(exc).__mro__``, that matches ``exc``; else the default (unknown)."""
        for cls in type(exc).__mro__:
            for row in self.rows.get(dotted_name(cls), ()):
                if row.matches(exc):
                    return Classification(row.outcome, row.name, row.rule)
        return Classification(self.default, "default", "no row knows this exception: when in doubt, unknown")

    def with_rows(self, extra: Iterable[Mapping[str, Any]]) -> ExceptionTable:
        """A table whose rows for a class are ``extra``'s (checked as :func:`parse_rows`), then this one's."""
        added = parse_rows(extra, "extra_rows")
        merged = {name: added.get(name, ()) + self.rows.get(name, ()) for name in {*self.rows, *added}}
        return ExceptionTable(MappingProxyType(merged), self.default)


def _outcome(value: Any, label: str, where: str) -> str:
    """The table's outcome name for row outcome ``value``; ``label`` names the row in the message, ``where`` the
    field in the error."""
    vocabulary = failure_outcomes()
    if value not in vocabulary:
        raise ExceptionTableError(
            f"{label}: outcome {value!r} is not one of {sorted(vocabulary)}", code=Code.UNKNOWN_OUTCOME, where=where
        )
    return vocabulary[value]


def _int_list(value: Any, label: str, where: str, what: str) -> list[int]:
    if not isinstance(value, list) or not value or not all(type(c) is int for c in value):
        raise ExceptionTableError(
            f"{label}: {what} must be a non-empty list of integers", code=Code.INVALID_VALUE, where=f"{where}.{what}"
        )
    return value


def _row(raw: Any, where: str) -> ExceptionRow:
    """Check one row; ``where`` is its path (``rows[0]``), which the messages follow with the class's name."""
    if not isinstance(raw, Mapping):
        raise ExceptionTableError(f"{where}: a row must be a table", code=Code.WRONG_TYPE, where=where)
    unknown = set(raw) - _ROW_FIELDS
    if unknown:
        raise ExceptionTableError(
            f"{where}: unknown fields {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=f"{where}.{min(unknown)}"
        )
    exception = raw.get("exception")
    if isinstance(exception, type) and issubclass(exception, BaseException):
        exception = dotted_name(exception)
    if not isinstance(exception, str) or not _DOTTED.match(exception):
        raise ExceptionTableError(
            f"{where}: exception {exception!r} is not a dotted class name (module.Class)",
            code=Code.INVALID_VALUE,
            where=f"{where}.exception",
        )
    label = f"{where} ({exception})"
    outcome = _outcome(raw.get("outcome"), label, f"{where}.outcome")
    rule = raw.get("rule")
    if not isinstance(rule, str) or not rule.strip():
        raise ExceptionTableError(f"{label}: every row says why (rule)", code=Code.MISSING, where=f"{where}.rule")
    if exception in CATCH_ALL and outcome == NotSent.outcome:
        raise ExceptionTableError(
            f"{label}: a catch-all class can never be not sent", code=Code.NOT_SENT_UNPROVEN, where=where
        )
    attribute = raw.get("attribute")
    selectors = [k for k in ("codes", "range") if k in raw]
    if attribute is None:
        if selectors:
            raise ExceptionTableError(f"{label}: {selectors[0]} needs an attribute", code=Code.SELECTOR, where=where)
        return ExceptionRow(exception, outcome, rule)
    if not isinstance(attribute, str) or not _ATTRIBUTE.match(attribute):
        raise ExceptionTableError(
            f"{label}: attribute {attribute!r} is not a dotted attribute path",
            code=Code.INVALID_VALUE,
            where=f"{where}.attribute",
        )
    if len(selectors) != 1:
        raise ExceptionTableError(
            f"{label}: an attribute row needs exactly one of codes, range (got {selectors})",
            code=Code.SELECTOR,
            where=where,
        )
    if "codes" in raw:
        codes = _int_list(raw["codes"], label, where, "codes")
        return ExceptionRow(exception, outcome, rule, attribute, codes=tuple(codes))
    rng = _int_list(raw["range"], label, where, "range")
    if len(rng) != 2 or rng[0] > rng[1]:
        raise ExceptionTableError(
            f"{label}: range must be [low, high] with low <= high", code=Code.INVALID_VALUE, where=f"{where}.range"
        )
    return ExceptionRow(exception, outcome, rule, attribute, low=rng[0], high=rng[1])


def parse_rows(raw_rows: Iterable[Any], where: str = "rows") -> Mapping[str, tuple[ExceptionRow, ...]]:
    """Check rows (mappings in the file's row format; ``exception`` may also be a class) and group them by
    class name, in order. A class's row without ``attribute`` matches always, so it must be its last row."""
    if isinstance(raw_rows, (str, bytes, Mapping)):
        raise ExceptionTableError(f"{where}: must be a list of rows", code=Code.WRONG_TYPE, where=where)
    grouped: dict[str, list[ExceptionRow]] = {}
    for i, raw in enumerate(raw_rows):
        row = _row(raw, f"{where}[{i}]")
        earlier = grouped.setdefault(row.exception, [])
        if earlier and earlier[-1].attribute is None:
            raise ExceptionTableError(
                f"{where}[{i}] ({row.exception}): unreachable, an earlier row for this class without attribute matches first",
                code=Code.UNREACHABLE,
                where=f"{where}[{i}]",
            )
        earlier.append(row)
    return MappingProxyType({name: tuple(rows) for name, rows in grouped.items()})


def parse_exception_table(raw: Mapping[str, Any]) -> ExceptionTable:
    """Validate parsed TOML and build an :class:`ExceptionTable`. Raises :class:`ExceptionTableError`."""
    unknown = set(raw) - {"format", "default", "rows"}
    if unknown:
        raise ExceptionTableError(f"unknown keys {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=min(unknown))
    if raw.get("format") != 1:
        raise ExceptionTableError(
            f"unsupported format {raw.get('format')!r} (expected 1)", code=Code.FORMAT, where="format"
        )
    default = _outcome(raw.get("default"), "default", "default")
    if default != Unknown.outcome:
        raise ExceptionTableError(
            f"default must be {_short(Unknown.outcome)!r}: an exception nobody knows is never not sent",
            code=Code.DEFAULT_NOT_UNKNOWN,
            where="default",
        )
    rows_raw = raw.get("rows")
    if not isinstance(rows_raw, list) or not rows_raw:
        raise ExceptionTableError("missing [[rows]]", code=Code.MISSING, where="rows")
    return ExceptionTable(parse_rows(rows_raw), default)


def exception_outcomes_path() -> Path:
    """Where ``exception_outcomes.toml`` is: beside ``table.toml`` in the wheel's ``_spec`` or the repo's ``spec/``."""
    return spec_file("exception_outcomes.toml", ExceptionTableError)


def load_exception_table(path: str | Path | None = None) -> ExceptionTable:
    """Read and validate the table at ``path`` (default: the shipped one). Raises :class:`ExceptionTableError`."""
    p = Path(path) if path is not None else exception_outcomes_path()
    return load_file(p, parse_exception_table, ExceptionTableError)


@functools.cache
def exception_table() -> ExceptionTable:
    """The shipped table, loaded once."""
    return load_exception_table()
