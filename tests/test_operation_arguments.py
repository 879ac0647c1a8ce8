"""The arguments of the shared store operations, and what each operation records.

``Operations`` is the code every store runs before its own ``_apply``: a refused argument is an
``IntakeError`` whose ``field`` (and ``code``, ``limit`` where one applies) names what was wrong and nothing
is written; a retraction is checked condition by condition; ``declare_restore`` fences every intent that may
have been sent and leaves one its guard refuses; the operator, worker and reconciler moves record their
reason, remote id and result. Validation tests run on every store; the ``declare_restore`` tests use a
model subclass whose fence of chosen keys a guard refuses.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from atmostonce import GuardRefused, IntakeCode, IntakeError, MemoryStore
from atmostonce.identity import delivery_key
from atmostonce.records import MAX_LEASE_SECONDS
from atmostonce.store import retraction_of
from atmostonce.testing.stateful import FakeClock
from tests.helpers import begin_authorize, submit, to_state

C = IntakeCode


def refusal(fn, *args, **kw):
    """``(field, code, limit)`` of the ``IntakeError`` that ``fn(*args, **kw)`` raises."""
    with pytest.raises(IntakeError) as info:
        fn(*args, **kw)
    e = info.value
    return (e.field, e.code, e.limit)


def empty(field):
    return (field, C.EMPTY, None)


def publish(s, it, remote_id="r-1"):
    lease = begin_authorize(s, it.key)
    s.record_success(lease, remote_id=remote_id)
    s.confirm_read_back(lease)
    return s.get(it.key)


# ---------------------------------------------------------------- retraction_of
def test_retraction_of_needs_a_mapping_with_retracts_and_a_known_mode():
    assert retraction_of({"text": "hi"}) is None
    assert retraction_of({"mode": "delete"}) is None
    assert retraction_of({"retracts": "k", "mode": "move"}) is None
    assert retraction_of("retracts") is None
    assert retraction_of({"retracts": "k", "remote_id": "r", "mode": "delete"}) == {
        "retracts": "k",
        "remote_id": "r",
        "mode": "delete",
    }


# ---------------------------------------------------------------- a retraction submitted by hand
NEEDS_SUBMIT_RETRACTION = ("request", None, None)  # the request is not one submit_retraction makes
NAME_A_PUBLISHED = ("retracts", None, None)  # it does not name a published intent of this account and target
NO_CORRECTION = ("correction", C.NOT_OBJECT, None)


def by_hand(s, mode, request, target="room-1", account="acct"):
    return s.submit(account, "retract." + mode, target, request)


def test_a_retraction_whose_mode_is_not_its_kind_is_refused(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    req = {"retracts": orig.key, "remote_id": "r-1", "mode": "correct", "correction": {"text": "x"}}
    assert refusal(by_hand, s, "delete", req) == NEEDS_SUBMIT_RETRACTION
    assert refusal(by_hand, s, "delete", {"text": "x"}) == NEEDS_SUBMIT_RETRACTION


def test_a_retraction_is_checked_condition_by_condition(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    ok = {"retracts": orig.key, "remote_id": "r-1", "mode": "delete"}
    assert refusal(by_hand, s, "delete", ok | {"remote_id": "r-2"}) == NAME_A_PUBLISHED  # another object
    assert refusal(by_hand, s, "delete", ok, target="room-2") == NAME_A_PUBLISHED  # another target
    assert refusal(by_hand, s, "delete", ok, account="other") == NAME_A_PUBLISHED  # another account
    # sent, with a remote id, but not confirmed: not published
    sent = submit(s, text="sent")
    lease = begin_authorize(s, sent.key)
    s.record_success(lease, remote_id="r-3")
    s.read_back_failed(lease, reason="read_back.not_found")
    assert s.get(sent.key).remote_id == "r-3"
    assert (
        refusal(by_hand, s, "delete", {"retracts": sent.key, "remote_id": "r-3", "mode": "delete"}) == NAME_A_PUBLISHED
    )
    # a published retraction is not itself retracted
    r = publish(s, s.submit_retraction(orig.key), remote_id="r-1")
    assert refusal(by_hand, s, "delete", {"retracts": r.key, "remote_id": "r-1", "mode": "delete"}) == NAME_A_PUBLISHED
    assert by_hand(s, "delete", ok).key == r.key  # the well-formed one is the same intent


def test_a_correction_by_hand_needs_its_correction_object(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    req = {"retracts": orig.key, "remote_id": "r-1", "mode": "correct"}
    assert refusal(by_hand, s, "correct", req) == NO_CORRECTION
    assert refusal(by_hand, s, "correct", req | {"correction": "text"}) == NO_CORRECTION
    assert by_hand(s, "correct", req | {"correction": {"text": "fixed"}}).action_kind == "retract.correct"


# ---------------------------------------------------------------- submit_retraction
def test_submit_retraction_checks_the_key_as_a_key(any_store):
    s = any_store.store
    assert refusal(s.submit_retraction, "k" * 257) == ("key", C.TOO_LONG, 256)
    assert refusal(s.submit_retraction, "") == empty("key")


def test_only_a_published_intent_is_retracted(any_store):
    s = any_store.store
    it = submit(s)
    lease = begin_authorize(s, it.key)
    s.record_success(lease, remote_id="r-1")
    s.read_back_failed(lease, reason="read_back.not_found")  # a remote id, not published
    assert s.get(it.key).state == "indeterminate"
    assert refusal(s.submit_retraction, it.key) == ("key", None, None)
    assert [x.key for x in s.list_intents()] == [it.key]  # nothing queued


def test_a_retraction_is_not_itself_retracted(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    r = publish(s, s.submit_retraction(orig.key))
    assert refusal(s.submit_retraction, r.key) == ("key", None, None)
    assert sorted(x.key for x in s.list_intents()) == sorted([orig.key, r.key])  # nothing queued


def test_a_correction_must_be_a_json_object(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    assert refusal(s.submit_retraction, orig.key, correction=["x"]) == NO_CORRECTION


def test_a_correction_of_a_deleted_object_is_refused(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    deletion = publish(s, s.submit_retraction(orig.key))
    assert deletion.key == delivery_key("acct", "retract.delete", "room-1", retraction_of(deletion))
    assert refusal(s.submit_retraction, orig.key, correction={"text": "fixed"}) == ("correction", None, None)
    assert sorted(x.key for x in s.list_intents()) == sorted([orig.key, deletion.key])  # nothing queued


def test_a_retraction_carries_its_max_attempts(any_store):
    s = any_store.store
    orig, _ = to_state(s, "published")
    assert s.submit_retraction(orig.key, max_attempts=7).max_attempts == 7


# ---------------------------------------------------------------- policy writes name their argument
def test_block_at_gate_needs_a_reason(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key)
    assert refusal(s.block_at_gate, lease, reason="") == empty("reason")


def test_set_kill_switch_checks_operator_and_scope(any_store):
    s = any_store.store
    assert refusal(s.set_kill_switch, "global", True, operator="") == empty("operator")
    assert refusal(s.set_kill_switch, "account:", True, operator="alice") == ("scope", None, None)
    assert refusal(s.set_kill_switch, "account:a\x00", True, operator="alice") == ("scope", C.NUL_BYTE, None)
    s.set_kill_switch("account:a", True, operator="alice")  # the shortest account scope
    assert s.kill_switch_engaged("a") is True
    assert s.kill_switch_engaged("b") is False


def test_set_credential_and_contract_version_name_their_arguments(any_store):
    s = any_store.store
    assert refusal(s.set_credential_version, "", "v1") == empty("account")
    assert refusal(s.set_credential_version, "acct", "") == empty("version")
    assert refusal(s.set_contract_version, "", "v1") == empty("platform")
    assert refusal(s.set_contract_version, "matrix", "") == empty("version")


# ---------------------------------------------------------------- declare_restore
def test_declare_restore_checks_its_operator(any_store):
    s = any_store.store
    assert refusal(s.declare_restore, operator="") == empty("operator")
    assert refusal(s.declare_restore, operator="o" * 257) == ("operator", C.TOO_LONG, 256)
    epoch, fenced = s.declare_restore(operator="o" * 256)
    assert fenced == 0


def test_declare_restore_records_the_epoch_as_the_reason(any_store):
    s = any_store.store
    it = submit(s)
    epoch, fenced = s.declare_restore(operator="alice")
    assert fenced == 1
    last = s.history(it.key)[-1]
    assert (last.event, last.to_state) == ("restore_fence", "indeterminate")
    assert last.detail["reason"] == f"restore epoch {epoch}"


class Listing(MemoryStore):
    """The model; ``refuse`` names keys whose fence a guard refuses. A ``declare_restore`` that kept listing
    (a fence refused, so a batch that never empties) fails the test instead of hanging it."""

    def __init__(self, refuse=(), **kw):
        self.listed, self.refuse = 0, set(refuse)
        super().__init__(**kw)

    def list_intents(self, state=None, limit=1000, *, after=None):
        self.listed += 1
        if self.listed > 50:
            raise AssertionError("declare_restore keeps listing")
        return super().list_intents(state=state, limit=limit, after=after)

    def _move(self, event, key, args):
        if event == "restore_fence" and key in self.refuse:
            raise GuardRefused(event, key, "restore_epoch_current", "pending")
        return super()._move(event, key, args)


def test_declare_restore_fences_every_intent_of_every_source_state_once():
    s = Listing(clock=FakeClock())
    published = to_state(s, "published", text="p")[0]
    moved = [submit(s, text="a"), to_state(s, "authorized", text="b")[0], to_state(s, "failed", text="c")[0]]
    epoch, fenced = s.declare_restore(operator="alice")
    assert (epoch, fenced) == (2, 3)
    assert [s.get(it.key).state for it in moved] == ["indeterminate"] * 3
    assert s.get(published.key).state == "published"
    assert [h.event for h in s.history(moved[0].key)].count("restore_fence") == 1


def test_a_fence_a_guard_refuses_leaves_that_intent_and_moves_the_rest():
    s = Listing(clock=FakeClock())
    a, b = submit(s, text="a"), submit(s, text="b")
    s.refuse = {a.key}
    epoch, fenced = s.declare_restore(operator="alice")
    assert (epoch, fenced) == (2, 1)
    assert (s.get(a.key).state, s.get(b.key).state) == ("pending", "indeterminate")


# ---------------------------------------------------------------- plans and sweeper snapshots
def unknown_intent(s):
    return to_state(s, "indeterminate")[0]


def test_a_plan_that_is_no_plan_is_named_by_its_type():
    s = MemoryStore(clock=FakeClock())
    look_alike = SimpleNamespace(key=unknown_intent(s).key)  # a key, but not a Plan
    assert refusal(s.reconcile_not_found, look_alike) == ("plan", C.WRONG_TYPE, None)


@pytest.mark.parametrize(
    ("field", "value", "refused"),
    [
        ("generation", True, ("plan generation", C.NOT_INTEGER, None)),
        ("reconcile_count", "1", ("plan reconcile count", C.NOT_INTEGER, None)),
        ("epoch", 2**63, ("plan epoch", C.OUT_OF_RANGE, 2**63 - 1)),
    ],
)
def test_a_plan_field_out_of_range_is_named(field, value, refused):
    s = MemoryStore(clock=FakeClock())
    plan = dataclasses.replace(unknown_intent(s).plan, **{field: value})
    assert refusal(s.reconcile_not_found, plan) == refused


def test_a_plan_without_generation_or_epoch_is_checked_by_the_guard_not_refused_at_intake():
    s = MemoryStore(clock=FakeClock())
    plan = dataclasses.replace(unknown_intent(s).plan, generation=None, epoch=None)
    with pytest.raises(GuardRefused) as info:
        s.reconcile_not_found(plan)
    assert info.value.guard == "plan_unchanged"


def test_a_sweeper_snapshot_that_is_no_intent_is_named_by_its_type():
    s = MemoryStore(clock=FakeClock())
    look_alike = SimpleNamespace(key=to_state(s, "authorized")[0].key)
    assert refusal(s.expire_lease, look_alike) == ("intent", C.WRONG_TYPE, None)


@pytest.mark.parametrize(
    ("field", "value", "refused"),
    [
        ("generation", "2", ("generation", C.NOT_INTEGER, None)),
        ("attempt_token", "a\x00b", ("attempt token", C.NUL_BYTE, None)),
    ],
)
def test_a_sweeper_snapshot_field_out_of_range_is_named(field, value, refused):
    s = MemoryStore(clock=FakeClock())
    snap = dataclasses.replace(to_state(s, "authorized")[0], **{field: value})
    assert refusal(s.expire_lease, snap) == refused


def test_a_snapshot_with_no_attempt_token_or_generation_reaches_the_guard():
    s = MemoryStore(clock=FakeClock())
    snap = dataclasses.replace(to_state(s, "authorized")[0], attempt_token=None, generation=None)
    with pytest.raises(GuardRefused):
        s.expire_lease(snap)


# ---------------------------------------------------------------- what the operator and reconciler moves record
def last_detail(s, key):
    return s.history(key)[-1].detail


@pytest.mark.parametrize(
    ("move", "state", "default"),
    [("park", "indeterminate", "operator stop"), ("resolve_not_sent", "parked", "operator: not sent")],
)
def test_an_operator_move_records_its_reason_and_its_default(any_store, move, state, default):
    s = any_store.store
    a, _ = to_state(s, state, text="a")
    b, _ = to_state(s, state, text="b")
    assert refusal(getattr(s, move), a.key, operator="al", reason="") == empty("reason")
    getattr(s, move)(a.key, operator="al")
    getattr(s, move)(b.key, operator="al", reason="checked the room")
    assert last_detail(s, a.key)["reason"] == default
    assert last_detail(s, b.key)["reason"] == "checked the room"


def test_park_unreconcilable_records_its_reason_and_an_unknown_result(any_store):
    s = any_store.store
    it, _ = to_state(s, "indeterminate")
    assert refusal(s.park_unreconcilable, it.plan, reason="") == empty("reason")
    s.park_unreconcilable(it.plan, reason="no lookup")
    detail = last_detail(s, it.key)
    assert (detail["reason"], detail["result"]) == ("no lookup", "unknown")
    assert s.get(it.key).state == "parked"


def test_reconcile_found_records_the_remote_id_and_a_confirmed_result(any_store):
    s = any_store.store
    it, _ = to_state(s, "indeterminate")
    assert refusal(s.reconcile_found, it.plan, remote_id="") == empty("remote_id")
    s.reconcile_found(it.plan, remote_id="rid-4")
    detail = last_detail(s, it.key)
    assert (detail["remote_id"], detail["result"]) == ("rid-4", "confirmed")
    assert [(r.result, r.remote_id) for r in s.reconciliations(it.key)][-1] == ("confirmed", "rid-4")


# ---------------------------------------------------------------- set_rate_limit and capture_source
def test_set_rate_limit_names_each_bad_argument(any_store):
    s = any_store.store
    assert refusal(s.set_rate_limit, "", 1) == empty("account")
    assert refusal(s.set_rate_limit, "acct", 0) == ("max_sends", C.OUT_OF_RANGE, 1)
    assert refusal(s.set_rate_limit, "acct", True) == ("max_sends", C.NOT_INTEGER, None)
    assert refusal(s.set_rate_limit, "acct", 1, window_seconds=0) == (
        "window_seconds",
        C.OUT_OF_RANGE,
        MAX_LEASE_SECONDS,
    )


def test_the_default_rate_window_is_sixty_seconds(any_store):
    s = any_store.store
    s.set_rate_limit("acct", 1)
    begin_authorize(s, submit(s, text="one").key)
    assert s.rate_limited("acct") is True
    any_store.advance(59.5)
    assert s.rate_limited("acct") is True
    any_store.advance(1)
    assert s.rate_limited("acct") is False


def test_capture_source_names_each_bad_argument_and_takes_a_2048_character_id(any_store):
    s = any_store.store
    assert refusal(s.capture_source, "", "x") == empty("source id")
    assert refusal(s.capture_source, "s" * 2049, "x") == ("source id", C.TOO_LONG, 2048)
    assert s.capture_source("s" * 2048, "x").source_id == "s" * 2048
    assert refusal(s.capture_source, "src", b"x") == ("body", C.NOT_STRING, None)
    assert refusal(s.capture_source, "src", "a\x00b") == ("body", C.NUL_BYTE, None)
    assert refusal(s.capture_source, "src", "a\udc80") == ("body", C.LONE_SURROGATE, None)


# ---------------------------------------------------------------- the worker's and reconciler's records, named
def test_each_worker_record_names_an_empty_reason_or_remote_id(any_store):
    s = any_store.store
    _, lease = to_state(s, "authorized")
    assert refusal(s.record_unknown, lease, reason="") == empty("reason")
    assert refusal(s.record_not_sent, lease, reason="") == empty("reason")
    assert refusal(s.read_back_failed, lease, reason="") == empty("reason")
    assert refusal(s.record_success, lease, remote_id="") == empty("remote_id")


def test_record_unknown_records_its_reason(any_store):
    s = any_store.store
    it, lease = to_state(s, "authorized")
    s.record_unknown(lease, reason="read timeout 7")
    assert last_detail(s, it.key)["reason"] == "read timeout 7"


def test_record_success_records_the_remote_id_and_the_response_digest(any_store):
    s = any_store.store
    it, lease = to_state(s, "authorized")
    s.record_success(lease, remote_id="r-9", response_digest="d" * 64)
    detail = last_detail(s, it.key)
    assert (detail["remote_id"], detail["response_digest"]) == ("r-9", "d" * 64)


def test_resolve_published_names_an_empty_remote_id(any_store):
    s = any_store.store
    it, _ = to_state(s, "parked")
    assert refusal(s.resolve_published, it.key, operator="al", remote_id="") == empty("remote_id")


@pytest.mark.parametrize(("move", "result"), [("reconcile_not_found", "unknown"), ("reconcile_absent", "failed")])
def test_a_reconciler_lookup_records_its_result(any_store, move, result):
    s = any_store.store
    it, _ = to_state(s, "indeterminate")
    kw = {"fenced": True} if move == "reconcile_absent" else {}
    getattr(s, move)(it.plan, **kw)
    assert last_detail(s, it.key)["result"] == result


def test_an_operator_is_a_string_of_at_most_256_characters(any_store):
    s = any_store.store
    a, _ = to_state(s, "indeterminate", text="a")
    assert refusal(s.park, a.key, operator=1) == ("operator", C.NOT_STRING, None)
    assert refusal(s.park, a.key, operator="o" * 257) == ("operator", C.TOO_LONG, 256)
    s.park(a.key, operator="o" * 256)
    assert s.get(a.key).state == "parked"


def test_a_credential_version_may_be_none_but_not_empty(any_store):
    s = any_store.store
    assert refusal(s.set_credential_version, "acct", "") == empty("version")
    s.set_credential_version("acct", None)


def test_max_sends_is_at_most_a_billion(any_store):
    s = any_store.store
    s.set_rate_limit("acct", 10**9)
    assert refusal(s.set_rate_limit, "acct", 10**9 + 1) == ("max_sends", C.OUT_OF_RANGE, 10**9)
    assert s.rate_limited("acct") is False


def test_authorize_dispatch_extends_the_lease_to_sixty_seconds_by_default():
    clock = FakeClock()
    s = MemoryStore(clock=clock)
    it = submit(s)
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert s.get(it.key).lease_expires_at == s.now() + 60
