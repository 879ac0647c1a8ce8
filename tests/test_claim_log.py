"""A target's claim log in the order things happened, and refusals that name their supersession
(docs/design.md, "Approvals and per-target dispatch claims" and "The audit")."""

from __future__ import annotations

import json

import pytest

from atmostonce import GuardRefused, IllegalMove
from atmostonce.records import ClaimEntry, Refusal
from tests.helpers import submit
from tests.test_claims import TARGET, approve, gated, reserve
from tests.test_store_reads_and_refusals import second_attempt


def _stale_release_after_replace(any_store):
    """w1 reserves (epoch 1) and lapses; w2 replaces (epoch 2); w1's release is refused.
    Returns the store, w1's stale claim lease and w2's live one."""
    s = any_store.store
    a, b = gated(s, "first draft"), gated(s, "second draft")
    pa, pb = approve(s, a), approve(s, b)
    old = reserve(s, a, pa, owner="worker-A", lease_seconds=10)
    any_store.advance(11)
    new = reserve(s, b, pb, owner="worker-B")
    with pytest.raises(GuardRefused) as e:
        s.release_claim(old)
    assert (e.value.event, e.value.guard) == ("release", "claim_owner")
    return s, old, new


def test_a_refused_stale_release_is_numbered_after_the_reserve_and_replace_it_followed(any_store):
    s, _, _ = _stale_release_after_replace(any_store)
    [ref] = s.refusals(f"claim:{TARGET}")
    moves = {h.event: h.seq for h in s.claim_history(TARGET) if h.machine == "claim"}
    assert moves["reserve"] < moves["replace"] < ref.seq  # one sequence: the refusal came after both
    log = s.claim_log(TARGET)
    assert [(type(e).__name__, e.event) for e in log] == [
        ("ClaimEntry", "approve"),
        ("ClaimEntry", "approve"),
        ("ClaimEntry", "reserve"),
        ("ClaimEntry", "replace"),
        ("Refusal", "release"),
    ]
    assert [e.seq for e in log] == sorted({e.seq for e in log})  # unique numbers, in order


def test_a_claim_refusal_names_the_move_that_made_the_next_epoch_not_the_latest_move(any_store):
    s, old, new = _stale_release_after_replace(any_store)
    s.release_claim(new)  # the claim moves on after the replace: the newest move is now this release
    with pytest.raises(IllegalMove) as e:  # the claim is free now: refused by its state, and recorded
        s.release_claim(old)
    assert e.value.guard == "source_state"
    first, second = s.refusals(f"claim:{TARGET}")
    moves = [h for h in s.claim_history(TARGET) if h.machine == "claim"]
    assert [h.event for h in moves] == ["reserve", "replace", "release"]
    assert first.superseded_by_seq == second.superseded_by_seq == moves[1].seq  # the replace, not the release
    assert second.presented["claim_epoch"] == 1 and second.current["epoch"] == 2


def test_an_intent_refusal_names_the_begin_that_superseded_the_presented_attempt(any_store):
    s = any_store.store
    it = submit(s)
    old, new = second_attempt(s, it, any_store.advance)
    s.authorize_dispatch(new, request_digest=it.request_digest)  # the newest move is now this authorization
    with pytest.raises(GuardRefused) as e:
        s.record_unknown(old, reason="late")
    assert (e.value.event, e.value.guard) == ("record_unknown", "lease_holder")
    [r] = s.refusals(it.key)
    by_event = {h.event: h.seq for h in s.history(it.key)}
    begins = [h.seq for h in s.history(it.key) if h.event == "begin"]
    assert r.superseded_by_seq == begins[1] != by_event["authorize_dispatch"]


def test_a_stale_plan_refusal_names_the_lookup_that_counted_past_it(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest)
    s.record_unknown(lease, reason="read timeout")
    stale = s.get(it.key).plan
    s.reconcile_not_found(stale)  # this lookup superseded the plan
    s.reconcile_not_found(s.get(it.key).plan)  # and this one is the newest move
    with pytest.raises(GuardRefused) as e:
        s.reconcile_not_found(stale)
    assert e.value.guard == "plan_unchanged"
    [r] = s.refusals(it.key)
    lookups = [h.seq for h in s.history(it.key) if h.event == "reconcile_not_found"]
    assert r.superseded_by_seq == lookups[0] != lookups[1]


def test_claim_show_prints_moves_and_refusals_in_one_timeline_with_the_acting_owner(capsys, sql_store):
    from atmostonce_cli.main import main

    class Clocked:
        store = sql_store

        @staticmethod
        def advance(seconds):
            from atmostonce_sql.testing import age_leases

            age_leases(sql_store, seconds)

    _stale_release_after_replace(Clocked)
    url = sql_store.engine.url.render_as_string(hide_password=False)
    assert main(["--json", "claim", "show", TARGET, "--database-url", url]) == 0
    timeline = json.loads(capsys.readouterr().out)["timeline"]
    assert [(row["kind"], row["event"], row["actor"]) for row in timeline] == [
        ("approval", "approve", "approver:alice"),
        ("approval", "approve", "approver:alice"),
        ("claim", "reserve", "worker:worker-A"),
        ("claim", "replace", "worker:worker-B"),
        ("refused", "release (claim_owner)", "worker:worker-A"),
    ]
    assert timeline[-1]["superseded_by"] == timeline[3]["seq"]
    assert main(["claim", "show", TARGET, "--database-url", url]) == 0
    text = capsys.readouterr().out
    assert text.index("worker:worker-B") < text.index("release (claim_owner)")


def test_claim_log_entries_are_moves_or_refusals(any_store):
    s, _, _ = _stale_release_after_replace(any_store)
    assert all(isinstance(e, (ClaimEntry, Refusal)) for e in s.claim_log(TARGET))
