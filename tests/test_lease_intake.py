"""What every store takes back from a worker: the lease, the key and the dispatch arguments.

A worker hands ``begin``'s :class:`~atmostonce.Lease` back to every later move; ``Operations`` checks it
(a 64-bit generation and epoch, an attempt token of at most 128 characters) and the key (at most 256
characters) before the store's own ``_apply``, and a bad argument is refused with nothing written, by an
``IntakeError`` whose ``field``, ``code`` and ``limit`` say which argument, why and the bound crossed. A value that passes intake but is stale is refused by the lease guard instead. Every test runs
on every store.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from atmostonce import GuardRefused, IntakeCode, IntakeError, UnknownIntent
from atmostonce.records import MAX_LEASE_SECONDS
from tests.helpers import submit

C = IntakeCode
INT64 = (-(2**63), 2**63 - 1)


def refusal(fn, *args, **kw):
    """``(field, code, limit)`` of the ``IntakeError`` that ``fn(*args, **kw)`` raises."""
    with pytest.raises(IntakeError) as info:
        fn(*args, **kw)
    e = info.value
    return (e.field, e.code, e.limit)


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
    assert refusal(s.begin, it.key, lease_seconds=0) == ("lease_seconds", C.OUT_OF_RANGE, MAX_LEASE_SECONDS)
    assert refusal(s.begin, it.key, lease_seconds="30") == ("lease_seconds", C.NOT_NUMBER, None)
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
    assert refusal(s.begin, 7) == ("key", C.NOT_STRING, None)
    assert refusal(s.begin, " ") == ("key", C.EMPTY, None)
    assert refusal(s.retry, "k" * 257) == ("key", C.TOO_LONG, 256)
    assert refusal(s.exhaust, "a\x00b") == ("key", C.NUL_BYTE, None)


def test_a_key_of_256_characters_passes_intake_and_is_looked_up(any_store):
    s = any_store.store
    with pytest.raises(UnknownIntent):  # an unknown key, not a malformed one
        s.begin("k" * 256)


def test_a_lease_whose_key_is_too_long_is_refused_by_name(any_store):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    bad = dataclasses.replace(lease, key="k" * 257)
    assert refusal(dispatch, s, bad, request_digest=it.request_digest) == ("key", C.TOO_LONG, 256)
    assert snapshot(s, it.key) == before


# ---------------------------------------------------------------- the lease every worker move checks
def test_a_lease_that_is_no_lease_is_named_by_its_type(any_store):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    look_alike = SimpleNamespace(**dataclasses.asdict(lease))
    assert refusal(s.authorize_dispatch, look_alike, request_digest=it.request_digest) == (
        "lease",
        C.WRONG_TYPE,
        None,
    )
    assert snapshot(s, it.key) == before


@pytest.mark.parametrize(
    ("field", "value", "refused"),
    [
        ("attempt_token", "", ("attempt token", C.EMPTY, None)),
        ("attempt_token", 5, ("attempt token", C.NOT_STRING, None)),
        ("attempt_token", "t" * 129, ("attempt token", C.TOO_LONG, 128)),
        ("generation", "2", ("generation", C.NOT_INTEGER, None)),
        ("generation", None, ("generation", C.NOT_INTEGER, None)),
        ("generation", True, ("generation", C.NOT_INTEGER, None)),
        ("generation", 2**63, ("generation", C.OUT_OF_RANGE, INT64[1])),
        ("generation", -(2**63) - 1, ("generation", C.OUT_OF_RANGE, INT64[0])),
        ("epoch", "0", ("epoch", C.NOT_INTEGER, None)),
        ("epoch", None, ("epoch", C.NOT_INTEGER, None)),
        ("epoch", -(2**63) - 1, ("epoch", C.OUT_OF_RANGE, INT64[0])),
    ],
)
def test_a_lease_field_out_of_range_is_named_and_nothing_moves(any_store, field, value, refused):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    bad = dataclasses.replace(lease, **{field: value})
    assert refusal(dispatch, s, bad, request_digest=it.request_digest) == refused
    assert refusal(s.record_unknown, bad, reason="x") == refused
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
    ("kw", "refused"),
    [
        ({"request_digest": ""}, ("request_digest", C.EMPTY, None)),
        ({"request_digest": None}, ("request_digest", C.NOT_STRING, None)),
        ({"request_digest": "d" * 129}, ("request_digest", C.TOO_LONG, 128)),
        ({"descriptor": ["a"]}, ("descriptor", C.NOT_OBJECT, None)),
        ({"credential_version": ""}, ("credential_version", C.EMPTY, None)),
        ({"credential_version": 3}, ("credential_version", C.NOT_STRING, None)),
        ({"platform": ""}, ("platform", C.EMPTY, None)),
        ({"platform": b"x"}, ("platform", C.NOT_STRING, None)),
        ({"contract_version": " "}, ("contract_version", C.EMPTY, None)),
        ({"contract_version": 1.5}, ("contract_version", C.NOT_STRING, None)),
        ({"send_lease_seconds": 0}, ("send_lease_seconds", C.OUT_OF_RANGE, MAX_LEASE_SECONDS)),
    ],
)
def test_authorize_dispatch_names_each_bad_argument_and_writes_nothing(any_store, kw, refused):
    s = any_store.store
    it, lease = begun(s)
    before = snapshot(s, it.key)
    assert refusal(dispatch, s, lease, **kw) == refused
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
    assert refusal(submit, s, text="x" * 100) == ("request", C.TOO_LARGE, 64)
    assert s.list_intents() == []
    assert submit(s, text="short").state == "pending"


@pytest.mark.parametrize("first", [False, True])
def test_a_resubmission_cannot_change_the_approval_requirement(any_store, first):
    s = any_store.store
    it = submit(s, requires_approval=first)
    assert refusal(submit, s, requires_approval=not first) == ("requires_approval", None, None)
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
    for name, kw in LEASE_MOVES.items():
        assert refusal(getattr(s, name), wrong, **kw) == ("lease", C.WRONG_TYPE, None), name
    for name in INTENT_MOVES:
        assert refusal(getattr(s, name), wrong) == ("intent", C.WRONG_TYPE, None), name
    for name, kw in PLAN_MOVES.items():
        assert refusal(getattr(s, name), wrong, **kw) == ("plan", C.WRONG_TYPE, None), name
    assert snapshot(s, it.key) == before
