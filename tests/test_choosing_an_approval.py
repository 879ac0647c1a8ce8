"""The dispatcher chooses the approval of an approval-gated intent through the store's pre-flight
(docs/design.md#approvals-and-per-target-dispatch-claims, "Choosing an approval"): what the pre-flight passes,
the reservation's conditional write still re-checks, so an approval withdrawn or lapsed in between is refused by
the write with nothing begun or sent; the pre-flight reads only the intent's own approvals, and agrees on every
store."""

from __future__ import annotations

import pytest

from atmostonce import IntakeError, Rejected
from atmostonce.names import OUTCOME, STATE
from atmostonce.runtime import Dispatcher, RuntimeConfig, Sweeper
from tests.test_fused_dispatch import Platform

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)
TARGET = "room-choice"


def gated(s, text="hello", target=TARGET):
    return s.submit("acct", "post", target, {"text": text}, requires_approval=True)


def nothing_begun(s, it, platform):
    assert platform.sends == 0
    assert s.get(it.key).state == STATE.pending and s.get(it.key).attempt_count == 0
    assert s.attempts(it.key) == []
    claim = s.claim(TARGET)
    assert claim is None or claim.state == "free"


class Between:
    """A store whose pre-flight runs ``then`` after it answered and before the dispatcher reserves."""

    def __init__(self, store, then):
        self._store, self._then = store, then

    def check_approvals(self, key, **kw):
        out = self._store.check_approvals(key, **kw)
        self._then()
        return out

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_an_approval_withdrawn_between_the_preflight_and_the_reservation_is_refused_by_the_write(any_store):
    s = any_store.store
    it = gated(s)
    apv = s.approve(it.key, approver="alice", expires_in=600)
    platform = Platform()
    store = Between(s, lambda: s.withdraw_approval(apv.approval_id, operator="alice"))
    assert Dispatcher(store, platform, CONFIG).dispatch(it.key) == OUTCOME.claim_refused
    nothing_begun(s, it, platform)


def test_an_approval_lapsing_between_the_preflight_and_the_reservation_is_refused_by_the_write(any_store):
    s = any_store.store
    it = gated(s)
    s.approve(it.key, approver="alice", expires_in=30)
    platform = Platform()
    store = Between(s, lambda: any_store.advance(60))
    assert Dispatcher(store, platform, CONFIG).dispatch(it.key) == OUTCOME.claim_refused
    nothing_begun(s, it, platform)


def test_an_intent_with_a_stale_version_approval_expiring_last_is_sent_under_its_current_one(any_store):
    """An approval drafted against an older target version (another draft was published to the target since)
    can never be reserved under; one given at the current version can. The choice must not settle on the one
    the reservation is bound to refuse only because its deadline is later."""
    s = any_store.store
    it = gated(s, text="second draft")
    s.approve(it.key, approver="alice", expires_in=3600)  # at the target's version when it was given
    first = gated(s, text="first draft")
    s.approve(first.key, approver="alice", expires_in=600)
    assert Dispatcher(s, Platform(), CONFIG).dispatch(first.key) == OUTCOME.read_back_match  # the version moves on
    s.approve(it.key, approver="bob", expires_in=600)  # re-approved against the new version
    platform = Platform()
    assert Dispatcher(s, platform, CONFIG).dispatch(it.key) == OUTCOME.read_back_match
    assert platform.sends == 1 and s.get(it.key).state == STATE.published


def test_many_approvals_of_one_intent_are_judged_alike_on_every_store_and_only_its_own(any_store):
    s = any_store.store
    it = gated(s)
    other = gated(s, text="another draft")  # same target, its own approvals
    for _ in range(5):
        s.approve(other.key, approver="carol", expires_in=600)
    made = []
    for i in range(24):
        made.append(s.approve(it.key, approver="alice", expires_in=5 if i % 3 == 0 else 600))
    for a in made[1::4]:
        s.withdraw_approval(a.approval_id, operator="alice")
    any_store.advance(10)
    verdicts = s.check_approvals(it.key, request_digest=it.request_digest)
    assert [a.approval_id for a, _ in verdicts] == [a.approval_id for a in s.approvals(it.key)]
    assert {a.approval_id for a, _ in verdicts} == {a.approval_id for a in made}
    expect = {a.approval_id: (None if (i % 3 and (i - 1) % 4) else "approval_usable") for i, a in enumerate(made)}
    assert dict((a.approval_id, g) for a, g in verdicts) == expect


@pytest.mark.parametrize(
    "bad",
    [
        {"key": 7},
        {"key": "k\x00ey"},
        {"request_digest": None},
        {"request_digest": "d\x00"},
        {"guards": ["no_such_guard"]},
        {"guards": [["approval_usable"]]},
        {"guards": [None]},
        {"guards": "approval_usable"},
    ],
)
def test_bad_input_to_the_preflight_is_refused_as_intake(any_store, bad):
    s = any_store.store
    it = gated(s)
    s.approve(it.key, approver="alice", expires_in=600)
    kw = {"request_digest": it.request_digest} | {k: v for k, v in bad.items() if k != "key"}
    with pytest.raises(IntakeError):
        s.check_approvals(bad.get("key", it.key), **kw)


def test_an_empty_guard_list_checks_nothing_and_every_claim_guard_is_judged_alike_on_every_store(any_store):
    s = any_store.store
    it = gated(s)
    apv = s.approve(it.key, approver="alice", expires_in=600)
    assert s.check_approvals(it.key, request_digest=it.request_digest, guards=[]) == [(s.approvals(it.key)[0], None)]
    verdicts = {
        g: s.check_approvals(it.key, request_digest=it.request_digest, guards=[g])[0][1] for g in s.claim_table.guards
    }
    assert verdicts["approval_usable"] is None and verdicts["approval_for_intent"] is None
    assert verdicts["target_version_current"] is None  # no claim row yet: the target is at its first version
    assert apv.approval_id == s.approvals(it.key)[0].approval_id


def test_the_preflight_of_an_unknown_intent_is_refused(any_store):
    s = any_store.store
    with pytest.raises(Rejected) as e:
        s.check_approvals("0" * 64, request_digest="0" * 64)
    assert e.value.guard == "intent_exists"


def test_an_approval_withdrawn_after_the_reservation_and_before_the_bytes_is_refused_by_the_authorization(any_store):
    s = any_store.store
    it = gated(s)
    apv = s.approve(it.key, approver="alice", expires_in=600)
    platform = Platform()

    def work(intent):  # the caller's expensive step, after begin: the approver changes their mind
        s.withdraw_approval(apv.approval_id, operator="alice")

    outcome = Dispatcher(s, platform, CONFIG, work=work).dispatch(it.key)
    assert outcome in (OUTCOME.claim_refused, OUTCOME.gate_awaiting_approval), outcome
    assert platform.sends == 0
    assert s.get(it.key).state == STATE.pending  # never authorized; its begun attempt is the sweeper's to settle
    assert s.claim(TARGET).state == "free"
    assert s.approval(apv.approval_id).state == "withdrawn"
    any_store.advance(60)
    assert Sweeper(s, CONFIG).sweep_leases()["abandoned"] == 1
    assert s.get(it.key).attempt_token is None and platform.sends == 0
