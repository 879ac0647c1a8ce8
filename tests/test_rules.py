"""The protocol rules, on every store: the model, SQLite and PostgreSQL (docs/design.md#one-table-read-by-everything, docs/design.md#the-gate-is-the-conditional-write)."""

from __future__ import annotations

import math
from datetime import datetime

import pytest

from atmostonce import GuardRefused, IllegalMove, IntakeError, Rejected, UnknownIntent
from tests.helpers import begin_authorize, submit, to_state

STATES = ["pending", "authorized", "published", "failed", "indeterminate", "parked"]


def snapshot(store, key):
    return store.get(key), len(store.history(key)), store.attempts(key), store.reconciliations(key)


def test_begin_is_the_only_creator_and_opens_at_most_one_attempt(any_store):
    s = any_store.store
    it = submit(s)
    assert s.attempts(it.key) == []
    lease = s.begin(it.key, lease_seconds=30)
    assert [a.attempt_token for a in s.attempts(it.key)] == [lease.attempt_token]
    before = snapshot(s, it.key)
    with pytest.raises(GuardRefused) as e:
        s.begin(it.key, lease_seconds=30)
    assert e.value.guard == "no_open_attempt"
    assert snapshot(s, it.key) == before, "a refused move changed something"


def test_retry_from_failed_creates_zero_rows_then_begin_creates_exactly_one(any_store):
    s = any_store.store
    it, lease = to_state(s, "failed")
    attempts_before = s.attempts(it.key)
    again = s.retry(it.key)
    assert again.state == "pending"
    assert s.attempts(it.key) == attempts_before, "retry created an attempt"
    lease2 = s.begin(it.key, lease_seconds=30)
    after = s.attempts(it.key)
    assert len(after) == len(attempts_before) + 1
    assert after[-1].key == it.key == lease2.key
    assert lease2.attempt_token != lease.attempt_token
    assert lease2.generation > lease.generation


@pytest.mark.parametrize("state", [s for s in STATES if s != "failed"])
def test_retry_from_any_other_state_is_refused_and_changes_nothing(any_store, state):
    s = any_store.store
    it, _ = to_state(s, state)
    before = snapshot(s, it.key)
    with pytest.raises(IllegalMove) as e:
        s.retry(it.key)
    assert e.value.guard == "source_state" and e.value.state == state
    assert snapshot(s, it.key) == before


def test_attempt_cap_parks_instead_of_looping(any_store):
    s = any_store.store
    it = submit(s, max_attempts=2)
    for _ in range(2):
        lease = begin_authorize(s, it.key)
        s.record_not_sent(lease, reason="503 before write")
        if s.get(it.key).attempt_count < 2:
            s.retry(it.key)
    with pytest.raises(GuardRefused) as e:
        s.retry(it.key)
    assert e.value.guard == "attempts_remaining"
    assert s.exhaust(it.key).state == "parked"
    assert len(s.attempts(it.key)) == 2


def test_exhaust_is_refused_while_attempts_remain(any_store):
    s = any_store.store
    it, _ = to_state(s, "failed", max_attempts=3)
    with pytest.raises(GuardRefused) as e:
        s.exhaust(it.key)
    assert e.value.guard == "attempts_exhausted"


def test_attempts_are_immutable_facts_with_appended_outcomes(any_store):
    s = any_store.store
    it, lease = to_state(s, "failed")
    s.retry(it.key)
    lease2 = begin_authorize(s, it.key)
    s.record_unknown(lease2, reason="read timeout")
    atts = s.attempts(it.key)
    assert [a.outcomes for a in atts] == [("record_not_sent",), ("record_unknown",)]
    assert [a.number for a in atts] == [1, 2]
    assert atts[0].attempt_token == lease.attempt_token


def test_unknown_is_never_retryable(any_store):
    s = any_store.store
    it, _ = to_state(s, "indeterminate")
    with pytest.raises(IllegalMove):
        s.retry(it.key)
    with pytest.raises(IllegalMove):
        s.begin(it.key)


def test_pre_authorization_stale_worker_is_rejected_and_row_freed(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key, lease_seconds=10)
    any_store.advance(11)
    [due] = s.due_leases()
    assert due.key == it.key
    s.abandon_attempt(due)
    assert s.get(it.key).state == "pending"
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert e.value.guard == "lease_holder"
    assert s.attempts(it.key)[0].outcomes == ("abandon_attempt",)
    s.begin(it.key)  # the row is free again


def test_expired_lease_refuses_authorization_before_the_sweeper_runs(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key, lease_seconds=10)
    any_store.advance(10)
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert e.value.guard == "lease_live"


def test_post_authorization_worker_is_never_recovered(any_store):
    s = any_store.store
    it = submit(s)
    lease = begin_authorize(s, it.key)
    any_store.advance(31)
    [due] = s.due_leases()
    assert s.expire_lease(due).state == "indeterminate"
    # the slow worker wakes up: its late success is refused and recorded nowhere as success
    with pytest.raises(IllegalMove):
        s.record_success(lease, remote_id="late")
    for op in (s.retry, s.begin):
        with pytest.raises(IllegalMove):
            op(it.key)


def test_sweeper_moves_only_the_row_it_planned_on(any_store):
    s = any_store.store
    it = submit(s)
    s.begin(it.key, lease_seconds=10)
    any_store.advance(11)
    [due] = s.due_leases()
    s.abandon_attempt(due)
    s.begin(it.key, lease_seconds=10)
    any_store.advance(11)
    with pytest.raises(GuardRefused) as e:  # the old plan names the old attempt
        s.abandon_attempt(due)
    assert e.value.guard == "lease_holder"


def test_wrong_bytes_are_not_authorized(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key)
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest="0" * 64)
    assert e.value.guard == "request_digest_matches"


def test_reconciliation_moves_only_on_evidence(any_store):
    s = any_store.store
    it, _ = to_state(s, "indeterminate", max_reconciles=2)
    plan = s.get(it.key).plan
    assert s.reconcile_not_found(plan).state == "indeterminate"
    with pytest.raises(GuardRefused) as e:  # a second reconciler with the same plan
        s.reconcile_not_found(plan)
    assert e.value.guard == "plan_unchanged"
    with pytest.raises(GuardRefused) as e:
        s.reconcile_absent(s.get(it.key).plan, fenced=False)
    assert e.value.guard == "evidence_fenced"
    s.reconcile_not_found(s.get(it.key).plan)
    with pytest.raises(GuardRefused) as e:
        s.reconcile_not_found(s.get(it.key).plan)
    assert e.value.guard == "reconcile_budget_left"
    assert s.park_unreconcilable(s.get(it.key).plan, reason="reconcile.budget_spent").state == "parked"
    assert [(r.event, r.result) for r in s.reconciliations(it.key)] == [
        ("record_unknown", "unknown"),  # the send's record opens when its outcome becomes unknown
        ("reconcile_not_found", "unknown"),  # then one row per lookup
        ("reconcile_not_found", "unknown"),
    ]
    assert s.get(it.key).reconcile_count == 2


def test_fenced_absence_makes_failed_and_found_makes_published(any_store):
    s = any_store.store
    a, _ = to_state(s, "indeterminate", text="a")
    b, _ = to_state(s, "indeterminate", text="b")
    assert s.reconcile_absent(s.get(a.key).plan, fenced=True).state == "failed"
    done = s.reconcile_found(s.get(b.key).plan, remote_id="r-b")
    assert done.state == "published" and done.remote_id == "r-b"


def test_a_fenced_absence_bumps_the_fence_epoch_so_the_retry_goes_out_under_a_fresh_platform_key(any_store):
    """The fenced lookup tombstoned the first attempt's key; the retry's attempt records the next fence
    epoch, and the delivery key never changes (docs/design.md, "A fence is a tombstone")."""
    s = any_store.store
    it, _ = to_state(s, "indeterminate", max_attempts=2)
    assert (s.get(it.key).fence_epoch, s.attempts(it.key)[0].idempotency_key) == (0, it.key)
    failed = s.reconcile_absent(s.get(it.key).plan, fenced=True)
    assert (failed.state, failed.key, failed.fence_epoch, failed.resend_epoch) == ("failed", it.key, 1, 0)
    s.retry(it.key)
    begin_authorize(s, it.key)
    first, second = s.attempts(it.key)
    assert (first.resend_epoch, first.fence_epoch, first.idempotency_key) == (0, 0, it.key)
    assert (second.resend_epoch, second.fence_epoch, second.idempotency_key) == (0, 1, f"{it.key}.f1")
    assert s.get(it.key).key == it.key


def test_a_refused_fenced_absence_leaves_the_fence_epoch_alone(any_store):
    s = any_store.store
    it, _ = to_state(s, "indeterminate")
    with pytest.raises(GuardRefused) as e:
        s.reconcile_absent(s.get(it.key).plan, fenced=False)
    assert (e.value.event, e.value.guard) == ("reconcile_absent", "evidence_fenced")
    assert s.get(it.key).fence_epoch == 0


def test_an_attempt_records_both_epochs_of_its_platform_key(any_store):
    """A resend and a fenced absence each add their own epoch to the key the next attempt is sent under."""
    s = any_store.store
    it, _ = to_state(s, "indeterminate", text=None, max_attempts=3)  # no text: no duplicate-text window
    s.reconcile_absent(s.get(it.key).plan, fenced=True)
    s.retry(it.key)
    lease = begin_authorize(s, it.key)
    s.record_unknown(lease, reason="read timeout")
    s.park(it.key, operator="alice")
    s.resend(it.key, operator="alice")
    begin_authorize(s, it.key)
    assert [a.idempotency_key for a in s.attempts(it.key)] == [it.key, f"{it.key}.f1", f"{it.key}.r1.f1"]


@pytest.mark.parametrize("state", ["published", "parked"])
def test_terminal_states_are_not_left_by_machine_events(any_store, state):
    s = any_store.store
    it, lease = to_state(s, state)
    for op in (
        lambda: s.retry(it.key),
        lambda: s.begin(it.key),
        lambda: s.exhaust(it.key),
        lambda: s.reconcile_found(s.get(it.key).plan, remote_id="x"),
        lambda: s.record_unknown(lease, reason="x"),
    ):
        with pytest.raises(Rejected):
            op()
    assert s.get(it.key).state == state


def test_operator_moves_need_a_named_operator(any_store):
    s = any_store.store
    it, _ = to_state(s, "parked")
    with pytest.raises(GuardRefused) as e:
        s.resolve_published(it.key, operator="  ", remote_id="r")
    assert e.value.guard == "operator_identified"
    done = s.resolve_published(it.key, operator="alice", remote_id="r-9")
    assert done.state == "published"
    assert s.history(it.key)[-1].actor == "operator:alice"


def test_resend_bumps_the_resend_epoch_and_grants_one_attempt(any_store):
    s = any_store.store
    it, _ = to_state(s, "parked", max_attempts=1)
    again = s.resend(it.key, operator="alice")
    assert (again.state, again.resend_epoch, again.max_attempts) == ("pending", 1, 2)
    s.begin(it.key)


def test_an_operators_resend_of_an_unknown_send_is_not_refused_by_that_sends_own_text_slot(any_store):
    # the first send's answer was lost: its text slot stays claimed (an unknown outcome keeps it); an operator
    # looked, parked it and resends: the resend frees that slot and its authorization claims a fresh one, while
    # another intent of the same text is still refused by the new slot (docs/design.md#the-duplicate-text-window)
    s = any_store.store
    it, lease = to_state(s, "authorized", text="the same words")
    s.record_unknown(lease, reason="read timeout")
    s.park(it.key, operator="alice")
    s.resend(it.key, operator="alice")
    lease, authorized = s.begin_and_authorize(it.key, request_digest=it.request_digest)
    assert authorized.state == "authorized"
    other = submit(s, text="the same words", target="room-2")
    with pytest.raises(GuardRefused) as refused:
        s.begin_and_authorize(other.key, request_digest=other.request_digest)
    assert refused.value.guard == "text_window_clear"


def test_resend_forgets_the_remote_id_of_the_earlier_epoch(any_store):
    """A remote id names an object of the resend epoch it was sent under; after a resend a
    read-back by it would prove nothing about the new epoch (docs/formal.md, restores)."""
    s = any_store.store
    it, lease = to_state(s, "authorized", max_attempts=1)
    s.record_success(lease, remote_id="r-old")
    s.read_back_failed(lease, reason="read_back.not_found")
    s.park(it.key, operator="alice")
    assert s.get(it.key).remote_id == "r-old"
    again = s.resend(it.key, operator="alice")
    assert (again.resend_epoch, again.remote_id) == (1, None)


def test_cannot_park_while_a_send_lease_is_live(any_store):
    s = any_store.store
    it, _ = to_state(s, "authorized")
    with pytest.raises(IllegalMove):
        s.park(it.key, operator="alice")


def test_unknown_key_is_a_typed_rejection(any_store):
    with pytest.raises(UnknownIntent):
        any_store.store.retry("f" * 64)


def test_submit_is_idempotent_on_the_delivery_key(any_store):
    s = any_store.store
    a = submit(s, text="same\r\n")
    b = submit(s, text="same")
    assert a.key == b.key
    assert len(s.list_intents()) == 1
    assert [h.event for h in s.history(a.key)] == ["submit"]


def test_history_is_ordered_by_store_sequence(any_store):
    s = any_store.store
    it, _ = to_state(s, "published")
    hist = s.history(it.key)
    assert [h.event for h in hist] == ["submit", "begin", "authorize_dispatch", "record_success", "confirm_read_back"]
    assert [h.seq for h in hist] == sorted(h.seq for h in hist)


BAD_INTAKE = {
    "nul in text": dict(request={"text": "a\x00b"}),
    "lone surrogate": dict(request={"text": "a\ud800b"}),
    "oversize": dict(request={"text": "x" * (1 << 20)}),
    "nan": dict(request={"n": math.nan}),
    "infinity": dict(request={"n": math.inf}),
    "not json": dict(request={"s": {1, 2}}),
    "non-string key": dict(request={1: "x"}),
    "naive datetime": dict(request={"at": datetime(2026, 1, 1)}),
    "empty account": dict(account=""),
    "empty target": dict(target="  "),
    "nul in account": dict(account="a\x00"),
}


@pytest.mark.parametrize("case", sorted(BAD_INTAKE))
def test_bad_intake_is_a_typed_error_and_writes_nothing(any_store, case):
    s = any_store.store
    args = {"account": "acct", "action_kind": "post", "target": "t", "request": {"text": "ok"}} | BAD_INTAKE[case]
    with pytest.raises(IntakeError):
        s.submit(args["account"], args["action_kind"], args["target"], args["request"])
    assert s.list_intents() == []


@pytest.mark.parametrize("seconds", [0, -1, math.nan, math.inf, "10"])
def test_bad_lease_lengths_are_refused_before_writing(any_store, seconds):
    s = any_store.store
    it = submit(s)
    with pytest.raises(IntakeError):
        s.begin(it.key, lease_seconds=seconds)
    assert s.attempts(it.key) == [] and s.get(it.key).attempt_token is None


@pytest.mark.parametrize("authorized", [False, True])
def test_a_sweeper_cannot_close_a_live_lease(any_store, authorized):
    s = any_store.store
    it = submit(s)
    if authorized:
        begin_authorize(s, it.key)
    else:
        s.begin(it.key, lease_seconds=30)
    live = s.get(it.key)
    before = snapshot(s, it.key)
    with pytest.raises(GuardRefused) as e:
        (s.expire_lease if authorized else s.abandon_attempt)(live)
    assert e.value.guard == "lease_expired"
    assert snapshot(s, it.key)[:3] == before[:3]


@pytest.mark.parametrize("state", ["pending", "failed", "indeterminate"])
def test_an_operator_may_park_from_each_non_flight_state(any_store, state):
    s = any_store.store
    it, _ = to_state(s, state)
    if state == "pending":
        s.begin(it.key)  # a pre-authorization attempt is closed by the park
    parked = s.park(it.key, operator="alice", reason="stop")
    assert parked.state == "parked" and parked.attempt_token is None
    assert all(a.outcomes for a in s.attempts(it.key))


def test_a_pending_intent_out_of_attempts_is_parked_by_exhaust(any_store):
    s = any_store.store
    it = submit(s, max_attempts=1)
    s.begin(it.key, lease_seconds=10)
    any_store.advance(11)
    s.abandon_attempt(s.due_leases()[0])  # back to pending, the only attempt spent
    with pytest.raises(GuardRefused) as e:
        s.begin(it.key)
    assert e.value.guard == "attempts_remaining"
    assert s.exhaust(it.key).state == "parked"


@pytest.mark.parametrize("outcome", ["published", "not_sent"])
def test_an_operator_settles_a_parked_intent(any_store, outcome):
    s = any_store.store
    it, _ = to_state(s, "parked")
    if outcome == "published":
        assert s.resolve_published(it.key, operator="alice", remote_id="r-1").state == "published"
    else:
        assert s.resolve_not_sent(it.key, operator="alice").state == "failed"
        assert s.retry(it.key).state == "pending"
