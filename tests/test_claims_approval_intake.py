"""Approval and claim intake (atmostonce.claims.ClaimOperations): what approve binds from a signed approval, and
which argument an IntakeError names, on the reference model (intake runs before any store)."""

from __future__ import annotations

import dataclasses

import pytest

from atmostonce import IntakeError, MemoryStore
from atmostonce.errors import IntakeCode
from atmostonce.signing import SignedApproval
from atmostonce.testing.stateful import FakeClock

TARGET = "room-9"


@pytest.fixture
def store():
    return MemoryStore(clock=FakeClock())


def gated(s, text="hello"):
    return s.submit("acct", "post", TARGET, {"text": text}, requires_approval=True)


def signed_for(s, *, target_version=7, **changes) -> SignedApproval:
    # approve() stores the signature without checking it (the worker verifies before a send)
    sig = SignedApproval("ed25519:" + "ab" * 16, "cd" * 64, s.now() + 600.0, target_version)
    return dataclasses.replace(sig, **changes)


def test_a_signed_approval_binds_the_signed_target_version_not_the_current_one(store):
    it = gated(store)
    assert store.claim(TARGET) is None or store.claim(TARGET).target_version == 0
    apv = store.approve(it.key, approver="alice", signed=signed_for(store, target_version=7))
    assert apv.target_version == 7
    assert store.approval(apv.approval_id).target_version == 7


def test_a_target_version_repeating_the_signed_one_is_accepted_and_a_different_one_refused(store):
    it = gated(store)
    apv = store.approve(it.key, approver="alice", signed=signed_for(store, target_version=3), target_version=3)
    assert apv.target_version == 3
    with pytest.raises(IntakeError):
        store.approve(it.key, approver="alice", signed=signed_for(store, target_version=3), target_version=4)
    assert [a.approval_id for a in store.approvals(it.key)] == [apv.approval_id]


# (the SignedApproval attribute, the field an IntakeError names, its longest accepted length)
SIGNED_TEXT = [("signature", "signature", 256), ("signing_key_id", "key id", 64)]


@pytest.mark.parametrize("bad", [123, "", "x\x00y"])
@pytest.mark.parametrize(("attr", "field", "_"), SIGNED_TEXT)
def test_bad_signed_text_is_refused_naming_its_field(store, bad, attr, field, _):
    it = gated(store)
    with pytest.raises(IntakeError) as refused:
        store.approve(it.key, approver="alice", signed=signed_for(store, **{attr: bad}))
    assert refused.value.field == field
    assert store.approvals(it.key) == []


@pytest.mark.parametrize(("attr", "field", "longest"), SIGNED_TEXT)
def test_signed_text_one_past_its_limit_is_refused_and_at_its_limit_accepted(store, attr, field, longest):
    it = gated(store)
    with pytest.raises(IntakeError) as refused:
        store.approve(it.key, approver="alice", signed=signed_for(store, **{attr: "a" * (longest + 1)}))
    assert (refused.value.field, refused.value.code, refused.value.limit) == (field, IntakeCode.TOO_LONG, longest)
    assert store.approvals(it.key) == []
    apv = store.approve(it.key, approver="alice", signed=signed_for(store, **{attr: "a" * longest}))
    assert getattr(apv, attr) == "a" * longest


@pytest.mark.parametrize("length", [257, 300])
def test_approve_refuses_an_overlong_key_as_the_key_before_the_other_arguments(store, length):
    with pytest.raises(IntakeError) as refused:
        store.approve("k" * length, approver=None, expires_in=600)  # the approver is bad too
    assert (refused.value.field, refused.value.code, refused.value.limit) == ("key", IntakeCode.TOO_LONG, 256)


@pytest.mark.parametrize("length", [257, 300])
def test_reserve_claim_refuses_an_overlong_key_as_the_key_before_the_other_arguments(store, length):
    with pytest.raises(IntakeError) as refused:  # the approval id is bad too
        store.reserve_claim("k" * length, approval_id=None, request_digest="d" * 64, owner="w1")
    assert (refused.value.field, refused.value.code, refused.value.limit) == ("key", IntakeCode.TOO_LONG, 256)
