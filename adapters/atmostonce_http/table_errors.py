"""What every transport's classification table error carries: the reason as an :class:`OutcomeTableCode`, the
file and the place in the table.

``spec/http_outcomes.toml``, ``spec/matrix_outcomes.toml``, ``spec/email_outcomes.toml`` and
``spec/exception_outcomes.toml`` are read by one loader (:func:`atmostonce_http.classify.read_toml`) and
checked by the same kinds of rule, so their errors share one base, :class:`OutcomeTableFileError`, and one
enum of reasons. Each transport raises its own subclass (``OutcomeTableError``, ``EmailOutcomeTableError``,
``ExceptionTableError``). A script or a test reads ``code`` and ``where``; the message is for a person.
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["OutcomeTableCode", "OutcomeTableFileError"]


class OutcomeTableCode(enum.StrEnum):
    """Why a classification table (or a row passed in) was refused: ``OutcomeTableFileError.code``."""

    NOT_FOUND = "not_found"
    """no table file where one was looked for"""
    NOT_TOML = "not_toml"
    """the file is not valid TOML"""
    FORMAT = "format"
    """``format`` is not a format this loader reads (``1``)"""
    UNKNOWN_FIELD = "unknown_field"
    """a key the format does not have: a top-level key, a field of a row, a row for a failure kind (or a
    Matrix local refusal) the transport never reports, a ``may_exist`` row in a Matrix table"""
    MISSING = "missing"
    """a section, a row or a field the format requires is absent or empty: ``[errors]``, ``[[statuses]]``,
    the row of a failure kind, a row's ``rule``, a success row's ``without_id``"""
    WRONG_TYPE = "wrong_type"
    """a section or a row of the wrong shape: a row that is not a table, rows that are not a list"""
    INVALID_VALUE = "invalid_value"
    """a field whose value the format does not allow: an empty code list, a range with low above high, a
    phase or an errcode that does not exist, a class or an attribute that is not a dotted name"""
    UNKNOWN_OUTCOME = "unknown_outcome"
    """an outcome name that is not one of the send outcomes the table's rows may have"""
    SELECTOR = "selector"
    """a row that does not say in exactly one way what it matches (``codes``, ``range``, ``may_exist``;
    ``codes`` or ``range`` without the ``attribute`` they apply to)"""
    DEFAULT_NOT_UNKNOWN = "default_not_unknown"
    """the ``default`` is not the unknown outcome: a send no row knows is never claimed not sent"""
    SUCCESS_UNPROVEN = "success_unproven"
    """a row that would record success where nothing proves the object exists: a failure, an error answer,
    a response without an object id, an SMTP reply other than a 2xx to the end of the payload"""
    NOT_SENT_UNPROVEN = "not_sent_unproven"
    """a row that would record not sent where nothing proves no byte was taken: a catch-all exception class
    (``builtins.Exception``), an SMTP reply below 400, a Matrix errcode row matching a 5xx"""
    NOT_SENT_REQUIRED = "not_sent_required"
    """a refusal the transport decides before any byte leaves (a Matrix ``[local]`` row) given another
    outcome than not sent"""
    UNREACHABLE = "unreachable"
    """a row no exception can reach: an earlier row for its class has no ``attribute`` and matches first"""


class OutcomeTableFileError(ValueError):
    """A classification table is missing, is not TOML, or has a row or a field its format refuses.

    Attributes: ``code`` (an :class:`OutcomeTableCode`), ``where`` (the path inside the table of the field at
    fault when one field's value is refused, e.g. ``"errors.read_timeout.outcome"``, ``"statuses[0].typo"``
    or ``"default"``; of the row when what its fields say together is refused, e.g. ``"replies[0]"``; of the
    section when a section is, e.g. ``"statuses"``; ``None`` when the whole file is at fault) and ``path``
    (the file, as a string; ``None`` for rows passed in or a table parsed from a mapping)."""

    def __init__(self, message: str, *, code: OutcomeTableCode, where: str | None = None, path: str | None = None):
        self.code, self.where, self.path = code, where, path
        super().__init__(message)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "where": self.where, "path": self.path}
