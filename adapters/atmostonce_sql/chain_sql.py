"""The history row hash in PostgreSQL's SQL (format ``atmostonce.audit.CHAIN_TAG``), for the chain trigger
that migrations 0002 and 0016 install: the same length-prefixed field texts, in ``atmostonce.audit``'s order, as
``atmostonce.audit.chain_hash`` hashes. A new format gets a new tag and a new expression, never an edit of this
one (docs/design.md#the-audit-order-tamper-evidence-the-role-reconciliation-records)."""

from __future__ import annotations

from atmostonce import audit

_ENC = "CASE WHEN {v} IS NULL THEN '~;' ELSE octet_length({v})::text || ':' || {v} || ';' END"
_FIELDS = (
    "{row}.seq::text",
    "{row}.key",
    "{row}.event",
    "{row}.actor",
    "{row}.from_state",
    "{row}.to_state",
    "{row}.attempt_token",
    "{row}.generation::text",
    "{row}.detail::text",
    "encode(float8send({row}.recorded_at), 'hex')",
)
assert len(_FIELDS) == len(audit.HISTORY_FIELDS)


def row_hash_sql(row: str = "NEW") -> str:
    """The SQL expression of the row hash of the history row ``row`` (its ``prev_hash`` and its fields)."""
    fields = " || ".join(_ENC.format(v=f.format(row=row)) for f in _FIELDS)
    prev = _ENC.format(v=f"{row}.prev_hash")
    return f"encode(sha256(convert_to('{audit.CHAIN_TAG}' || chr(10) || {prev} || {fields}, 'UTF8')), 'hex')"
