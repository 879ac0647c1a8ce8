"""The fields every claim and approval read and refusal carries.

What the approval and claim operations return is read field by field by the dispatcher, the CLI and an
auditor: a refusal's event, subject, guard and state; the recorded refusal of a stale claim lease; each
claim-history row's machine, subject, actor, states, epoch, key and detail; the input checks (an
``IntakeError``'s field, code and limit). Tests that hold on every store use ``any_store``; those that need
the model's injected clock (a deadline reached to the second, exact times) use the model alone.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from atmostonce import GuardRefused, IllegalMove, IntakeCode, IntakeError, MemoryStore, UnknownIntent
from atmostonce.records import MAX_TEXT_CHARS
from atmostonce.testing.stateful import FakeClock
from tests.test_claims import approve, authorize, gated, reserve

TARGET = "room-d"
OTHER = "room-e"
MISSING = "f" * 64


def fields(e):
    return (e.event, e.key, e.guard, e.state)


def model():
    clock = FakeClock()
    return MemoryStore(clock=clock), clock


C = IntakeCode


def refused_with(want, call, *args, **kw):
    """``call`` raises an ``IntakeError`` whose ``(field, code, limit)`` is ``want``."""
    with pytest.raises(IntakeError) as info:
        call(*args, **kw)
    e = info.value
    assert (e.field, e.code, e.limit) == want


def not_string(field):
    return (field, C.NOT_STRING, None)


def too_long(field, limit):
    return (field, C.TOO_LONG, limit)


# ---------------------------------------------------------------- input checks: fields and limits
def test_claim_reads_refuse_bad_input_by_field_and_limit(any_store):
    s = any_store.store
    for read in (s.claim, s.claim_history):
        refused_with(not_string("target"), read, 123)
        refused_with(too_long("target", 1024), read, "t" * 1025)
    assert s.claim("t" * 1024) is None
    assert s.claim_history("t" * 1024) == []
    refused_with(not_string("key"), s.approvals, 123)
    refused_with(too_long("key", 256), s.approvals, "k" * 257)
    assert s.approvals("k" * 256) == []
    refused_with(not_string("approval id"), s.approval, 123)
    for n in (129, 130, MAX_TEXT_CHARS + 1):
        refused_with(too_long("approval id", 128), s.approval, "a" * n)
    with pytest.raises(UnknownIntent) as info:
        s.approval("a" * 128)
    assert fields(info.value) == ("approval", "a" * 128, "approval_exists", None)


def test_a_claim_lease_is_checked_field_by_field(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    lease = reserve(s, it, approve(s, it))
    refused_with(("lease", C.WRONG_TYPE, None), s.release_claim, "a lease")
    bad = {
        "owner_token": (r"claim owner token", 128),
        "approval_id": (r"approval id", 128),
        "owner": (r"claim owner", 256),
        "key": (r"key", 256),
        "target": (r"target", 1024),
    }
    for field, (name, limit) in bad.items():
        for value, want in ((123, not_string(name)), ("x" * (limit + 1), too_long(name, limit))):
            refused_with(want, s.release_claim, dataclasses.replace(lease, **{field: value}))
    for epoch, want in (
        (True, ("epoch", C.NOT_INTEGER, None)),
        ("1", ("epoch", C.NOT_INTEGER, None)),
        (1.0, ("epoch", C.NOT_INTEGER, None)),
        (-1, ("epoch", C.OUT_OF_RANGE, 0)),
        (2**63, ("epoch", C.OUT_OF_RANGE, 2**63 - 1)),
    ):
        refused_with(want, s.release_claim, dataclasses.replace(lease, epoch=epoch))
    for epoch in (0, 127, 2**63 - 1):  # well-formed epochs, just not the claim's
        with pytest.raises(GuardRefused) as info:
            s.release_claim(dataclasses.replace(lease, epoch=epoch))
        assert fields(info.value) == ("release", TARGET, "claim_owner", "reserved")
    # the owner token and the epoch must both be the claim's
    with pytest.raises(GuardRefused) as info:
        s.release_claim(dataclasses.replace(lease, owner_token="clm_" + "0" * 32))
    assert fields(info.value) == ("release", TARGET, "claim_owner", "reserved")
    assert s.claim(TARGET).owner_token == lease.owner_token  # nothing above moved it


def test_approval_operations_refuse_bad_input_by_field_and_limit(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    refused_with(("approval", C.WRONG_TYPE, None), s.expire_approval, apv.approval_id)
    refused_with(
        not_string("approval id"),
        s.expire_approval,
        dataclasses.replace(apv, approval_id=123),
    )
    for n in (129, MAX_TEXT_CHARS + 1):
        refused_with(
            too_long("approval id", 128),
            s.expire_approval,
            dataclasses.replace(apv, approval_id="a" * n),
        )
    refused_with(not_string("operator"), s.withdraw_approval, apv.approval_id, operator=123)
    refused_with(not_string("approval id"), s.withdraw_approval, 123, operator="bob")
    assert s.approval(apv.approval_id).state == "approved"


def test_approve_refuses_bad_input_by_field_and_limit(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    refused_with(not_string("key"), s.approve, 123, approver="alice", expires_in=60)
    refused_with(too_long("key", 256), s.approve, "k" * 257, approver="alice", expires_in=60)
    with pytest.raises(UnknownIntent):  # 256 characters pass the check: no such intent
        s.approve("k" * 256, approver="alice", expires_in=60)
    refused_with(not_string("approver"), approve, s, it, approver=123)
    refused_with(too_long("approver", 256), approve, s, it, approver="a" * 257)
    refused_with(("expires_in", C.NOT_NUMBER, None), approve, s, it, expires_in="soon")
    refused_with(not_string("request_digest"), approve, s, it, request_digest=123)
    refused_with(("request_digest", C.EMPTY, None), approve, s, it, request_digest=" ")
    for v, want in (
        (True, ("target_version", C.NOT_INTEGER, None)),
        ("1", ("target_version", C.NOT_INTEGER, None)),
        (1.0, ("target_version", C.NOT_INTEGER, None)),
        (-1, ("target_version", C.OUT_OF_RANGE, 0)),
        (2**62, ("target_version", C.OUT_OF_RANGE, 2**62 - 1)),
        (2**63, ("target_version", C.OUT_OF_RANGE, 2**62 - 1)),
    ):
        refused_with(want, approve, s, it, target_version=v)
    assert s.approvals(it.key) == []  # nothing above made an approval
    for v in (0, 124, 125, 2**62 - 1):
        assert approve(s, it, target_version=v).target_version == v
    apv = approve(s, it, request_digest=it.request_digest)
    assert apv.request_digest == it.request_digest
    assert re.fullmatch(r"apv_[0-9a-f]{24}", apv.approval_id)
    plain = s.submit("acct", "post", TARGET, {"text": "no gate"})
    refused_with(("key", None, None), approve, s, plain)  # submitted without an approval requirement
    assert [a.key for a in s.approvals(plain.key)] == []


def test_reserve_claim_refuses_bad_input_by_field_and_limit(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    good = {"approval_id": apv.approval_id, "request_digest": it.request_digest, "owner": "w1"}

    def call(key=it.key, **kw):
        return s.reserve_claim(key, **(good | kw))

    refused_with(not_string("key"), call, 123)
    refused_with(too_long("key", 256), call, "k" * 257)
    with pytest.raises(UnknownIntent):  # 256 characters pass the check: no such intent
        call("k" * 256)
    checked = {"approval_id": ("approval id", 128), "request_digest": ("request_digest", 128), "owner": ("owner", 256)}
    for field, (name, limit) in checked.items():
        refused_with(not_string(name), call, **{field: 123})
        for n in (limit + 1, MAX_TEXT_CHARS + 1):
            refused_with(too_long(name, limit), call, **{field: "x" * n})
    refused_with(("lease_seconds", C.NOT_NUMBER, None), call, lease_seconds="long")
    assert s.claim(TARGET).state == "free"  # nothing above moved it
    with pytest.raises(GuardRefused) as info:  # limits met, but another digest
        call(request_digest="d" * 128)
    assert fields(info.value) == ("reserve", TARGET, "approval_binds_request", "free")
    with pytest.raises(GuardRefused) as info:
        call(approval_id="a" * 128)
    assert fields(info.value) == ("reserve", TARGET, "approval_usable", "free")
    lease = call(owner="o" * 256)
    c = s.claim(TARGET)
    assert (lease.target, lease.epoch, lease.owner, lease.key, lease.approval_id) == (
        TARGET,
        1,
        "o" * 256,
        it.key,
        apv.approval_id,
    )
    assert (lease.owner_token, lease.expires_at) == (c.owner_token, c.lease_expires_at)
    assert isinstance(lease.expires_at, float)
    assert re.fullmatch(r"clm_[0-9a-f]{32}", lease.owner_token)
    plain = s.submit("acct", "post", OTHER, {"text": "no gate"})
    refused_with(("key", None, None), call, plain.key)  # submitted without an approval requirement
    assert s.claim(OTHER) is None


def test_a_claim_lease_lasts_thirty_seconds_by_default():
    s, clock = model()
    it = gated(s, target=TARGET)
    lease = reserve(s, it, approve(s, it))
    assert lease.expires_at == clock.t + 30.0


# ---------------------------------------------------------------- refusals name what refused
def test_unknown_intents_and_approvals_are_refused_with_exact_fields(any_store):
    s = any_store.store
    with pytest.raises(UnknownIntent) as info:
        s.approve(MISSING, approver="alice", expires_in=600)
    assert fields(info.value) == ("approve", MISSING, "intent_exists", None)
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    with pytest.raises(UnknownIntent) as info:
        s.withdraw_approval("apv_missing", operator="bob", reason="no longer wanted")
    assert fields(info.value) == ("withdraw_approval", "apv_missing", "approval_exists", None)
    with pytest.raises(UnknownIntent) as info:
        s.expire_approval(dataclasses.replace(apv, approval_id="apv_missing"))
    assert fields(info.value) == ("expire_approval", "apv_missing", "approval_exists", None)


def test_approval_and_claim_refusals_name_event_subject_guard_and_state(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    with pytest.raises(GuardRefused) as info:
        approve(s, it, approver="")
    assert fields(info.value) == ("approve", it.key, "approver_identified", None)
    apv = approve(s, it)
    with pytest.raises(GuardRefused) as info:  # the subject of an approval move is the approval, not its target
        s.expire_approval(apv)
    assert fields(info.value) == ("expire_approval", apv.approval_id, "approval_deadline_passed", "approved")
    s.withdraw_approval(apv.approval_id, operator="bob", reason="no longer wanted")
    with pytest.raises(IllegalMove) as info:
        s.withdraw_approval(apv.approval_id, operator="bob", reason="no longer wanted")
    assert fields(info.value) == ("withdraw_approval", apv.approval_id, "source_state", "withdrawn")
    with pytest.raises(GuardRefused) as info:
        reserve(s, it, apv)
    assert fields(info.value) == ("reserve", TARGET, "approval_usable", "free")
    lease = reserve(s, it, approve(s, it))
    with pytest.raises(IllegalMove) as info:
        s.release_claim(dataclasses.replace(lease, target=OTHER))
    assert fields(info.value) == ("release", OTHER, "source_state", "free")


def test_disabling_one_claim_guard_leaves_the_events_later_guards_in_force(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    s.withdraw_approval(apv.approval_id, operator="bob", reason="no longer wanted")
    s._disabled_guards = frozenset({"intent_queued"})  # reserve's first guard
    with pytest.raises(GuardRefused) as info:
        reserve(s, it, apv)
    assert fields(info.value) == ("reserve", TARGET, "approval_usable", "free")
    assert s.claim(TARGET).state == "free"


# ---------------------------------------------------------------- the recorded refusal of a stale claim lease
def test_a_stale_claim_lease_refusal_records_what_was_presented_current_and_superseding(any_store):
    s = any_store.store
    a, b = gated(s, "a", target=TARGET), gated(s, "b", target=TARGET)
    pa, pb = approve(s, a), approve(s, b)
    old = reserve(s, a, pa, owner="w1", lease_seconds=10)
    any_store.advance(11)
    new = reserve(s, b, pb, owner="w2")
    replace_seq = s.claim_history(TARGET)[-1].seq
    approve(s, gated(s, "c", target=TARGET))  # an approval row after the replace: not a claim move
    approve(s, gated(s, "d", target=OTHER))
    with pytest.raises(GuardRefused):
        s.release_claim(old)
    [r] = s.refusals(f"claim:{TARGET}")
    assert (r.key, r.event, r.guard) == (f"claim:{TARGET}", "release", "claim_owner")
    assert dict(r.presented) == {"owner": "w1", "claim_epoch": 1, "key": a.key}
    assert dict(r.current) == {"state": "reserved", "epoch": 2, "owner": "w2", "key": b.key}
    assert r.superseded_by_seq == replace_seq
    assert isinstance(r.recorded_at, float)
    assert new.epoch == 2


def test_a_lease_presented_for_a_target_whose_claim_never_moved_is_recorded_with_nothing_superseding(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    lease = reserve(s, it, approve(s, it))
    approve(s, gated(s, "other", target=OTHER))  # OTHER has a claim row (free) and no claim move yet
    with pytest.raises(IllegalMove):
        s.release_claim(dataclasses.replace(lease, target=OTHER))
    [r] = s.refusals(f"claim:{OTHER}")
    assert (r.event, r.guard, r.superseded_by_seq) == ("release", "source_state", None)
    assert dict(r.current) == {"state": "free", "epoch": 0, "owner": None, "key": None}


def test_a_lease_presented_for_a_target_that_has_no_claim_records_nothing_on_every_store(any_store):
    """There is no claim of that target to have gone stale: the SQL stores record nothing (the claim row the
    refused move would have created is rolled back with it), and the model agrees (it used to record a
    refusal against an empty claim)."""
    s = any_store.store
    it = gated(s, target=TARGET)
    lease = reserve(s, it, approve(s, it))
    with pytest.raises(IllegalMove) as info:
        s.release_claim(dataclasses.replace(lease, target="nowhere"))
    assert fields(info.value) == ("release", "nowhere", "source_state", "free")
    assert s.refusals("claim:nowhere") == []
    assert s.claim("nowhere") is None


def test_the_model_stamps_a_claim_refusal_with_its_clock():
    s, clock = model()
    it = gated(s, target=TARGET)
    lease = reserve(s, it, approve(s, it))
    clock.advance(7)
    with pytest.raises(GuardRefused):
        s.release_claim(dataclasses.replace(lease, epoch=0))
    [r] = s.refusals(f"claim:{TARGET}")
    assert r.recorded_at == clock.t


def test_the_model_stamps_a_claim_refusal_at_a_coupled_move_with_its_clock():
    s, clock = model()
    it = gated(s, target=TARGET)
    claim = reserve(s, it, approve(s, it))
    clock.advance(3)
    with pytest.raises(GuardRefused) as info:
        authorize(s, it, dataclasses.replace(claim, epoch=5))
    assert info.value.guard == "claim_owner"
    [r] = s.refusals(f"claim:{TARGET}")
    assert (r.event, r.guard, r.recorded_at) == ("start_sending", "claim_owner", clock.t)


# ---------------------------------------------------------------- history rows
def test_claim_history_rows_carry_every_field_of_every_move(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    dropped = approve(s, it, approver="carol")  # while the intent is queued: a published one takes none
    lease = reserve(s, it, apv, owner="w1")
    s.release_claim(lease)
    lease = reserve(s, it, apv, owner="w2")
    attempt = authorize(s, it, lease)
    s.record_success(attempt, remote_id="obj-1")
    s.confirm_read_back(attempt)
    s.withdraw_approval(dropped.approval_id, operator="bob", reason="no longer wanted")
    other = gated(s, "elsewhere", target=OTHER)
    reserve(s, other, approve(s, other), owner="w9")  # another target's rows stay out of TARGET's history
    rows = s.claim_history(TARGET)
    k, a1, a2 = it.key, apv.approval_id, dropped.approval_id
    assert [(h.machine, h.subject, h.event, h.actor, h.from_state, h.to_state, h.epoch, h.key) for h in rows] == [
        ("approval", a1, "approve", "approver:alice", None, "approved", None, k),
        ("approval", a2, "approve", "approver:carol", None, "approved", None, k),
        ("claim", TARGET, "reserve", "worker", "free", "reserved", 1, k),
        ("claim", TARGET, "release", "worker", "reserved", "free", 1, None),
        ("claim", TARGET, "reserve", "worker", "free", "reserved", 2, k),
        ("claim", TARGET, "start_sending", "worker", "reserved", "sending", 2, k),
        ("approval", a1, "consume_approval", "worker", "approved", "consumed", None, k),
        ("claim", TARGET, "settle", "worker", "sending", "free", 2, None),
        ("approval", a2, "withdraw_approval", "operator:bob", "approved", "withdrawn", None, k),
    ]
    assert [dict(h.detail) for h in rows] == [
        {"approver": "alice"},
        {"approver": "carol"},
        {"owner": "w1"},
        {"owner": "w1"},
        {"owner": "w2"},
        {"owner": "w2"},  # the claim lease the send presented
        {"owner": "w2"},
        {},
        {"operator": "bob", "reason": "no longer wanted"},
    ]
    seqs = [h.seq for h in rows]
    assert seqs == sorted(set(seqs))
    assert all(isinstance(h.recorded_at, float) for h in rows)
    assert [h.subject for h in s.claim_history(OTHER) if h.machine == "claim"] == [OTHER]
    assert len(s.claim_history(OTHER)) == 2


def test_a_reason_and_a_sweeper_appear_in_the_claim_history(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    apv = approve(s, it, expires_in=60)
    lease = reserve(s, it, apv)
    s.block_at_gate(s.begin(it.key, lease_seconds=30), reason="not today")
    last = s.claim_history(TARGET)[-1]
    assert (last.event, last.actor, last.to_state, dict(last.detail)) == (
        "release_with_intent",
        "worker",
        "free",
        {"reason": "not today"},
    )
    assert lease.epoch == last.epoch == 1
    any_store.advance(61)
    s.expire_approval(apv)
    last = s.claim_history(TARGET)[-1]
    assert (last.machine, last.subject, last.event, last.actor, last.from_state, last.to_state) == (
        "approval",
        apv.approval_id,
        "expire_approval",
        "sweeper",
        "approved",
        "expired",
    )
    assert dict(last.detail) == {}


def test_claim_history_hands_out_copies(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    reserve(s, it, approve(s, it), owner="w1")
    for h in s.claim_history(TARGET):
        h.detail["owner"] = "changed"
    assert [dict(h.detail) for h in s.claim_history(TARGET)] == [{"approver": "alice"}, {"owner": "w1"}]


def test_the_model_stamps_claim_and_approval_rows_with_its_clock():
    s, clock = model()
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    assert s.claim(TARGET).updated_at == clock.t  # the target's claim row exists from its first approval
    clock.advance(5)
    lease = reserve(s, it, apv)
    assert s.claim(TARGET).updated_at == clock.t
    clock.advance(5)
    s.release_claim(lease)
    clock.advance(5)
    s.withdraw_approval(approve(s, it).approval_id, operator="bob", reason="no longer wanted")
    assert [h.recorded_at for h in s.claim_history(TARGET)] == [
        1_000_000.0,
        1_000_005.0,
        1_000_010.0,
        1_000_015.0,
        1_000_015.0,
    ]


# ---------------------------------------------------------------- effects on the claim row
def test_a_release_drops_every_owner_field_and_keeps_the_epoch(any_store):
    s = any_store.store
    it = gated(s, target=TARGET)
    lease = reserve(s, it, approve(s, it))
    c = s.release_claim(lease)
    assert (c.state, c.epoch, c.owner, c.owner_token, c.key, c.approval_id, c.lease_expires_at) == (
        "free",
        1,
        None,
        None,
        None,
        None,
        None,
    )
    assert s.claim(TARGET) == c


def test_each_publication_bumps_the_target_version_and_the_send_extends_the_claim_lease(any_store):
    s = any_store.store
    for n, text in enumerate(("first", "second"), start=1):
        it = gated(s, text, target=TARGET)
        attempt = authorize(s, it, reserve(s, it, approve(s, it)))
        claim, intent = s.claim(TARGET), s.get(it.key)
        assert claim.state == "sending" and claim.lease_expires_at == intent.lease_expires_at
        s.record_success(attempt, remote_id=f"obj-{n}")
        s.confirm_read_back(attempt)
        assert s.claim(TARGET).target_version == n


# ---------------------------------------------------------------- deadlines, to the second (model clock)
def test_an_approval_is_due_and_unusable_exactly_at_its_deadline():
    s, clock = model()
    it = gated(s, target=TARGET)
    kept, swept = approve(s, it, expires_in=60), approve(s, it, expires_in=60)
    clock.advance(60)
    assert [a.approval_id for a in s.due_approvals()] == sorted([kept.approval_id, swept.approval_id])
    with pytest.raises(GuardRefused) as info:
        reserve(s, it, kept)
    assert info.value.guard == "approval_usable"
    assert s.expire_approval(swept).state == "expired"


def test_a_claim_lease_is_over_exactly_at_its_deadline():
    s, clock = model()
    a, b = gated(s, "a", target=TARGET), gated(s, "b", target=TARGET)
    pa, pb = approve(s, a), approve(s, b)
    lease = reserve(s, a, pa, lease_seconds=30)
    clock.advance(30)
    with pytest.raises(GuardRefused) as info:  # too late to send under it
        authorize(s, a, lease)
    assert info.value.guard == "claim_lease_live"
    assert reserve(s, b, pb, owner="w2").epoch == 2  # and free to be replaced


def test_due_approvals_come_oldest_deadline_first_a_hundred_by_default():
    s, clock = model()
    it = gated(s, target=TARGET)
    late = approve(s, it, expires_in=50)
    early = approve(s, it, expires_in=10)
    rest = [approve(s, it, expires_in=100 + i) for i in range(100)]
    clock.advance(500)
    due = s.due_approvals()
    assert len(due) == 100
    assert [a.approval_id for a in due[:3]] == [early.approval_id, late.approval_id, rest[0].approval_id]
    assert len(s.due_approvals(limit=200)) == 102


# ---------------------------------------------------------------- order of the approval lists, ties included
def _same_stamps(any_store, key, **stamps):
    """Give every approval of ``key`` the same stamps: the model's clock already did (it was not moved); on
    SQL the rows are rewritten, as a database clock that reads the same twice would have written them."""
    if any_store.kind == "memory":
        return
    import sqlalchemy as sa

    from atmostonce_sql.schema import approvals

    with any_store.store.engine.begin() as conn:
        conn.execute(sa.update(approvals).where(approvals.c.key == key).values(**stamps))


def test_approvals_with_the_same_time_come_in_the_same_order_on_every_store(any_store):
    """Ordered by approval time, then by approval id, on the model and SQL alike (the model used to break
    ties by arrival, the SQL stores by id)."""
    s = any_store.store
    it = gated(s, target=TARGET)
    made = [approve(s, it, approver=f"approver {i}", expires_in=60) for i in range(8)]
    _same_stamps(any_store, it.key, approved_at=made[0].approved_at, expires_at=made[0].expires_at)
    ids = sorted(a.approval_id for a in made)
    assert [a.approval_id for a in s.approvals(it.key)] == ids
    any_store.advance(61)
    assert [a.approval_id for a in s.due_approvals()] == ids
    assert [a.approval_id for a in s.due_approvals(limit=3)] == ids[:3]


# ---------------------------------------------------------------- the send reads the claim's own approval
def test_the_send_consumes_the_claims_approval_whatever_approval_id_the_lease_presents(any_store):
    """start_sending checks and consumes the approval the claim was reserved under (the claim row's), not the
    approval id a caller writes into the lease it presents."""
    s = any_store.store
    it = gated(s, target=TARGET)
    apv, spare = approve(s, it), approve(s, it)
    s.withdraw_approval(spare.approval_id, operator="bob", reason="no longer wanted")
    claim = reserve(s, it, apv)
    authorize(s, it, dataclasses.replace(claim, approval_id=spare.approval_id))
    assert s.approval(apv.approval_id).state == "consumed"
    assert s.approval(apv.approval_id).used_epoch == claim.epoch
    assert s.approval(spare.approval_id).state == "withdrawn"
    assert s.claim(TARGET).state == "sending"


def test_the_approval_records_the_claims_epoch_even_with_the_owner_check_off(any_store):
    """used_epoch is the epoch of the claim the send moved, not the one the lease presents."""
    s = any_store.store
    it = gated(s, target=TARGET)
    apv = approve(s, it)
    claim = reserve(s, it, apv)
    s._disabled_guards = frozenset({"claim_owner"})
    authorize(s, it, dataclasses.replace(claim, epoch=9))
    assert s.approval(apv.approval_id).used_epoch == claim.epoch == 1
