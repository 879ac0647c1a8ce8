"""Classify one SMTP send from a table: ``spec/email_outcomes.toml``.

The file has ``[errors]`` (one row per failure kind, :data:`ERROR_KINDS`) and ordered ``[[replies]]``
rows matching an SMTP reply by the phase it answered (:data:`PHASES`) and its code range. Outcome
names are those of ``spec/table.toml`` and are checked against the loaded table; each must be one of
the three send outcomes of :mod:`atmostonce.transport` (``Sent``, ``NotSent``, ``Unknown``), and the
default must be the unknown one. :meth:`EmailOutcomeTable.for_error` and
:meth:`EmailOutcomeTable.for_reply` return a :class:`Classification` whose ``row`` names the row
(``error:lost_after_payload``, ``reply:envelope:400-599``, ``default``).

Errors: :class:`EmailOutcomeTableError` (a ``ValueError``) for a missing or inconsistent file; its ``code`` (an
:class:`atmostonce_http.table_errors.OutcomeTableCode`), ``where`` (e.g. ``replies[0].phase``) and ``path`` say
why and where.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from atmostonce.table import table
from atmostonce.transport import NotSent, Sent, Unknown
from atmostonce_http.classify import kinds_fault, load_file, spec_file
from atmostonce_http.table_errors import OutcomeTableCode, OutcomeTableFileError

__all__ = [
    "ERROR_KINDS",
    "PHASES",
    "Classification",
    "EmailOutcomeTable",
    "EmailOutcomeTableError",
    "OutcomeTableCode",
    "ReplyRow",
    "email_outcome_table",
    "email_outcomes_path",
    "load_email_outcomes",
    "parse_email_outcomes",
    "result_type",
]

ERROR_KINDS = (
    "invalid_request",
    "dns_failure",
    "connect_refused",
    "connect_timeout",
    "connect_error",
    "lost_before_data",
    "lost_during_payload",
    "lost_after_payload",
    "other",
)
"""Every failure kind the transport reports; the table must have exactly these ``[errors]`` rows."""

PHASES = ("greeting", "envelope", "final")
"""What an SMTP reply answered: the connection, a command before the payload, or the end of the payload."""

_RESULTS = {cls.outcome: cls for cls in (Sent, NotSent, Unknown)}  # the defaults name the table's outcomes


class EmailOutcomeTableError(OutcomeTableFileError):
    """``email_outcomes.toml`` is missing, malformed, or names outcomes the table does not have.

    Attributes (those of :class:`~atmostonce_http.table_errors.OutcomeTableFileError`): ``code`` (an
    :class:`OutcomeTableCode`), ``where`` (the path of the field or row at fault: ``"replies[0].range"``,
    ``"errors.other.outcome"``, ``"replies[1]"`` for a row whose phase, range and outcome together claim what
    the reply cannot prove; ``None`` when the whole file is) and ``path`` (the file; ``None`` for a table
    parsed from a mapping)."""


Code = OutcomeTableCode


@dataclass(frozen=True)
class Classification:
    """One looked-up row: ``outcome`` (a ``spec/table.toml`` send outcome), ``row`` its name, ``rule`` why."""

    outcome: str
    row: str
    rule: str


@dataclass(frozen=True)
class ReplyRow:
    phase: str
    low: int
    high: int
    outcome: str
    rule: str

    @property
    def name(self) -> str:
        return f"reply:{self.phase}:{self.low}-{self.high}"


@dataclass(frozen=True)
class EmailOutcomeTable:
    errors: Mapping[str, Classification]
    replies: tuple[ReplyRow, ...]
    default: str

    def for_error(self, kind: str) -> Classification:
        """Row for a failure kind. Raises ``KeyError`` for a kind not in :data:`ERROR_KINDS`."""
        return self.errors[kind]

    def for_reply(self, phase: str, code: int) -> Classification:
        """Row for an SMTP reply ``code`` in ``phase``; the default when no row matches."""
        for row in self.replies:
            if row.phase == phase and row.low <= code <= row.high:
                return Classification(row.outcome, row.name, row.rule)
        return Classification(self.default, "default", "no row matched: when in doubt, unknown")


def result_type(outcome: str) -> type[Sent] | type[NotSent] | type[Unknown]:
    """The transport result class that carries ``outcome`` (``KeyError`` for another name)."""
    return _RESULTS[outcome]


def _outcome(value: Any, label: str, where: str) -> str:
    """``value`` if it is a send outcome of the table; ``label`` names the row in the message, ``where`` the value."""
    known = table().outcomes
    if value not in _RESULTS or value not in known:
        raise EmailOutcomeTableError(
            f"{label}: outcome {value!r} is not a send outcome of the table ({sorted(_RESULTS)})",
            code=Code.UNKNOWN_OUTCOME,
            where=where,
        )
    return value


def _reply_row(raw: Any, i: int) -> ReplyRow:
    where = f"replies[{i}]"
    if not isinstance(raw, dict):
        raise EmailOutcomeTableError(f"{where}: must be a table", code=Code.WRONG_TYPE, where=where)
    unknown = set(raw) - {"phase", "range", "outcome", "rule"}
    if unknown:
        raise EmailOutcomeTableError(
            f"{where}: unknown fields {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=f"{where}.{min(unknown)}"
        )
    phase = raw.get("phase")
    if phase not in PHASES:
        raise EmailOutcomeTableError(
            f"{where}: phase must be one of {PHASES}, got {phase!r}", code=Code.INVALID_VALUE, where=f"{where}.phase"
        )
    rng = raw.get("range")
    if not (
        isinstance(rng, list)
        and len(rng) == 2
        and all(isinstance(c, int) for c in rng)
        and 200 <= rng[0] <= rng[1] <= 599
    ):
        raise EmailOutcomeTableError(
            f"{where}: range must be [low, high] SMTP codes with 200 <= low <= high <= 599",
            code=Code.INVALID_VALUE,
            where=f"{where}.range",
        )
    outcome = _outcome(raw.get("outcome"), where, f"{where}.outcome")
    cls = _RESULTS[outcome]
    if cls is Sent and (phase != "final" or rng[0] < 200 or rng[1] > 299):
        raise EmailOutcomeTableError(
            f"{where}: only a 2xx final reply can be a success", code=Code.SUCCESS_UNPROVEN, where=where
        )
    if cls is NotSent and rng[0] < 400:
        raise EmailOutcomeTableError(
            f"{where}: only a 4xx/5xx reply can prove the message was not taken",
            code=Code.NOT_SENT_UNPROVEN,
            where=where,
        )
    return ReplyRow(phase, rng[0], rng[1], outcome, str(raw.get("rule", "")))


def parse_email_outcomes(raw: Mapping[str, Any]) -> EmailOutcomeTable:
    """Validate parsed TOML and build an :class:`EmailOutcomeTable`. Raises :class:`EmailOutcomeTableError`."""
    unknown = set(raw) - {"format", "default", "errors", "replies"}
    if unknown:
        raise EmailOutcomeTableError(
            f"unknown top-level keys {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=min(unknown)
        )
    if raw.get("format") != 1:
        raise EmailOutcomeTableError(
            f"unsupported format {raw.get('format')!r} (expected 1)", code=Code.FORMAT, where="format"
        )
    default = _outcome(raw.get("default"), "default", "default")
    if _RESULTS[default] is not Unknown:
        raise EmailOutcomeTableError(
            "default must be the unknown send outcome: when in doubt, never claim not sent",
            code=Code.DEFAULT_NOT_UNKNOWN,
            where="default",
        )
    errors_raw = raw.get("errors")
    if not isinstance(errors_raw, dict):
        raise EmailOutcomeTableError(
            f"[errors] rows must be exactly {ERROR_KINDS}, got {errors_raw!r}", code=Code.MISSING, where="errors"
        )
    fault = kinds_fault(errors_raw, ERROR_KINDS, "errors")
    if fault is not None:
        raise EmailOutcomeTableError(
            f"[errors] rows must be exactly {ERROR_KINDS}, got {sorted(errors_raw)!r}", code=fault[0], where=fault[1]
        )
    errors: dict[str, Classification] = {}
    for kind, row in errors_raw.items():
        if not isinstance(row, dict):
            raise EmailOutcomeTableError(
                f"errors.{kind}: must be a table", code=Code.WRONG_TYPE, where=f"errors.{kind}"
            )
        outcome = _outcome(row.get("outcome"), f"errors.{kind}", f"errors.{kind}.outcome")
        if _RESULTS[outcome] is Sent:
            raise EmailOutcomeTableError(
                f"errors.{kind}: a failure can never be a success",
                code=Code.SUCCESS_UNPROVEN,
                where=f"errors.{kind}.outcome",
            )
        errors[kind] = Classification(outcome, f"error:{kind}", str(row.get("rule", "")))
    replies_raw = raw.get("replies")
    if not isinstance(replies_raw, list) or not replies_raw:
        raise EmailOutcomeTableError("missing [[replies]] rows", code=Code.MISSING, where="replies")
    replies = tuple(_reply_row(r, i) for i, r in enumerate(replies_raw))
    return EmailOutcomeTable(MappingProxyType(errors), replies, default)


def email_outcomes_path() -> Path:
    """Where ``email_outcomes.toml`` is: beside ``table.toml`` (the wheel's ``_spec`` or the repo's ``spec/``)."""
    return spec_file("email_outcomes.toml", EmailOutcomeTableError)


def load_email_outcomes(path: str | Path | None = None) -> EmailOutcomeTable:
    """Read and validate the table at ``path`` (default :func:`email_outcomes_path`)."""
    p = Path(path) if path is not None else email_outcomes_path()
    return load_file(p, parse_email_outcomes, EmailOutcomeTableError)


@functools.cache
def email_outcome_table() -> EmailOutcomeTable:
    """The shipped table, loaded once."""
    return load_email_outcomes()
