"""Table-driven classification of one Matrix send, from ``spec/matrix_outcomes.toml``.

The file extends the format of ``spec/http_outcomes.toml`` (whose ``[errors]``
and ``[[statuses]]`` rows are parsed and checked by
:func:`atmostonce_http.classify.parse_outcome_table`, so the failure kinds and
their checks are shared) with two sections:

* ``[local]``: refusals decided by the transport before any byte leaves
  (:data:`LOCAL_KINDS`); each must be ``not_sent``.
* ``[[errcodes]]``: rows matching a non-2xx answer by its Matrix ``errcode``
  and HTTP status, consulted before ``[[statuses]]``. A ``not_sent`` row must
  list its statuses, all 4xx.

:meth:`MatrixOutcomeTable.for_response` takes the status, the errcode (or
``None``) and whether a usable event id came back; :meth:`for_error` an
exception kind from :func:`atmostonce_http.classify.error_kind`;
:meth:`for_local` a local refusal. Each returns a
:class:`atmostonce_http.classify.Classification` whose ``row`` names the row
(``errcode:M_LIMIT_EXCEEDED``, ``status:500-599``, ``error:read_timeout``,
``local:outside_resend_window``).

Errors: :class:`atmostonce_http.classify.OutcomeTableError` for a missing or
inconsistent file, its ``code`` an :class:`atmostonce_http.table_errors.OutcomeTableCode`
and its ``where`` the row or field at fault (``errcodes[0].statuses``,
``local.not_logged_in.outcome``, ``statuses[0].may_exist``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from atmostonce_http.classify import (
    OUTCOMES,
    Classification,
    OutcomeTable,
    OutcomeTableCode,
    OutcomeTableError,
    error_kind,
    kinds_fault,
    load_file,
    parse_outcome_table,
    spec_file,
)

Code = OutcomeTableCode

__all__ = [
    "LOCAL_KINDS",
    "ErrcodeRow",
    "MatrixOutcomeTable",
    "error_kind",
    "load_matrix_outcomes",
    "matrix_outcome_table",
    "matrix_outcomes_path",
    "parse_matrix_outcomes",
]

LOCAL_KINDS = ("outside_resend_window", "sent_by_another_device", "journal_unwritable", "not_logged_in")
"""Refusals the transport decides before any byte leaves; the table must have exactly these ``[local]`` rows."""


@dataclass(frozen=True)
class ErrcodeRow:
    """Matches a non-2xx answer whose body's ``errcode`` equals ``errcode`` and whose status is in ``statuses``."""

    errcode: str
    outcome: str
    rule: str
    statuses: tuple[int, ...]

    def matches(self, status: int, errcode: str | None) -> bool:
        return errcode == self.errcode and status in self.statuses


@dataclass(frozen=True)
class MatrixOutcomeTable:
    """The loaded Matrix table: the shared HTTP part, the errcode rows, and the local refusals."""

    http: OutcomeTable
    errcodes: tuple[ErrcodeRow, ...]
    local: Mapping[str, tuple[str, str]]

    def for_error(self, kind: str) -> Classification:
        """Row for a failure kind (:data:`atmostonce_http.classify.ERROR_KINDS`)."""
        return self.http.for_error(kind)

    def for_local(self, kind: str) -> Classification:
        """Row for a local refusal in :data:`LOCAL_KINDS`. Raises ``KeyError`` for another kind."""
        outcome, rule = self.local[kind]
        return Classification(outcome, f"local:{kind}", rule)

    def for_response(self, status: int, errcode: str | None, *, has_id: bool) -> Classification:
        """Row for an answer: errcode rows first (non-2xx only), then the status rows."""
        if not 200 <= status <= 299:
            for row in self.errcodes:
                if row.matches(status, errcode):
                    return Classification(row.outcome, f"errcode:{row.errcode}", row.rule)
        return self.http.for_status(status, has_id=has_id, may_exist_statuses=())


def matrix_outcomes_path() -> Path:
    """Where ``matrix_outcomes.toml`` is: beside ``table.toml`` (the wheel's ``_spec`` or the repo's ``spec/``)."""
    return spec_file("matrix_outcomes.toml")


def _errcode_row(raw: Any, i: int) -> ErrcodeRow:
    where = f"errcodes[{i}]"
    if not isinstance(raw, dict):
        raise OutcomeTableError(f"{where}: must be a table", code=Code.WRONG_TYPE, where=where)
    unknown = set(raw) - {"errcode", "statuses", "outcome", "rule"}
    if unknown:
        raise OutcomeTableError(
            f"{where}: unknown fields {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=f"{where}.{min(unknown)}"
        )
    errcode = raw.get("errcode")
    if not isinstance(errcode, str) or not errcode.startswith("M_"):
        raise OutcomeTableError(
            f"{where}: errcode must be a Matrix error code such as 'M_FORBIDDEN'",
            code=Code.INVALID_VALUE,
            where=f"{where}.errcode",
        )
    outcome = raw.get("outcome")
    if outcome not in OUTCOMES or outcome == "success":
        raise OutcomeTableError(
            f"{where}: outcome must be not_sent or unknown, got {outcome!r}",
            code=Code.SUCCESS_UNPROVEN if outcome == "success" else Code.UNKNOWN_OUTCOME,
            where=f"{where}.outcome",
        )
    statuses = raw.get("statuses")
    if not isinstance(statuses, list) or not statuses or not all(isinstance(s, int) for s in statuses):
        raise OutcomeTableError(
            f"{where}: statuses must be a non-empty list of integers",
            code=Code.INVALID_VALUE,
            where=f"{where}.statuses",
        )
    if any(s < 300 for s in statuses):
        raise OutcomeTableError(
            f"{where}: an errcode row cannot match a 1xx or 2xx status",
            code=Code.INVALID_VALUE,
            where=f"{where}.statuses",
        )
    if outcome == "not_sent" and any(not 400 <= s <= 499 for s in statuses):
        raise OutcomeTableError(
            f"{where}: a not_sent errcode row may only match 4xx statuses (a 5xx is no proof)",
            code=Code.NOT_SENT_UNPROVEN,
            where=where,
        )
    return ErrcodeRow(errcode, outcome, str(raw.get("rule", "")), tuple(statuses))


def parse_matrix_outcomes(raw: Mapping[str, Any]) -> MatrixOutcomeTable:
    """Validate parsed TOML and build a :class:`MatrixOutcomeTable`. Raises ``OutcomeTableError``."""
    unknown = set(raw) - {"format", "default", "errors", "statuses", "errcodes", "local"}
    if unknown:
        raise OutcomeTableError(
            f"unknown top-level keys {sorted(unknown)}", code=Code.UNKNOWN_FIELD, where=min(unknown)
        )
    http = parse_outcome_table(raw)
    for i, row in enumerate(http.statuses):
        if row.may_exist:
            raise OutcomeTableError(
                "a Matrix table has no may_exist row: a homeserver answers a duplicate txnId with 200",
                code=Code.UNKNOWN_FIELD,
                where=f"statuses[{i}].may_exist",
            )
    local_raw = raw.get("local")
    if not isinstance(local_raw, dict):
        raise OutcomeTableError(f"[local] rows must be exactly {LOCAL_KINDS}", code=Code.MISSING, where="local")
    fault = kinds_fault(local_raw, LOCAL_KINDS, "local")
    if fault is not None:
        raise OutcomeTableError(f"[local] rows must be exactly {LOCAL_KINDS}", code=fault[0], where=fault[1])
    local: dict[str, tuple[str, str]] = {}
    for kind, row in local_raw.items():
        message = f"local.{kind}: a refusal before any byte is not_sent"
        if not isinstance(row, dict):
            raise OutcomeTableError(message, code=Code.WRONG_TYPE, where=f"local.{kind}")
        if row.get("outcome") != "not_sent":
            raise OutcomeTableError(message, code=Code.NOT_SENT_REQUIRED, where=f"local.{kind}.outcome")
        local[kind] = ("not_sent", str(row.get("rule", "")))
    errcodes_raw = raw.get("errcodes", [])
    if not isinstance(errcodes_raw, list):
        raise OutcomeTableError("[[errcodes]] must be an array of tables", code=Code.WRONG_TYPE, where="errcodes")
    errcodes = tuple(_errcode_row(r, i) for i, r in enumerate(errcodes_raw))
    return MatrixOutcomeTable(http, errcodes, MappingProxyType(local))


def load_matrix_outcomes(path: str | Path | None = None) -> MatrixOutcomeTable:
    """Read and validate the table at ``path`` (default :func:`matrix_outcomes_path`)."""
    p = Path(path) if path is not None else matrix_outcomes_path()
    return load_file(p, parse_matrix_outcomes, OutcomeTableError)


@functools.cache
def matrix_outcome_table() -> MatrixOutcomeTable:
    """The shipped table, loaded once."""
    return load_matrix_outcomes()
