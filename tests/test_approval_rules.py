"""Who may approve what, and who may withdraw it (docs/design.md#approvals-and-per-target-dispatch-claims,
docs/design.md#withdrawing-an-approval): on the model, SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused
from tests.test_claims import TARGET, approve, authorize, gated, reserve


def _indeterminate(s):
    it = gated(s, "in doubt")
    claim = reserve(s, it, approve(s, it))
    lease = authorize(s, it, claim)
    s.record_unknown(lease, reason="read timeout")
    assert s.get(it.key).state == "indeterminate"
    return it


def test_an_intent_in_doubt_takes_no_new_approval(any_store):
    s = any_store.store
    it = _indeterminate(s)
    before = [a.approval_id for a in s.approvals(it.key)]
    with pytest.raises(GuardRefused) as info:
        approve(s, it)
    e = info.value
    assert (e.event, e.key, e.guard) == ("approve", it.key, "intent_awaiting_approval")
    assert [a.approval_id for a in s.approvals(it.key)] == before  # nothing was written


def test_an_intent_whose_send_was_authorized_takes_no_new_approval(any_store):
    s = any_store.store
    it = gated(s, "sending")
    first = approve(s, it)
    authorize(s, it, reserve(s, it, first))
    assert s.get(it.key).state == "authorized"
    with pytest.raises(GuardRefused) as info:
        approve(s, it)
    assert (info.value.event, info.value.key, info.value.guard) == ("approve", it.key, "intent_awaiting_approval")
    assert [a.approval_id for a in s.approvals(it.key)] == [first.approval_id]


def test_an_approval_of_other_bytes_than_the_intents_is_refused_when_given(any_store):
    s = any_store.store
    it = gated(s, "the reviewed text")
    other = gated(s, "an edited text")
    with pytest.raises(GuardRefused) as info:
        approve(s, it, request_digest=other.request_digest)
    e = info.value
    assert (e.event, e.key, e.guard) == ("approve", it.key, "approval_covers_intent_bytes")
    assert s.approvals(it.key) == []
    ok = approve(s, it, request_digest=it.request_digest)  # naming the intent's own digest is fine
    assert (ok.state, ok.request_digest) == ("approved", it.request_digest)


def test_the_approver_withdraws_their_own_approval_without_a_reason(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it, approver="alice")
    assert s.withdraw_approval(apv.approval_id, operator="alice").state == "withdrawn"
    last = s.claim_history(TARGET)[-1]
    assert (last.event, last.actor, last.detail) == ("withdraw_approval", "operator:alice", {"operator": "alice"})


@pytest.mark.parametrize("reason", [None, "", " \t "])
def test_another_operator_cannot_withdraw_an_approval_without_a_reason(any_store, reason):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it, approver="alice")
    n = len(s.claim_history(TARGET))
    with pytest.raises(GuardRefused) as info:
        s.withdraw_approval(apv.approval_id, operator="mallory", reason=reason)
    e = info.value
    assert (e.event, e.key, e.guard, e.state) == (
        "withdraw_approval",
        apv.approval_id,
        "withdrawal_attributable",
        "approved",
    )
    assert s.approval(apv.approval_id).state == "approved"
    assert len(s.claim_history(TARGET)) == n


def test_another_operator_withdraws_an_approval_with_a_recorded_reason(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it, approver="alice")
    out = s.withdraw_approval(apv.approval_id, operator="bob", reason="the offer in the text ended")
    assert out.state == "withdrawn"
    last = s.claim_history(TARGET)[-1]
    assert (last.event, last.actor, last.from_state, last.to_state) == (
        "withdraw_approval",
        "operator:bob",
        "approved",
        "withdrawn",
    )
    assert last.detail == {"operator": "bob", "reason": "the offer in the text ended"}
