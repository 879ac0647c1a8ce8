"""The audit chain: one definition of the per-intent history hash, shared by the model and the stores.

Every history row carries ``prev_hash`` (the ``row_hash`` of the row before it for the same
intent, ``None`` for the first) and ``row_hash``, SHA-256 over a domain tag, the previous hash and
the row's fields, each field as text. Editing a row breaks its own hash; removing or reordering a
row breaks the next row's link; removing the newest row is caught by the intent's count of history
rows. A writer able to rewrite every row of a chain *and* the intent row consistently defeats all of
this: the chain detects tampering, it cannot prevent it (anchor the heads that
``atmostonce audit verify --json`` prints somewhere else if that matters).

Text forms of the fields (what :func:`chain_hash` hashes; a store hands the verifier the same text):

* integers (``seq``, ``generation``): decimal digits;
* text columns: as stored;
* ``recorded_at``: the 16 hex digits of the IEEE 754 double, big-endian (PostgreSQL's
  ``float8send``), so no decimal float formatting of either dialect enters the hash;
* ``detail``: the store's own JSON text of the row's detail: RFC 8785 canonical JSON in the
  model, the stored text on SQLite, ``jsonb::text`` on PostgreSQL (jsonb's deterministic output);
* ``NULL``: no text at all (encoded as ``~;``); any other value as ``<utf-8 length>:<text>;``.

PostgreSQL computes the same function in a ``BEFORE INSERT`` trigger (migration 0002); SQLite
calls this module through a function registered on each connection. The verifier here recomputes
every row, so a trigger that disagreed with this definition would fail every verification test.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .identity import canonical_json

__all__ = [
    "CHAIN_TAG",
    "HISTORY_FIELDS",
    "RECONCILIATION_RESULTS",
    "AuditChain",
    "AuditReport",
    "AuditRow",
    "ChainBreak",
    "chain_hash",
    "current_reconciliations",
    "field_texts",
    "float_text",
    "history_hash",
    "model_detail_text",
    "reconciliation_step",
    "verify_chain",
    "verify_store",
]

CHAIN_TAG = "atmostonce.history.v1"
"""Domain tag and version of the chain format; a new format gets a new tag, never an edit."""

HISTORY_FIELDS = (
    "seq",
    "key",
    "event",
    "actor",
    "from_state",
    "to_state",
    "attempt_token",
    "generation",
    "detail",
    "recorded_at",
)
"""The history columns a row hash covers, in hashing order (every column but the two hashes)."""


def _enc(text: str | None) -> str:
    if text is None:
        return "~;"
    return f"{len(text.encode('utf-8'))}:{text};"


def chain_hash(prev_hash: str | None, fields: Sequence[str | None]) -> str:
    """The row hash: SHA-256 (hex) of the tag, the previous row's hash and the row's field texts."""
    if len(fields) != len(HISTORY_FIELDS):
        raise ValueError(f"a history row has {len(HISTORY_FIELDS)} fields, got {len(fields)}")
    payload = CHAIN_TAG + "\n" + _enc(prev_hash) + "".join(_enc(f) for f in fields)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def float_text(value: float) -> str:
    """A double as the hex of its IEEE 754 bits (big-endian), the same on every dialect."""
    return struct.pack(">d", float(value)).hex()


def _int_text(value: Any) -> str | None:
    return None if value is None else str(int(value))


def field_texts(
    seq: int,
    key: str,
    event: str,
    actor: str,
    from_state: str | None,
    to_state: str,
    attempt_token: str | None,
    generation: int | None,
    detail_text: str,
    recorded_at: float,
) -> tuple[str | None, ...]:
    """The text forms of one history row's fields, in :data:`HISTORY_FIELDS` order."""
    return (
        _int_text(seq),
        key,
        event,
        actor,
        from_state,
        to_state,
        attempt_token,
        _int_text(generation),
        detail_text,
        float_text(recorded_at),
    )


def history_hash(prev_hash: str | None, *values: Any) -> str:
    """:func:`chain_hash` over raw column values in :data:`HISTORY_FIELDS` order (``detail`` as its
    JSON text); the function SQLite registers as ``aom_chain_hash``."""
    return chain_hash(prev_hash, field_texts(*values))


def model_detail_text(detail: Mapping[str, Any]) -> str:
    """The model's text form of a detail object: RFC 8785 canonical JSON."""
    return canonical_json(dict(detail)).decode("utf-8")


@dataclass(frozen=True)
class AuditRow:
    """One history row as the verifier sees it: its field texts and the two stored hashes."""

    seq: int
    fields: tuple[str | None, ...]
    prev_hash: str | None
    row_hash: str | None


@dataclass(frozen=True)
class AuditChain:
    """An intent's history rows in sequence order, and how many rows the intent row says it wrote."""

    key: str
    rows: tuple[AuditRow, ...]
    recorded_rows: int | None


@dataclass(frozen=True)
class ChainBreak:
    """The first place an intent's chain fails to verify.

    ``seq`` is the first row that does not verify (``None`` when rows are missing after the last
    one); ``reason`` is ``unhashed``, ``content`` (the row differs from what was hashed), ``link``
    (its ``prev_hash`` is not the hash of the row before it: a row was removed, inserted or
    reordered, or the row before was rewritten together with its hash) or ``count``.
    """

    key: str
    seq: int | None
    reason: str
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "seq": self.seq, "reason": self.reason, "message": self.message}


def verify_chain(chain: AuditChain) -> ChainBreak | None:
    """Walk one chain from its first row; return the first break, or ``None`` when it is intact."""
    prev: str | None = None
    for row in chain.rows:
        if row.row_hash is None:
            return ChainBreak(chain.key, row.seq, "unhashed", f"history row {row.seq} carries no hash")
        if row.prev_hash != prev:
            return ChainBreak(
                chain.key,
                row.seq,
                "link",
                f"history row {row.seq} does not link to the row before it: a row was removed, inserted "
                "or reordered, or the previous row was rewritten with its hash",
            )
        if chain_hash(row.prev_hash, row.fields) != row.row_hash:
            return ChainBreak(chain.key, row.seq, "content", f"history row {row.seq} differs from what was hashed")
        prev = row.row_hash
    if chain.recorded_rows is not None and chain.recorded_rows != len(chain.rows):
        return ChainBreak(
            chain.key,
            None,
            "count",
            f"the intent recorded {chain.recorded_rows} history rows, {len(chain.rows)} are present",
        )
    return None


@dataclass(frozen=True)
class AuditReport:
    """The result of verifying chains: how many were walked and the first break of each broken one."""

    intents: int
    rows: int
    breaks: tuple[ChainBreak, ...]
    heads: Mapping[str, str | None]

    @property
    def intact(self) -> bool:
        return not self.breaks

    def as_dict(self) -> dict[str, Any]:
        return {
            "intact": self.intact,
            "intents": self.intents,
            "rows": self.rows,
            "breaks": [b.as_dict() for b in self.breaks],
            "heads": dict(self.heads),
        }


def verify_store(store: Any, keys: Iterable[str] | None = None) -> AuditReport:
    """Verify the chains of ``keys`` (default: every intent) of a store with ``audit_chain(key)``."""
    if keys is None:
        keys = store.audit_keys()
    breaks: list[ChainBreak] = []
    heads: dict[str, str | None] = {}
    n = rows = 0
    for key in keys:
        chain = store.audit_chain(key)
        n += 1
        rows += len(chain.rows)
        heads[key] = chain.rows[-1].row_hash if chain.rows else None
        broken = verify_chain(chain)
        if broken is not None:
            breaks.append(broken)
    return AuditReport(n, rows, tuple(breaks), heads)


# ---------------------------------------------------------------- reconciliation of a send

RECONCILIATION_RESULTS = ("unknown", "confirmed", "failed")
"""What a reconciliation record can say of a send; only evidence moves it off ``unknown``."""

_RESULT_BY_DISPOSITION = {"awaiting_evidence": "unknown", "done": "confirmed", "retryable": "failed"}


def reconciliation_step(table: Any, event: str) -> tuple[str, str] | None:
    """What a move writes into the reconciliation records, derived from the table:

    * ``("open", "unknown")``: the move into the unknown-outcome state from outside it
      (``record_unknown``, ``expire_lease``, ``read_back_failed``, ``restore_fence``) opens a record
      for the send, keyed by this move's history ``seq`` (``send_seq``);
    * ``("lookup", result)``: a reconciler lookup (effect ``count_reconcile``) appends what it found
      to the open record: ``confirmed``, ``failed`` (fenced absence) or ``unknown`` (nothing proven);
    * ``("settle", result)``: a person's resolution of a human-owned intent (``resolve_published``,
      ``resolve_not_sent``) appends ``confirmed`` or ``failed``, when the newest record is still unknown;
    * ``None``: the move says nothing about a send (a refusal writes nothing at all).
    """
    ev = table.event(event)
    target = table.states[ev.target]
    if target.kind == "unknown" and ev.target not in ev.sources:
        return ("open", "unknown")
    result = _RESULT_BY_DISPOSITION.get(target.disposition)
    if result is None:
        return None
    if "count_reconcile" in ev.effects:
        return ("lookup", result)
    if (
        table.actors[ev.actor].human
        and result != "unknown"
        and any(table.states[s].kind == "human_owned" for s in ev.sources)
    ):
        return ("settle", result)
    return None


def current_reconciliations(records: Iterable[Any]) -> dict[int, Any]:
    """The current record per send (``send_seq``): the newest row of each, records in ``seq`` order."""
    out: dict[int, Any] = {}
    for r in records:
        if r.send_seq is not None:
            out[r.send_seq] = r
    return out
