"""Bulk settle: one operator move per selected intent, each through the store's own guarded move.

Shared by the console's settle page and ``atmostonce settle``. A selection is a filter over the intents
(state, account, kind, target); settling it calls the store move once per intent, so every guard applies
to each one on its own and a refusal of one (its state moved on since the selection was made, say) is
reported for that key and stops nothing else (docs/design.md, "The gate is the conditional write").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from atmostonce.errors import IntakeError, Rejected, StoreError
from atmostonce.protocols import OperatorStore
from atmostonce.records import Intent, check_text

__all__ = ["SETTLE_MOVES", "SettleResult", "refusal_doc", "select", "settle", "would"]

SETTLE_MOVES: Mapping[str, str] = {"not-sent": "resolve_not_sent", "resend": "resend", "park": "park"}
"""``--as`` choice -> the table event (and store method) it performs. ``published`` is not here: each object
has its own remote id, read back one by one on the intent page (``resolve --published``)."""


@dataclass(frozen=True)
class SettleResult:
    """What settling one key did: ``result`` is ``moved`` (``state_after`` holds where it went), ``refused``
    (``refused`` holds the typed refusal: event, guard, state, meaning, next moves) or ``error``."""

    key: str
    state_before: str | None
    result: str
    state_after: str | None = None
    refused: dict[str, Any] | None = None
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _event(as_: str) -> str:
    try:
        return SETTLE_MOVES[as_]
    except KeyError:
        raise IntakeError(f"settle --as is one of {', '.join(SETTLE_MOVES)}, got {as_!r}") from None


def select(
    store: OperatorStore,
    *,
    state: str,
    account: str | None = None,
    kind: str | None = None,
    target: str | None = None,
    limit: int = 1000,
) -> list[Intent]:
    """The intents in ``state`` (a table state) that match every filter given, oldest change first."""
    if state not in store.table.states:
        raise IntakeError(f"unknown state {state!r}; states: {', '.join(store.table.states)}")
    items = store.list_intents(state=state, limit=limit)
    picked = [
        it
        for it in items
        if (account is None or it.account == account)
        and (kind is None or it.action_kind == kind)
        and (target is None or it.target == target)
    ]
    return sorted(picked, key=lambda it: (it.updated_at, it.key))


def would(store: OperatorStore, intents: Iterable[Intent], as_: str) -> list[dict[str, Any]]:
    """The dry run: for each intent, the move the table lists from its state (``to``), or ``None`` when the
    table has no such move from there. Guards are not predicted: the store decides them at settle time."""
    ev = store.table.event(_event(as_))
    return [
        {
            "key": it.key,
            "state": it.state,
            "account": it.account,
            "kind": it.action_kind,
            "target": it.target,
            "event": ev.name,
            "to": ev.target if it.state in ev.sources else None,
        }
        for it in intents
    ]


def next_moves(table, exc: Rejected) -> list[dict[str, Any]]:
    """For a move refused by its source state: the operator's moves, from the table, that take the intent from
    where it is to a state the refused move starts from (``park`` before ``resolve_not_sent``)."""
    if exc.guard != "source_state" or exc.state is None or exc.event not in table.events:
        return []
    wanted = table.sources(exc.event)
    return [
        {"event": e.name, "from": exc.state, "to": e.target}
        for e in table.events.values()
        if table.is_human(e.name) and exc.state in e.sources and e.target in wanted and e.target != exc.state
    ]


def refusal_doc(table, exc: Rejected) -> dict[str, Any]:
    """A typed refusal for a person: the refused event, the guard (its meaning from the table), the state, and
    the moves that would make the refused one possible."""
    guard = table.guards.get(exc.guard)
    if guard is not None:
        meaning = guard.meaning
    elif exc.guard == "source_state" and exc.event in table.events:
        meaning = f"{exc.event} starts only from {', '.join(table.sources(exc.event))}"
    else:
        meaning = exc.detail or exc.guard
    return exc.as_dict() | {"meaning": meaning, "detail": exc.detail, "next": next_moves(table, exc)}


def settle(store: OperatorStore, keys: Iterable[str], *, as_: str, operator: str, reason: str) -> list[SettleResult]:
    """Settle each key by the move ``as_`` names, one guarded store move per key, in the order given."""
    event = _event(as_)
    operator = check_text("operator", operator)
    reason = check_text("reason", reason)
    out: list[SettleResult] = []
    for key in keys:
        found = store.find(key)
        before = None if found is None else found.state
        try:
            if event == "resend":
                it = store.resend(key, operator=operator)
            else:
                it = getattr(store, event)(key, operator=operator, reason=reason)
        except Rejected as exc:
            out.append(SettleResult(key, before, "refused", refused=refusal_doc(store.table, exc)))
            continue
        except (IntakeError, StoreError) as exc:
            out.append(SettleResult(key, before, "error", error=str(exc)))
            continue
        out.append(SettleResult(key, before, "moved", state_after=it.state))
    return out
