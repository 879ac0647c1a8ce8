"""What needs a person, oldest first, each with why it is there and what can be done (docs/console.md).

Every state, guard and outcome name here comes from the loaded tables (spec/table.toml, spec/claim.toml,
spec/approval.toml) through their kinds: nothing lists them by name.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from atmostonce.protocols import OperatorStore
from atmostonce.records import Intent
from atmostonce.table import machine

__all__ = ["ACTIONS", "QueueItem", "actions_for", "build_queue", "why"]

ACTIONS: dict[str, str] = {
    "park": "park",
    "resolve_published": "resolve as published",
    "resolve_not_sent": "resolve as not sent",
    "resend": "re-send under a new epoch",
    "retry": "retry",
}
"""The intent moves the console offers (table events, each a store method of the same name) and their
labels. Which of them an intent is offered is read from the table: the ones whose sources hold its state."""


@dataclass
class QueueItem:
    intent: Intent
    category: str
    why: str
    age: float
    actions: list[str] = field(default_factory=list)
    detail: dict[str, Any] = field(default_factory=dict)


def actions_for(table, it: Intent) -> list[str]:
    """The console's moves the table allows from ``it``'s state (a guard may still refuse one)."""
    return [ev for ev in ACTIONS if ev in table.events and it.state in table.sources(ev)]


def why(store: OperatorStore, it: Intent) -> str:
    """In words, what put ``it`` where it is: the move into its state (from its history), the outcome or
    guard it names, with the table's meaning for each."""
    t = store.table
    hist = store.history(it.key)
    entry = next((h for h in reversed(hist) if h.to_state == it.state and h.from_state != it.state), None)
    if entry is None:
        return t.states[it.state].meaning
    reason = str(entry.detail.get("reason") or "")
    parts = [f"{entry.event} by {entry.actor}"]
    name, _, guard = reason.partition(":")
    outcome = t.outcomes.get(name)
    if outcome is not None:
        parts.append(f"{name}: {outcome.meaning}")
        if guard.strip() in t.guards:
            parts.append(f"refused by {guard.strip()}: {t.guards[guard.strip()].meaning}")
    else:
        mapped = [o for o in t.outcomes.values() if o.event == entry.event]
        if len(mapped) == 1:
            parts.append(f"{mapped[0].name}: {mapped[0].meaning}")
        if reason:
            parts.append(f"reason: {reason}")
    return "; ".join(parts)


def build_queue(store: OperatorStore, *, limit: int = 500) -> tuple[list[QueueItem], dict[str, Any]]:
    """The queue of what needs a person, oldest first, and a note of what was left out (the intents of the
    unknown kind the reconciler has not looked at yet: still the machine's work; lists cut at ``limit``)."""
    t = store.table
    now = store.now()
    items: list[QueueItem] = []
    notes: dict[str, Any] = {"waiting_for_first_look": 0, "truncated": []}

    def listed(state: str) -> list[Intent]:
        got = store.list_intents(state=state, limit=limit + 1)
        if len(got) > limit:
            notes["truncated"].append(state)
        return got[:limit]

    def add(it: Intent, category: str, **detail: Any) -> None:
        items.append(QueueItem(it, category, why(store, it), max(0.0, now - it.updated_at), actions_for(t, it), detail))

    for state in t.states_of_kind("unknown"):
        for it in listed(state):
            if it.reconcile_count > 0:
                add(it, "unknown after reconciliation", looks=f"{it.reconcile_count}/{it.max_reconciles}")
            else:
                notes["waiting_for_first_look"] += 1
    for state in t.states_of_kind("human_owned"):
        for it in listed(state):
            add(it, "parked")
    for state in t.states_of_kind("retryable"):
        for it in listed(state):
            if it.attempt_count >= it.max_attempts:
                add(it, "failed at the attempt cap", attempts=f"{it.attempt_count}/{it.max_attempts}")

    claim_t, approval_t = machine("claim"), machine("approval")
    uncertain = set(claim_t.states_of_kind("uncertain"))
    live = set(approval_t.states_of_kind("live"))
    seen_targets: set[str] = set()
    for state in t.states_of_kind("unknown", "human_owned"):  # where an uncertain claim's intent is
        for it in listed(state):
            if not it.requires_approval or it.target in seen_targets:
                continue
            claim = store.claim(it.target)
            if claim is not None and claim.state in uncertain and claim.key == it.key:
                seen_targets.add(it.target)
                items.append(
                    QueueItem(
                        it,
                        "uncertain claim",
                        f"target {it.target}: {claim_t.states[claim.state].meaning}",
                        max(0.0, now - claim.updated_at),
                        actions_for(t, it),
                        {"claim": claim.state, "epoch": claim.epoch},
                    )
                )
    for it in listed(t.initial):
        if it.requires_approval and not any(a.state in live for a in store.approvals(it.key)):
            items.append(
                QueueItem(
                    it,
                    "approval waiting",
                    "submitted with requires_approval: no live approval binds its bytes yet",
                    max(0.0, now - it.created_at),
                    ["approve"],
                )
            )
    items.sort(key=lambda q: (-q.age, q.intent.key))
    return items, notes
