"""The fields every read and every refusal of a store carries.

What a store returns is a contract the worker, the CLI and the audit read field by field: a refusal's
event, key, guard and state; the recorded refusal row; each history row's actor, attempt token and
generation; a capture's fields; snapshots the caller may change without changing the store. Tests that
hold on every store use ``any_store``; those that need the model's injected clock (exact times, a deadline
reached to the second) or its ``reset`` use the model alone.
"""

from __future__ import annotations

import pytest
from transitions import MachineError

from atmostonce import GuardRefused, IntakeCode, IntakeError, MemoryStore, UnknownIntent
from atmostonce.identity import raw_digest
from atmostonce.model import _build_machine, _Cell
from atmostonce.table import table
from atmostonce.testing.stateful import FakeClock

MISSING = "f" * 64


def submit(s, text="hello", **kw):
    return s.submit("acct", "post", "room", {"text": text}, **kw)


def authorize(s, it, lease, **kw):
    return s.authorize_dispatch(lease, request_digest=it.request_digest, **kw)


# ---------------------------------------------------------------- refusals name what refused
def second_attempt(s, it, advance):
    """Begin, let that 30 s lease run out (``advance(31)``), abandon the attempt, begin again: both leases."""
    first = s.begin(it.key, lease_seconds=30)
    advance(31)
    s.abandon_attempt(s.get(it.key))
    return first, s.begin(it.key, lease_seconds=30)


def test_get_of_an_unknown_key_is_refused_by_intent_exists(any_store):
    with pytest.raises(UnknownIntent) as info:
        any_store.store.get(MISSING)
    e = info.value
    assert (e.event, e.key, e.guard, e.state) == ("get", MISSING, "intent_exists", None)


def test_a_move_of_an_unknown_key_is_refused_by_intent_exists(any_store):
    with pytest.raises(UnknownIntent) as info:
        any_store.store.retry(MISSING)
    e = info.value
    assert (e.event, e.key, e.guard, e.state) == ("retry", MISSING, "intent_exists", None)


def test_a_guard_refusal_names_the_event_key_guard_and_state(any_store):
    s = any_store.store
    it = submit(s)
    s.begin(it.key)
    with pytest.raises(GuardRefused) as info:
        s.begin(it.key)
    e = info.value
    assert (e.event, e.key, e.guard, e.state) == ("begin", it.key, "no_open_attempt", "pending")


def test_find_and_get_refuse_a_key_that_is_no_delivery_key(any_store):
    s = any_store.store
    assert s.find("k" * 256) is None
    for read, bad, want in (
        (s.find, "k" * 257, (IntakeCode.TOO_LONG, 256)),
        (s.find, "k" * 4096, (IntakeCode.TOO_LONG, 256)),
        (s.get, "k" * 257, (IntakeCode.TOO_LONG, 256)),
        (s.get, "k" * 4096, (IntakeCode.TOO_LONG, 256)),
        (s.find, 123, (IntakeCode.NOT_STRING, None)),
        (s.find, " ", (IntakeCode.EMPTY, None)),
    ):
        with pytest.raises(IntakeError) as info:
            read(bad)
        assert (info.value.field, info.value.code, info.value.limit) == ("key", *want)


def test_disabling_one_guard_leaves_the_events_later_guards_in_force(any_store):
    """An ablation switches off exactly the named guard: the event's other guards still refuse."""
    s = any_store.store
    it = submit(s, max_attempts=1)
    s._disabled_guards = frozenset({"no_open_attempt"})
    s.begin(it.key)
    with pytest.raises(GuardRefused) as info:
        s.begin(it.key)  # no_open_attempt is off, attempts_remaining is not
    assert info.value.guard == "attempts_remaining"
    assert len(s.attempts(it.key)) == 1


def test_a_stale_lease_is_refused_and_the_refusal_row_says_what_was_presented_and_current(any_store):
    s = any_store.store
    it = submit(s)
    old, new = second_attempt(s, it, any_store.advance)
    assert (new.attempt_token, new.generation) != (old.attempt_token, old.generation)
    with pytest.raises(GuardRefused) as info:
        authorize(s, it, old)
    assert (info.value.guard, info.value.state) == ("lease_holder", "pending")
    [r] = s.refusals(it.key)
    assert (r.key, r.event, r.guard) == (it.key, "authorize_dispatch", "lease_holder")
    assert dict(r.presented) == {"attempt_token": old.attempt_token, "generation": old.generation, "epoch": old.epoch}
    assert dict(r.current) == {
        "state": "pending",
        "attempt_token": new.attempt_token,
        "generation": new.generation,
        "epoch": s.current_epoch(),
        "reconcile_count": 0,
    }
    history = s.history(it.key)
    assert r.superseded_by_seq == history[-1].seq  # the begin that superseded the presenter
    assert isinstance(r.seq, int)
    assert isinstance(r.recorded_at, float)
    # a snapshot: changing what was read changes nothing stored
    r.presented["attempt_token"] = "changed"
    r.current["state"] = "changed"
    [again] = s.refusals(it.key)
    assert again.presented["attempt_token"] == old.attempt_token and again.current["state"] == "pending"


# ---------------------------------------------------------------- history rows
def test_history_rows_carry_actor_and_the_attempt_they_belong_to(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key)
    authorize(s, it, lease, descriptor={"draft": 1})
    s.record_not_sent(lease, reason="connection refused before any byte")
    h = s.history(it.key)
    assert [(e.event, e.actor, e.from_state, e.to_state) for e in h] == [
        ("submit", "client", None, "pending"),
        ("begin", "worker", "pending", "pending"),
        ("authorize_dispatch", "worker", "pending", "authorized"),
        ("record_not_sent", "worker", "authorized", "failed"),
    ]
    assert (h[0].attempt_token, h[0].generation, dict(h[0].detail)) == (None, None, {})
    # the attempt a move opened, acted under, or closed (closing clears the row's token, not the history's)
    for e in h[1:]:
        assert (e.attempt_token, e.generation) == (lease.attempt_token, lease.generation), e.event
    assert dict(h[2].detail) == {"descriptor": {"draft": 1}}
    assert dict(h[3].detail) == {"reason": "connection refused before any byte"}
    assert s.get(it.key).attempt_token is None
    assert [e.seq for e in h] == sorted({e.seq for e in h})


def test_an_empty_detail_value_is_not_recorded(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key)
    authorize(s, it, lease)
    s.record_success(lease, remote_id="m-1", response_digest="")
    assert dict(s.history(it.key)[-1].detail) == {"remote_id": "m-1"}


def test_a_moves_operator_is_its_actor(any_store):
    s = any_store.store
    it = submit(s)
    s.park(it.key, operator="dana", reason="hold")
    h = s.history(it.key)[-1]
    assert (h.event, h.actor, dict(h.detail)) == ("park", "operator:dana", {"operator": "dana", "reason": "hold"})


# ---------------------------------------------------------------- effects
def test_every_resend_bumps_the_resend_epoch(any_store):
    s = any_store.store
    it = submit(s)
    for n in (1, 2, 3):
        s.park(it.key, operator="dana")
        assert s.resend(it.key, operator="dana").resend_epoch == n


def test_authorize_dispatch_extends_the_lease_to_the_send_lease(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key, lease_seconds=30)
    after = authorize(s, it, lease, send_lease_seconds=3600)
    assert after.lease_expires_at >= lease.expires_at + 3000


def test_a_restore_closes_an_open_attempt_under_the_restore_fence(any_store):
    s = any_store.store
    it = submit(s)
    s.begin(it.key)
    assert s.declare_restore(operator="ops") == (2, 1)
    [a] = s.attempts(it.key)
    assert a.outcomes == ("restore_fence",)
    assert s.get(it.key).state == "indeterminate"


def test_an_attempt_record_carries_its_token_number_generation_and_opening_time(any_store):
    s = any_store.store
    it = submit(s)
    first, second = second_attempt(s, it, any_store.advance)
    a, b = s.attempts(it.key)
    assert (a.attempt_token, a.key, a.number, a.generation, a.outcomes) == (
        first.attempt_token,
        it.key,
        1,
        first.generation,
        ("abandon_attempt",),
    )
    assert (b.attempt_token, b.number, b.generation, b.outcomes) == (second.attempt_token, 2, second.generation, ())
    assert isinstance(a.opened_at, float) and a.opened_at <= b.opened_at


def test_an_account_kill_switch_stops_that_account_only(any_store):
    s = any_store.store
    s.set_kill_switch("account:acct", True, operator="ops")
    assert s.kill_switch_engaged("acct") and not s.kill_switch_engaged("other")
    s.set_kill_switch("account:acct", False, operator="ops")
    assert not s.kill_switch_engaged("acct")


# ---------------------------------------------------------------- captures
def test_a_capture_reports_its_source_and_raw_hash_whether_or_not_it_is_new(any_store):
    s = any_store.store
    first = s.capture_source("feed", "body one", raw=b"raw one")
    assert (first.source_id, first.new_version, first.supersedes) == ("feed", True, None)
    assert first.raw_hash == raw_digest(b"raw one")
    same = s.capture_source("feed", "body one", raw=b"raw two")
    assert (same.source_id, same.version, same.supersedes) == ("feed", first.version, None)
    assert same.new_version is False
    assert same.raw_hash == raw_digest(b"raw two")
    plain = s.capture_source("feed", "body two")
    assert (plain.source_id, plain.new_version, plain.supersedes, plain.raw_hash) == ("feed", True, first.version, None)


# ---------------------------------------------------------------- snapshots
def test_reads_are_snapshots_down_to_nested_values(any_store):
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "hi", "meta": {"tags": ["a"]}})
    lease = s.begin(it.key)
    authorize(s, it, lease, descriptor={"parts": [{"n": 1}]})
    got = s.get(it.key)
    got.request["meta"]["tags"].append("b")
    got.descriptor["parts"][0]["n"] = 2
    entry = s.history(it.key)[-1]
    entry.detail["descriptor"]["parts"].append({"n": 3})
    again = s.get(it.key)
    assert again.request == {"text": "hi", "meta": {"tags": ["a"]}}
    assert again.descriptor == {"parts": [{"n": 1}]}
    assert dict(s.history(it.key)[-1].detail) == {"descriptor": {"parts": [{"n": 1}]}}


# ---------------------------------------------------------------- default page sizes
def test_claimable_and_due_leases_return_a_hundred_by_default(any_store):
    s = any_store.store
    keys = [submit(s, text=f"t{i}").key for i in range(101)]
    assert len(s.claimable()) == 100 and len(s.claimable(limit=101)) == 101
    for k in keys:
        s.begin(k, lease_seconds=30)
    any_store.advance(31)
    assert len(s.due_leases()) == 100 and len(s.due_leases(limit=101)) == 101


def test_list_intents_returns_a_thousand_by_default():
    s = MemoryStore(clock=FakeClock())
    for i in range(1001):
        submit(s, text=f"t{i}")
    assert len(s.list_intents()) == 1000 and len(s.list_intents(limit=2000)) == 1001


# ---------------------------------------------------------------- the model's clock, exactly
@pytest.fixture
def clocked():
    clock = FakeClock()
    return MemoryStore(clock=clock), clock


def test_a_move_stamps_updated_at_with_the_store_clock(clocked):
    s, clock = clocked
    it = submit(s)
    clock.advance(5)
    s.begin(it.key)
    got = s.get(it.key)
    assert (got.created_at, got.updated_at) == (it.created_at, clock.t)
    assert s.attempts(it.key)[0].opened_at == clock.t


def test_reconciliation_rows_are_stamped_with_the_time_of_their_move(clocked):
    s, clock = clocked
    it = submit(s)
    lease = s.begin(it.key)
    authorize(s, it, lease)
    clock.advance(3)
    s.record_unknown(lease, reason="timeout")
    opened = clock.t
    clock.advance(7)
    s.reconcile_not_found(s.get(it.key).plan)
    [first, second] = s.reconciliations(it.key)
    assert (first.result, first.recorded_at) == ("unknown", opened)
    assert (second.event, second.recorded_at, second.send_seq) == ("reconcile_not_found", clock.t, first.send_seq)
    s.park_unreconcilable(s.get(it.key).plan, reason="nothing to go on")
    clock.advance(2)
    s.resolve_published(it.key, operator="dana", remote_id="m-9")
    third = s.reconciliations(it.key)[-1]
    assert (third.event, third.result, third.remote_id, third.recorded_at) == (
        "resolve_published",
        "confirmed",
        "m-9",
        clock.t,
    )


def test_a_coupled_claim_move_is_stamped_with_the_time_of_the_dispatch(clocked):
    s, clock = clocked
    it = s.submit("acct", "post", "room-9", {"text": "gated"}, requires_approval=True)
    apv = s.approve(it.key, approver="alice", expires_in=600)
    claim = s.reserve_claim(it.key, approval_id=apv.approval_id, request_digest=it.request_digest, owner="w1")
    lease = s.begin(it.key, lease_seconds=30)
    before = len(s.claim_history("room-9"))
    clock.advance(4)
    authorize(s, it, lease, claim=claim)
    coupled = s.claim_history("room-9")[before:]
    assert coupled and all(e.recorded_at == clock.t for e in coupled)


def test_a_lease_is_due_at_its_deadline_to_the_second(clocked):
    s, clock = clocked
    it = submit(s)
    s.begin(it.key, lease_seconds=30)
    clock.advance(29)
    assert s.due_leases() == []
    clock.advance(1)
    assert [d.key for d in s.due_leases()] == [it.key]


def test_a_rate_window_that_ends_exactly_now_starts_a_new_window(clocked):
    s, clock = clocked
    s.set_rate_limit("acct", 1, window_seconds=60)

    def send(text):
        it = submit(s, text=text)
        authorize(s, it, s.begin(it.key))

    send("one")
    assert s.rate_limited("acct")
    clock.advance(60)  # the first window ends now
    assert not s.rate_limited("acct")
    send("two")  # opens the next window at this instant
    clock.advance(30)
    assert s.rate_limited("acct")
    clock.advance(30)
    assert not s.rate_limited("acct")


def test_reset_forgets_everything_and_numbers_from_one_again(clocked):
    s, clock = clocked
    it = submit(s)
    old, _ = second_attempt(s, it, clock.advance)
    with pytest.raises(GuardRefused):
        authorize(s, it, old)
    assert s.refusals(it.key)
    s.set_kill_switch("global", True, operator="ops")
    s.set_rate_limit("acct", 1)
    s.capture_source("feed", "body")
    s.declare_restore(operator="ops")
    s.reset()
    assert s.find(it.key) is None and s.list_intents() == [] and s.audit_keys() == []
    assert set(s.count_by_state().values()) == {0}
    assert s.history(it.key) == [] and s.attempts(it.key) == [] and s.reconciliations(it.key) == []
    assert s.refusals(it.key) == [] and s.total_attempts() == 0
    assert s.claimable() == [] and s.due_leases() == []
    assert s.current_epoch() == 1 and s.source_head("feed") is None
    assert not s.kill_switch_engaged("acct") and not s.rate_limited("acct")
    again = submit(s)
    lease = s.begin(again.key)
    assert [h.seq for h in s.history(again.key)] == [1, 2]
    assert (lease.generation, lease.epoch) == (1, 1)


# ---------------------------------------------------------------- the transitions machine
def test_the_machine_is_built_from_the_table_with_no_shortcuts_and_no_silent_refusals():
    t = table()
    m = _build_machine(t)
    assert m.models == []  # the machine moves only the intents' cells, never itself
    cell = _Cell("unset")
    m.add_model(cell)
    assert cell.state == t.initial
    assert not any(hasattr(cell, f"to_{state}") for state in t.states)
    with pytest.raises(MachineError):
        cell.retry()  # retry is a move from failed only: an invalid trigger raises, never returns False
    assert cell.begin() and cell.state == "pending"
