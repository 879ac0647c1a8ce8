"""The reconciliation rule: what each move writes into the reconciliation records.

``reconciliation_step`` derives it from the table; a person settles an unknown send only by a move out of
a human-owned state to a proven result, which the tests check on variants of the shipped table.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from atmostonce.audit import reconciliation_step
from atmostonce.table import table


def variant(**events):
    """The shipped table with some events replaced (name -> field changes)."""
    t = table()
    changed = dict(t.events)
    for name, fields in events.items():
        changed[name] = dataclasses.replace(t.events[name], **fields)
    return dataclasses.replace(t, events=MappingProxyType(changed))


def test_the_shipped_table_settles_only_a_persons_resolution_of_a_parked_intent():
    t = table()
    settles = {e: reconciliation_step(t, e) for e in t.events if (reconciliation_step(t, e) or ("",))[0] == "settle"}
    assert settles == {"resolve_published": ("settle", "confirmed"), "resolve_not_sent": ("settle", "failed")}
    assert reconciliation_step(t, "resend") is None  # back to pending: proves nothing


def test_a_machine_moving_a_parked_intent_to_a_result_settles_nothing():
    # a non-human actor resolving a human-owned intent is no settlement by a person
    t = variant(resolve_published={"actor": "reconciler"})
    assert t.actors["reconciler"].human is False
    assert reconciliation_step(t, "resolve_published") is None


def test_a_person_moving_an_intent_that_is_not_human_owned_to_a_result_settles_nothing():
    # an operator move from pending straight to published: human, a result, but not out of a human-owned state
    t = variant(resolve_published={"sources": ("pending",)})
    assert t.states["pending"].kind != "human_owned"
    assert reconciliation_step(t, "resolve_published") is None


def test_a_person_moving_a_parked_intent_back_to_unknown_settles_nothing():
    # an operator re-opening a parked intent for reconciliation (already unknown, so no new record opens):
    # human and out of a human-owned state, but "unknown" is no settlement
    t = variant(resolve_published={"sources": ("parked", "indeterminate"), "target": "indeterminate"})
    assert t.states["indeterminate"].disposition == "awaiting_evidence"
    assert reconciliation_step(t, "resolve_published") is None
    # the same move into a proven result does settle
    t2 = variant(resolve_published={"sources": ("parked", "indeterminate")})
    assert reconciliation_step(t2, "resolve_published") == ("settle", "confirmed")
