"""Approval-gated dispatch end to end through the platform sink, on every store (docs/design.md#approvals-and-per-target-dispatch-claims): the runtime
asks for an approval of the exact bytes and the target's claim; a loser or a lapsed approval sends nothing."""

from __future__ import annotations

import pytest

from atmostonce.runtime import Dispatcher, RuntimeConfig, Sweeper
from atmostonce_http import HttpTransport, PlatformSink, sink_config

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10)


@pytest.fixture
def platform():
    with PlatformSink(dedupe=False) as sink, HttpTransport(sink_config(sink.url, key_field="/delivery_key")) as t:
        yield sink, t


def sent(sink) -> int:
    return sum(sink.creates_by_key.values())


def test_no_approval_no_begin_no_bytes(any_store, platform):
    sink, transport = platform
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "needs a yes"}, requires_approval=True)
    assert Dispatcher(s, transport, CONFIG).dispatch(it.key) == "gate.awaiting_approval"
    assert s.attempts(it.key) == [] and sent(sink) == 0


def test_an_approved_draft_is_sent_once_and_its_claim_released(any_store, platform):
    sink, transport = platform
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "approved"}, requires_approval=True)
    apv = s.approve(it.key, approver="alice", expires_in=600)
    assert Dispatcher(s, transport, CONFIG, owner="w1").dispatch(it.key) == "read_back.match"
    assert s.get(it.key).state == "published" and sent(sink) == 1
    assert s.claim("room").state == "free" and s.approval(apv.approval_id).state == "consumed"
    owners = [h.detail.get("owner") for h in s.claim_history("room") if h.event == "reserve"]
    assert owners == ["w1"]


def test_of_two_approved_drafts_the_second_loses_and_sends_nothing(any_store, platform):
    sink, transport = platform
    s = any_store.store
    a = s.submit("acct", "post", "room", {"text": "first"}, requires_approval=True)
    b = s.submit("acct", "post", "room", {"text": "second"}, requires_approval=True)
    s.approve(a.key, approver="alice", expires_in=600)
    s.approve(b.key, approver="bob", expires_in=600)
    d = Dispatcher(s, transport, CONFIG)
    assert d.dispatch(a.key) == "read_back.match"
    assert d.dispatch(b.key) == "claim.refused"  # drafted against the version a's publication replaced
    assert s.get(b.key).state == "pending" and s.attempts(b.key) == [] and sent(sink) == 1


def test_the_dispatcher_reserves_under_an_approval_the_preflight_passes_not_the_latest_deadline(any_store, platform):
    sink, transport = platform
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "approved twice"}, requires_approval=True)
    live = s.approve(it.key, approver="alice", expires_in=600)
    withdrawn = s.approve(it.key, approver="alice", expires_in=6000)  # the later deadline, but withdrawn
    s.withdraw_approval(withdrawn.approval_id, operator="alice")
    assert Dispatcher(s, transport, CONFIG).dispatch(it.key) == "read_back.match"
    assert s.approval(live.approval_id).state == "consumed" and sent(sink) == 1


def test_with_every_approval_refused_by_the_preflight_nothing_is_reserved_or_begun(any_store, platform):
    sink, transport = platform
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "approved, then not"}, requires_approval=True)
    s.approve(it.key, approver="alice", expires_in=5)
    any_store.advance(6)  # its deadline passed by the store clock, before the sweeper marks it expired
    claim_moves = len(s.claim_history("room"))
    assert Dispatcher(s, transport, CONFIG).dispatch(it.key) == "gate.awaiting_approval"
    assert len(s.claim_history("room")) == claim_moves and s.attempts(it.key) == [] and sent(sink) == 0


def test_an_approval_that_lapses_after_the_reservation_sends_nothing(any_store, platform):
    sink, transport = platform
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "slow work"}, requires_approval=True)
    s.approve(it.key, approver="alice", expires_in=5)
    # the expensive step outlives the approval; the claim's own lease (10 s) is still live
    d = Dispatcher(s, transport, CONFIG, work=lambda _it: any_store.advance(6))
    assert d.dispatch(it.key) == "claim.refused"
    assert s.get(it.key).state == "pending" and sent(sink) == 0
    assert s.claim("room").state == "free"  # released: another approval may go
    assert Sweeper(s, CONFIG).expire_approvals() == {"approvals_expired": 1}
    assert [a.state for a in s.approvals(it.key)] == ["expired"]


def test_while_one_draft_is_uncertain_no_other_draft_on_the_target_is_sent(any_store, platform):
    sink, transport = platform
    s = any_store.store
    a = s.submit("acct", "post", "room", {"text": "lost answer"}, requires_approval=True)
    b = s.submit("acct", "post", "room", {"text": "next"}, requires_approval=True)
    s.approve(a.key, approver="alice", expires_in=600)
    sink.plan("drop_after_write")
    d = Dispatcher(s, transport, CONFIG)
    assert d.dispatch(a.key) == "send.unknown"
    assert s.claim("room").state == "uncertain"
    s.approve(b.key, approver="alice", expires_in=600)
    assert d.dispatch(b.key) == "claim.busy"
    assert s.attempts(b.key) == [] and sent(sink) == 1
