"""Each static check of the transition tables names exactly what is wrong (docs/design.md#static-checks).

tests/test_table.py and tests/test_claims.py show that every check bites on some broken table; these
break the shipped tables (``spec/table.toml``, ``spec/claim.toml``) one way at a time and assert the
check's exact problems, so a check that rejects for the wrong reason, reports a blank, or stops early
fails here.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

from atmostonce.checks import (
    couplings_resolve,
    dispatch_needs_the_claim,
    in_flight_exits_move_the_claim,
    one_creator,
    only_retry_reenters_initial,
    outcomes_map_to_states,
    queue_exits_release_the_claim,
    references_resolve,
    refusals_that_wait_leave_the_intent_queued,
    uncertain_claim_left_only_on_evidence,
    unknown_never_resent_by_machine,
)
from atmostonce.table import MACHINES, machine, table


def with_event(t, name, **changes):
    events = dict(t.events)
    events[name] = dataclasses.replace(events[name], **changes)
    return dataclasses.replace(t, events=MappingProxyType(events))


def with_extra_event(t, like, name, **changes):
    events = dict(t.events)
    events[name] = dataclasses.replace(events[like], name=name, **changes)
    return dataclasses.replace(t, events=MappingProxyType(events))


def with_outcome(t, name, **changes):
    outcomes = dict(t.outcomes)
    outcomes[name] = dataclasses.replace(outcomes[name], **changes)
    return dataclasses.replace(t, outcomes=MappingProxyType(outcomes))


def with_state(t, name, **changes):
    states = dict(t.states)
    states[name] = dataclasses.replace(states[name], **changes)
    return dataclasses.replace(t, states=MappingProxyType(states))


def machines():
    return {m: machine(m) for m in MACHINES}


# ---------------------------------------------------------------- references_resolve
def test_an_undeclared_initial_state_is_named():
    assert references_resolve(dataclasses.replace(table(), initial="limbo")) == [
        "initial state 'limbo' is not declared"
    ]


def test_an_unknown_actor_is_named():
    assert references_resolve(with_event(table(), "retry", actor="ghost")) == ["event retry: unknown actor 'ghost'"]


def test_unknown_source_and_target_states_are_named_in_order():
    t = with_event(table(), "retry", sources=("failed", "limbo"), target="nowhere")
    assert references_resolve(t) == ["event retry: unknown state 'limbo'", "event retry: unknown state 'nowhere'"]


def test_an_uncatalogued_guard_is_named():
    t = table()
    t = with_event(t, "begin", guards=(*t.events["begin"].guards, "no_such_guard"))
    assert references_resolve(t) == ["event begin: guard 'no_such_guard' is not in the catalogue"]


def test_an_uncatalogued_effect_is_named():
    assert references_resolve(with_event(table(), "retry", effects=("no_such_effect",))) == [
        "event retry: effect 'no_such_effect' is not in the catalogue"
    ]


# ---------------------------------------------------------------- outcomes_map_to_states
def test_an_outcome_in_an_undeclared_state_is_named():
    # gate.paused moves nothing, so the undeclared state is its only problem
    assert outcomes_map_to_states(with_outcome(table(), "gate.paused", state="limbo")) == [
        "outcome gate.paused: state 'limbo' is not declared"
    ]


def test_an_outcome_recorded_by_an_undeclared_event_is_named():
    assert outcomes_map_to_states(with_outcome(table(), "send.unknown", event="no_such_event")) == [
        "outcome send.unknown: event 'no_such_event' is not declared"
    ]


def test_an_outcome_whose_event_lands_elsewhere_is_named():
    assert outcomes_map_to_states(with_outcome(table(), "send.unknown", state="failed")) == [
        "outcome send.unknown: event record_unknown lands in 'indeterminate', not 'failed'"
    ]


def test_outcomes_after_one_that_moves_nothing_are_still_checked():
    t = table()
    names = list(t.outcomes)
    # the shipped table lists operator.resend after gate.stale_worker, which moves nothing
    assert t.outcomes["gate.stale_worker"].event is None
    assert names.index("gate.stale_worker") < names.index("operator.resend")
    assert outcomes_map_to_states(with_outcome(t, "operator.resend", state="failed")) == [
        "outcome operator.resend: event resend lands in 'pending', not 'failed'"
    ]


# ---------------------------------------------------------------- one_creator
def test_a_creator_landing_outside_the_initial_state_is_named():
    assert one_creator(with_event(table(), "submit", target="authorized")) == [
        "creating event submit lands in 'authorized', not the initial state"
    ]


def test_two_creators_are_both_named():
    assert one_creator(with_extra_event(table(), "submit", "submit_again")) == [
        "expected one creating event, found ['submit', 'submit_again']"
    ]


# ---------------------------------------------------------------- only_retry_reenters_initial
def test_a_second_retryable_state_is_named_with_its_kind():
    assert only_retry_reenters_initial(with_state(table(), "indeterminate", retryable=True)) == [
        "expected exactly one retryable state, found ['failed', 'indeterminate']",
        "retryable state 'indeterminate' is not of kind 'retryable'",
    ]


def test_no_retryable_state_makes_retry_an_edge_from_a_non_retryable_state():
    assert only_retry_reenters_initial(with_state(table(), "failed", retryable=False)) == [
        "expected exactly one retryable state, found []",
        "machine event retry re-enters 'pending' from non-retryable 'failed'",
    ]


def test_a_machine_reentry_from_the_unknown_state_is_named():
    assert only_retry_reenters_initial(with_event(table(), "retry", sources=("failed", "indeterminate"))) == [
        "machine event retry re-enters 'pending' from non-retryable 'indeterminate'"
    ]


def test_two_machine_events_reentering_the_initial_state_are_named():
    assert only_retry_reenters_initial(with_extra_event(table(), "retry", "retry_again")) == [
        "more than one machine event re-enters 'pending': ['retry', 'retry_again']"
    ]


# ---------------------------------------------------------------- unknown_never_resent_by_machine
def test_a_machine_path_back_to_the_initial_state_is_reported_where_it_arrives():
    # an unfenced "not found" lands in failed, from which retry re-queues: the path stops at pending
    t = with_event(table(), "reconcile_not_found", target="failed")
    assert unknown_never_resent_by_machine(t) == [
        "machine path indeterminate -> failed -retry-> pending resends an unknown outcome"
    ]


def test_a_machine_edge_from_the_unknown_state_into_flight_is_reported():
    t = with_event(table(), "reconcile_not_found", target="authorized")
    assert unknown_never_resent_by_machine(t) == [
        "machine path indeterminate -reconcile_not_found-> authorized resends an unknown outcome"
    ]


def test_a_state_reached_twice_is_explored_once():
    t = with_event(table(), "reconcile_not_found", target="failed")
    t = with_event(t, "park_unreconcilable", target="failed")
    assert unknown_never_resent_by_machine(t) == [
        "machine path indeterminate -> failed -retry-> pending resends an unknown outcome"
    ]


def test_an_edge_with_a_proof_of_absence_guard_may_pass():
    # reconcile_absent carries evidence_fenced: its landing in failed (and retry from there) is allowed
    t = table()
    assert t.events["reconcile_absent"].target == "failed"
    assert unknown_never_resent_by_machine(t) == []
    unfenced = tuple(g for g in t.events["reconcile_absent"].guards if g != "evidence_fenced")
    assert unknown_never_resent_by_machine(with_event(t, "reconcile_absent", guards=unfenced)) == [
        "machine path indeterminate -> failed -retry-> pending resends an unknown outcome"
    ]


# ---------------------------------------------------------------- the claim machine's checks
def test_couplings_name_the_owner_and_what_is_missing():
    intent, ms = table(), machines()
    assert couplings_resolve(with_event(intent, "record_unknown", couples=MappingProxyType({"claim": "nope"})), ms) == [
        "intent event record_unknown: claim has no event 'nope'"
    ]
    assert couplings_resolve(with_event(intent, "record_unknown", couples=MappingProxyType({"ghost": "x"})), ms) == [
        "intent event record_unknown: couples unknown machine 'ghost'"
    ]
    assert couplings_resolve(with_event(intent, "record_unknown", couples_required=("claim", "approval")), ms) == [
        "intent event record_unknown: requires a approval move it does not couple"
    ]
    claim = with_event(ms["claim"], "start_sending", couples=MappingProxyType({"approval": "nope"}))
    assert couplings_resolve(intent, ms | {"claim": claim}) == [
        "claim event start_sending: approval has no event 'nope'"
    ]


def test_the_claim_checks_need_a_claim_machine():
    intent, only_approval = table(), {"approval": machine("approval")}
    for check in (
        dispatch_needs_the_claim,
        in_flight_exits_move_the_claim,
        queue_exits_release_the_claim,
        uncertain_claim_left_only_on_evidence,
    ):
        assert check(intent, only_approval) == ["no claim machine"], check.__name__


def test_an_authorization_without_a_required_claim_move_is_named():
    t = with_event(table(), "authorize_dispatch", couples_required=())
    assert dispatch_needs_the_claim(t, machines()) == [
        "intent event authorize_dispatch authorizes a send without requiring a claim move into sending"
    ]


def test_an_in_flight_exit_that_leaves_the_claim_sending_is_named():
    ms = machines()
    for couples in ({}, {"claim": "release"}):  # no claim move; a claim move that does not leave sending
        t = with_event(table(), "record_unknown", couples=MappingProxyType(couples))
        assert in_flight_exits_move_the_claim(t, ms) == [
            "intent event record_unknown leaves the in-flight state but leaves the claim sending"
        ], couples


def test_a_queue_exit_that_leaves_the_reservation_held_is_named():
    ms = machines()
    assert queue_exits_release_the_claim(table(), ms) == []
    # no claim move; a claim move from sending only; one that stays reserved (replace)
    for couples in ({}, {"claim": "settle"}, {"claim": "replace"}):
        for name in ("park", "exhaust", "block_at_gate"):
            t = with_event(table(), name, couples=MappingProxyType(couples))
            assert queue_exits_release_the_claim(t, ms) == [
                f"intent event {name} takes the intent out of the queue but leaves its reservation held"
            ], (name, couples)
    # begin stays in the queue and authorize_dispatch enters flight: neither needs to release
    t = with_event(table(), "begin", couples=MappingProxyType({}))
    assert queue_exits_release_the_claim(with_event(t, "authorize_dispatch", couples=MappingProxyType({})), ms) == []


def test_an_uncertain_claim_freed_without_a_settling_intent_move_is_named():
    intent = table()
    for name in ("reconcile_found", "reconcile_absent"):  # the intent moves that carry settle_by_evidence
        intent = with_event(intent, name, couples=MappingProxyType({}))
    assert uncertain_claim_left_only_on_evidence(intent, machines()) == [
        "claim event settle_by_evidence frees a claim that may have sent, and no settling intent move carries it"
    ]


def test_a_sending_claim_moved_back_to_reserved_on_an_unsettled_intent_move_is_named():
    ms = machines()
    claim = with_event(ms["claim"], "mark_uncertain", target="reserved")
    assert uncertain_claim_left_only_on_evidence(table(), ms | {"claim": claim}) == [
        "claim event mark_uncertain frees a claim that may have sent on read_back_failed, which lands in 'indeterminate'",
        "claim event mark_uncertain frees a claim that may have sent on record_unknown, which lands in 'indeterminate'",
    ]


# ------------------------------------------------------------------------------ refusals that wait
def with_guard(t, name, **changes):
    guards = dict(t.guards)
    guards[name] = dataclasses.replace(guards[name], **changes)
    return dataclasses.replace(t, guards=MappingProxyType(guards))


def test_the_shipped_table_has_one_waiting_refusal():
    t = table()
    assert dict(t.waiting_guards) == {"rate_limit_clear": "gate.rate_limited"}
    assert refusals_that_wait_leave_the_intent_queued(t) == []
    assert "rate_limit_clear" not in t.policy_guards


def test_a_waiting_refusal_must_name_a_declared_outcome():
    t = with_guard(table(), "rate_limit_clear", refusal_outcome="gate.no_such")
    assert refusals_that_wait_leave_the_intent_queued(t) == [
        "guard rate_limit_clear: refusal outcome 'gate.no_such' is not declared"
    ]


def test_a_waiting_refusal_must_leave_the_intent_queued_and_move_nothing():
    parks = with_guard(table(), "rate_limit_clear", refusal_outcome="gate.blocked")  # moves: block_at_gate
    message = "guard rate_limit_clear: refusal outcome gate.blocked does not leave the intent queued in 'pending'"
    assert refusals_that_wait_leave_the_intent_queued(parks) == [message]
    t = table()
    outcomes = dict(t.outcomes)
    # an outcome that moves nothing but names another state than the initial one is no wait either
    outcomes["gate.rate_limited"] = dataclasses.replace(outcomes["gate.rate_limited"], state="failed")
    elsewhere = dataclasses.replace(t, outcomes=MappingProxyType(outcomes))
    assert refusals_that_wait_leave_the_intent_queued(elsewhere) == [
        "guard rate_limit_clear: refusal outcome gate.rate_limited does not leave the intent queued in 'pending'"
    ]
    outcomes["gate.rate_limited"] = dataclasses.replace(t.outcomes["gate.rate_limited"], event="retry")
    moving = dataclasses.replace(t, outcomes=MappingProxyType(outcomes))
    assert refusals_that_wait_leave_the_intent_queued(moving) == [
        "guard rate_limit_clear: refusal outcome gate.rate_limited does not leave the intent queued in 'pending'"
    ]


def test_a_policy_gate_cannot_also_wait():
    t = with_guard(table(), "kill_switch_off", refusal_outcome="gate.rate_limited")
    assert t.waiting_guards["kill_switch_off"] == "gate.rate_limited"
    assert refusals_that_wait_leave_the_intent_queued(t) == [
        "guard kill_switch_off: a policy gate's refusal parks the intent; it cannot also be a wait"
    ]
