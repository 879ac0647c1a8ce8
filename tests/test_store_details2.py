"""The shared store API's intake checks of leases, keys and dispatch arguments, exactly (docs/mutmut.md: mutmut
survivors of ``atmostonce.store``, second round).

A worker hands ``begin``'s :class:`~atmostonce.Lease` back to every later move; ``Operations`` checks it
(a 64-bit generation and epoch, an attempt token of at most 128 characters) and the key (at most 256
characters) before the store's own ``_apply``, and a bad argument is refused by name with nothing
written. A value that passes intake but is stale is refused by the lease guard instead. Every test runs
on every store.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from atmostonce import GuardRefused, IntakeError, UnknownIntent
from tests.helpers import submit

LEASE_SECONDS_MESSAGE = "{} must be a positive, finite number of seconds up to 31622400"


def refusal(fn, *args, **kw):
    with pytest.raises(IntakeError) as info:
        fn(*args, **kw)
    return str(info.value)


def snapshot(s, key):
    """What a refused call must leave unchanged: the intent, its history and its attempts."""
    return s.get(key), [(h.seq, h.event) for h in s.history(key)], len(s.attempts(key))


def begun(s, text="hello"):
    it = submit(s, text=text)
    lease = s.begin(it.key, lease_seconds=30)
    return s.get(it.key), lease


def dispatch(s, lease, **kw):
    kw.setdefault("request_digest", s.get(lease.key).request_digest)
    return s.authorize_dispatch(lease, **kw)


# ---------------------------------------------------------------- begin
def test_begin_names_a_bad_lease_length_and_writes_nothing(any_store):
    s = any_store.store
    it = submit(s)
    before = snapshot(s, it.key)
    assert refusal(s.begin, it.key, lease_seconds=0) == LEASE_SECONDS_MESSAGE.format("lease_seconds")
    assert refusal(s.begin, it.key, lease_seconds="30") == "lease_seconds must be a number of seconds, got '30'"
    assert snapshot(s, it.key) == before


def test_begin_leases_for_thirty_seconds_by_default(any_store):
    s = any_store.store
    it = submit(s)
    before = s.now()  # the store's clock (real on SQL): bounds, not a tolerance
    lease = s.begin(it.key)
    after = s.now()
    assert before + 30 <= lease.expires_at <= after + 30
    assert s.get(it.key).lease_expires_at == lease.expires_at
    any_store.advance(20)
    assert s.due_leases() == []
    any_store.advance(11)
    assert [i.key for i in s.due_leases()] == [it.key]


def test_a_lease_carries_the_stores_restore_epoch(any_store):
    s = any_store.store
    assert s.current_epoch() == 1
    _, first = begun(s, text="one")
    assert first.epoch == 1
    s.declare_restore(operator="al")
    assert s.current_epoch() == 2
    _, second = begun(s, text="two")
    assert second.epoch == 2
    assert dispatch(s, second).state == "authorized"


# ---------------------------------------------------------------- the key every move checks
def test_a_move_names_a_bad_key(any_store):
    s = any_store.store
    assert refusal(s.begin, 7) == "key must be a string, got int"
    assert refusal(s.begin, " ") == "key must not be empty"
    assert refusal(s.retry, "k" * 257) == "key is longer than 256 characters"
    assert refusal(s.exhaust, "a\x00b") == "key contains a NUL byte"


def test_a_key_of_256_characters_passes_intake_and_is_looked_up(any_store):
    s = any_store.store
    with pytest.raises(UnknownIntent):  # an unknown key, not a malformed one
        s.begin("k" * 256)


def test_a_lease_whose_key_is_too_long_is_refused_by_name(any_store):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    bad = dataclasses.replace(lease, key="k" * 257)
    assert refusal(dispatch, s, bad, request_digest=it.request_digest) == "key is longer than 256 characters"
    assert snapshot(s, it.key) == before


# ---------------------------------------------------------------- the lease every worker move checks
def test_a_lease_that_is_no_lease_is_named_by_its_type(any_store):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    look_alike = SimpleNamespace(**dataclasses.asdict(lease))
    assert refusal(s.authorize_dispatch, look_alike, request_digest=it.request_digest) == (
        "expected a Lease from begin(), got SimpleNamespace"
    )
    assert snapshot(s, it.key) == before


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("attempt_token", "", "attempt token must not be empty"),
        ("attempt_token", 5, "attempt token must be a string, got int"),
        ("attempt_token", "t" * 129, "attempt token is longer than 128 characters"),
        ("generation", "2", "generation must be a 64-bit integer, got '2'"),
        ("generation", None, "generation must be a 64-bit integer, got None"),
        ("generation", True, "generation must be a 64-bit integer, got True"),
        ("generation", 2**63, f"generation must be a 64-bit integer, got {2**63}"),
        ("generation", -(2**63) - 1, f"generation must be a 64-bit integer, got {-(2**63) - 1}"),
        ("epoch", "0", "epoch must be a 64-bit integer, got '0'"),
        ("epoch", None, "epoch must be a 64-bit integer, got None"),
        ("epoch", -(2**63) - 1, f"epoch must be a 64-bit integer, got {-(2**63) - 1}"),
    ],
)
def test_a_lease_field_out_of_range_is_named_and_nothing_moves(any_store, field, value, message):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    bad = dataclasses.replace(lease, **{field: value})
    assert refusal(dispatch, s, bad, request_digest=it.request_digest) == message
    assert refusal(s.record_unknown, bad, reason="x") == message
    assert snapshot(s, it.key) == before
    assert s.refusals(it.key) == []  # refused at intake: no fencing refusal is recorded
    assert dispatch(s, lease).state == "authorized"  # the real lease still works


@pytest.mark.parametrize(
    ("field", "value", "guard"),
    [
        ("attempt_token", "t" * 128, "lease_holder"),
        ("generation", 2**63 - 1, "lease_holder"),
        ("generation", -(2**63), "lease_holder"),
        ("generation", 127, "lease_holder"),
        ("generation", -127, "lease_holder"),
        ("epoch", 2**62, "restore_epoch_current"),
        ("epoch", -(2**63), "restore_epoch_current"),
    ],
)
def test_a_stale_lease_within_range_reaches_the_lease_guard(any_store, field, value, guard):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    stale = dataclasses.replace(lease, **{field: value})
    with pytest.raises(GuardRefused) as info:
        dispatch(s, stale, request_digest=it.request_digest)
    assert info.value.guard == guard
    assert snapshot(s, it.key) == before
    [recorded] = s.refusals(it.key)
    assert recorded.guard == info.value.guard
    assert dispatch(s, lease).state == "authorized"


# ---------------------------------------------------------------- authorize_dispatch's own arguments
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"request_digest": ""}, "request_digest must not be empty"),
        ({"request_digest": None}, "request_digest must be a string, got NoneType"),
        ({"request_digest": "d" * 129}, "request_digest is longer than 128 characters"),
        ({"descriptor": ["a"]}, "descriptor must be a JSON object, got list"),
        ({"credential_version": ""}, "credential_version must not be empty"),
        ({"credential_version": 3}, "credential_version must be a string, got int"),
        ({"platform": ""}, "platform must not be empty"),
        ({"platform": b"x"}, "platform must be a string, got bytes"),
        ({"contract_version": " "}, "contract_version must not be empty"),
        ({"contract_version": 1.5}, "contract_version must be a string, got float"),
    ],
)
def test_authorize_dispatch_names_each_bad_argument_and_writes_nothing(any_store, kw, message):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    assert refusal(dispatch, s, lease, **kw) == message
    assert snapshot(s, it.key) == before
    assert dispatch(s, lease).state == "authorized"


def test_a_request_digest_of_128_characters_passes_intake_and_must_match(any_store):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    with pytest.raises(GuardRefused) as info:
        dispatch(s, lease, request_digest="d" * 128)
    assert info.value.guard == "request_digest_matches"
    assert snapshot(s, it.key) == before


# ------------------------------------------------------------------------------ submit
def test_submit_applies_the_stores_own_payload_cap(any_store):
    s = any_store.store
    s.max_payload_bytes = 64  # bytes of canonical JSON
    message = refusal(submit, s, text="x" * 100)
    assert message == "request is 111 bytes of canonical JSON; the limit is 64"
    assert s.list_intents() == []
    assert submit(s, text="short").state == "pending"


@pytest.mark.parametrize("first", [False, True])
def test_a_resubmission_cannot_change_the_approval_requirement(any_store, first):
    s = any_store.store
    it = submit(s, requires_approval=first)
    message = refusal(submit, s, requires_approval=not first)
    assert message == (
        f"this delivery exists already with requires_approval={first}; "
        "an approval requirement cannot be added to or dropped from an intent"
    )
    assert s.get(it.key).requires_approval is first
    assert [x.key for x in s.list_intents()] == [it.key]


# every move that takes begin()'s Lease, a sweeper's Intent snapshot or a reconciler's Plan checks its type
# before it reads the key: a wrong object is an IntakeError naming what was expected, not an AttributeError
LEASE_MOVES = {
    "block_at_gate": {"reason": "r"},
    "confirm_read_back": {},
    "read_back_failed": {"reason": "r"},
    "record_not_sent": {"reason": "r"},
    "record_unknown": {"reason": "r"},
    "record_success": {"remote_id": "x"},
    "authorize_dispatch": {"request_digest": "d"},
}
INTENT_MOVES = ("expire_lease", "abandon_attempt")
PLAN_MOVES = {
    "reconcile_found": {"remote_id": "x"},
    "reconcile_not_found": {},
    "reconcile_absent": {"fenced": True},
    "park_unreconcilable": {"reason": "r"},
}


@pytest.mark.parametrize("wrong", [None, "a-key", SimpleNamespace(key="k")], ids=["None", "str", "look-alike"])
def test_a_move_given_the_wrong_object_names_what_it_expected(any_store, wrong):
    s = any_store.store
    it, _ = begun(s)
    before = snapshot(s, it.key)
    kind = type(wrong).__name__
    for name, kw in LEASE_MOVES.items():
        assert refusal(getattr(s, name), wrong, **kw) == f"expected a Lease from begin(), got {kind}", name
    for name in INTENT_MOVES:
        assert refusal(getattr(s, name), wrong) == f"expected an Intent snapshot, got {kind}", name
    for name, kw in PLAN_MOVES.items():
        assert refusal(getattr(s, name), wrong, **kw) == f"expected a Plan (Intent.plan), got {kind}", name
    assert snapshot(s, it.key) == before
