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
from typing import TYPE_CHECKING, Any

from .identity import canonical_json
from .names import EFFECT

if TYPE_CHECKING:
    from .protocols import AuditStore

__all__ = [
    "CHAIN_TAG",
    "HISTORY_FIELDS",
    "INTENT_BOUND_FIELDS",
    "INTENT_COUNTERS",
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
    "replay_chain",
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
    # the intent row's current state, generation and counters (``INTENT_BOUND_FIELDS``), when the
    # store hands them over: verify replays the chain through the table and compares (docs/design.md,
    # "The chain replayed through the table")
    intent: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ChainBreak:
    """The first place an intent's chain fails to verify.

    ``seq`` is the first row that does not verify (``None`` when rows are missing after the last
    one); ``reason`` is ``unhashed``, ``content`` (the row differs from what was hashed), ``link``
    (its ``prev_hash`` is not the hash of the row before it: a row was removed, inserted or
    reordered, or the row before was rewritten together with its hash), ``count``, ``replay`` (the
    row is not a move of the table: ``field`` is ``event``, ``from_state`` or ``to_state``),
    ``intent`` (the intent row disagrees with what the chain derives: ``field`` names the column)
    or ``missing_intent`` (history rows whose intent row is gone).
    """

    key: str
    seq: int | None
    reason: str
    message: str
    field: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "seq": self.seq, "reason": self.reason, "field": self.field, "message": self.message}


INTENT_COUNTERS = {
    "attempt_count": "open_attempt",
    "reconcile_count": "count_reconcile",
    "resend_epoch": "bump_resend_epoch",
    "fence_epoch": "bump_fence_epoch",
}
"""Each counter of the intent row and the table effect that raises it by one (``history_count`` is
checked against the rows present)."""

INTENT_BOUND_FIELDS = ("state", "generation", *INTENT_COUNTERS)
"""The intent columns bound to its chain: what a replay of the chain through the table derives."""


def replay_chain(chain: AuditChain, table: Any) -> ChainBreak | None:
    """Replay an intact chain through the table: the first row is the creating event into the initial
    state, every later row an event of the table whose sources hold its ``from_state``, whose target is
    its ``to_state``, and whose ``from_state`` is the previous row's ``to_state``. Then the state, the
    generation (of the last row whose event opens an attempt) and each counter of
    :data:`INTENT_COUNTERS` derived from the rows must equal ``chain.intent``'s. Returns the first
    break (reason ``replay`` or ``intent``, ``field`` naming what differs), or ``None``."""
    ix = {f: i for i, f in enumerate(HISTORY_FIELDS)}
    state: str | None = None
    derived: dict[str, Any] = dict.fromkeys(INTENT_COUNTERS, 0) | {"generation": None}
    for n, row in enumerate(chain.rows):
        event, frm, to = (row.fields[ix[f]] for f in ("event", "from_state", "to_state"))
        ev = table.events.get(event)
        if ev is None or (n == 0) != bool(ev.creates):
            return ChainBreak(
                chain.key, row.seq, "replay", f"history row {row.seq}: {event!r} is no move here", "event"
            )
        if frm != state:
            return ChainBreak(
                chain.key, row.seq, "replay", f"history row {row.seq} starts from {frm!r}, not {state!r}", "from_state"
            )
        if (not ev.creates and frm not in ev.sources) or to != (table.initial if ev.creates else ev.target):
            return ChainBreak(
                chain.key, row.seq, "replay", f"history row {row.seq}: {event} does not move {frm} to {to}", "to_state"
            )
        state = to
        for counter, effect in INTENT_COUNTERS.items():
            if effect in ev.effects:
                derived[counter] += 1
        if EFFECT.open_attempt in ev.effects:
            gen = row.fields[ix["generation"]]
            derived["generation"] = None if gen is None else int(gen)
    derived["state"] = state
    for f in INTENT_BOUND_FIELDS:
        have = (chain.intent or {}).get(f)
        if f in (chain.intent or {}) and have != derived[f]:
            return ChainBreak(
                chain.key, None, "intent", f"the intent's {f} is {have!r}; its history derives {derived[f]!r}", f
            )
    return None


def verify_chain(chain: AuditChain, table: Any = None) -> ChainBreak | None:
    """Walk one chain from its first row; return the first break, or ``None`` when it is intact. With
    ``table`` and an ``intent`` on the chain, an intact chain is also replayed (:func:`replay_chain`)."""
    broken = _verify_links(chain)
    if broken is None and table is not None and chain.intent is not None:
        return replay_chain(chain, table)
    return broken


def _verify_links(chain: AuditChain) -> ChainBreak | None:
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


def verify_store(store: AuditStore, keys: Iterable[str] | None = None) -> AuditReport:
    """Verify the chains of ``keys`` (default: every intent, and then also the history of intents that are
    gone, ``audit_orphans()``) of a store with ``audit_chain(key)``, replayed through ``store.table``."""
    breaks: list[ChainBreak] = []
    heads: dict[str, str | None] = {}
    n = rows = 0
    every = keys is None
    if keys is None:
        keys = store.audit_keys()
    table = getattr(store, "table", None)
    for key in keys:
        chain = store.audit_chain(key)
        n += 1
        rows += len(chain.rows)
        heads[key] = chain.rows[-1].row_hash if chain.rows else None
        broken = verify_chain(chain, table)
        if broken is not None:
            breaks.append(broken)
    if every:  # history rows whose intent row is gone (an intent deleted under the store)
        for key in store.audit_orphans():
            breaks.append(ChainBreak(key, None, "missing_intent", "history rows remain, the intent row is gone", "key"))
    return AuditReport(n, rows, tuple(breaks), heads)


# ---------------------------------------------------------------- reconciliation of a send

RECONCILIATION_RESULTS = ("unknown", "confirmed", "failed")
"""What a reconciliation record can say of a send; only evidence moves it off ``unknown``."""


def _result_by_state(table: Any) -> dict[str, str]:
    """What landing in a state says of a send: still unknown, the object exists, or proved not sent."""
    s = table.names.state
    return {s.indeterminate: "unknown", s.published: "confirmed", s.failed: "failed"}


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
    if ev.target == table.names.state.indeterminate and ev.target not in ev.sources:
        return ("open", "unknown")
    result = _result_by_state(table).get(ev.target)
    if result is None:
        return None
    if table.names.effect.count_reconcile in ev.effects:
        return ("lookup", result)
    if table.actors[ev.actor].human and result != "unknown" and table.names.state.parked in ev.sources:
        return ("settle", result)
    return None


def lookup_events(table: Any) -> tuple[str, ...]:
    """The table's events whose reconciliation record is a reconciler's lookup (``("lookup", result)`` of
    :func:`reconciliation_step`), in table order: what ``atmostonce status`` counts as lookups, leaving out the
    record a send's unknown outcome opens and a person's settlement."""
    return tuple(e for e in table.events if (step := reconciliation_step(table, e)) is not None and step[0] == "lookup")


def current_reconciliations(records: Iterable[Any]) -> dict[int, Any]:
    """The current record per send (``send_seq``): the newest row of each, records in ``seq`` order."""
    out: dict[int, Any] = {}
    for r in records:
        if r.send_seq is not None:
            out[r.send_seq] = r
    return out
