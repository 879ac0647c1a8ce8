"""Regression tests for what an adversarial review found: each failed before its fix."""

from __future__ import annotations

import datetime as dt
import math

import pytest
import sqlalchemy as sa

from atmostonce import AtMostOnceError, GuardRefused, IntakeError, MemoryStore
from atmostonce.identity import delivery_key
from atmostonce.runtime import wire_request
from tests.helpers import begin_authorize, submit


@pytest.mark.parametrize("invisible", ["\u200b", "\ufeff", "\u00ad", "\u2060"])
def test_invisible_characters_do_not_split_a_delivery_key(invisible):
    assert delivery_key("a", "post", "t", {"x": "hello world"}) == delivery_key(
        "a", "post", "t", {"x": f"hello{invisible} world"}
    )
    assert delivery_key("a", "post", "t", {"x": "a b"}) == delivery_key("a", "post", "t", {"x": "a\u202fb"})


def test_a_later_attempt_cannot_be_confirmed_with_an_earlier_attempts_object(any_store):
    s = any_store.store
    it = submit(s)
    first = begin_authorize(s, it.key)
    s.record_success(first, remote_id="R1")
    s.read_back_failed(first, reason="read_back.not_found")
    with pytest.raises(GuardRefused) as e:  # an object id contradicts a claim of absence
        s.reconcile_absent(s.get(it.key).plan, fenced=True)
    assert e.value.guard == "no_remote_object"
    s.park(it.key, operator="alice")
    s.resolve_not_sent(it.key, operator="alice")
    s.retry(it.key)
    second = begin_authorize(s, it.key)
    assert s.get(it.key).remote_id is None
    with pytest.raises(GuardRefused) as e:
        s.confirm_read_back(second)
    assert e.value.guard == "remote_id_known"


def test_large_floats_round_trip_so_the_digest_still_matches(any_store):
    s = any_store.store
    it = s.submit("acct", "post", "t", {"x": 1e16, "y": 1e300, "z": 0.1})
    again = s.get(it.key)
    from atmostonce.identity import request_digest

    assert request_digest(wire_request(again).body) == again.request_digest == it.request_digest
    lease = s.begin(it.key)
    s.authorize_dispatch(lease, request_digest=request_digest(again.request))


def _deep(n):
    d = cur = {}
    for _ in range(n):
        cur["a"] = {}
        cur = cur["a"]
    return d


# each case prepares (may run good moves), then returns the bad call
BAD = {
    "huge lease": lambda s, k: lambda: s.begin(k, lease_seconds=10**400),
    "lease over a year": lambda s, k: lambda: s.begin(k, lease_seconds=400 * 86400),
    "deep request": lambda s, k: lambda: s.submit("acct", "post", "t", _deep(5000)),
    "dict as key": lambda s, k: lambda: s.retry({"a": 1}),
    "descriptor list": lambda s, k: (
        lambda lease: lambda: s.authorize_dispatch(lease, request_digest="d", descriptor=[1])
    )(s.begin(k)),
    "descriptor datetime": lambda s, k: (
        lambda lease: lambda: s.authorize_dispatch(lease, request_digest="d", descriptor={"t": dt.datetime.now(dt.UTC)})
    )(s.begin(k)),
    "descriptor nan": lambda s, k: (
        lambda lease: lambda: s.authorize_dispatch(lease, request_digest="d", descriptor={"x": math.nan})
    )(s.begin(k)),
    "remote id surrogate": lambda s, k: (lambda lease: lambda: s.record_success(lease, remote_id="r\ud800"))(
        begin_authorize(s, k)
    ),
    "operator surrogate": lambda s, k: lambda: s.park(k, operator="bob\ud800"),
    "operator nul": lambda s, k: lambda: s.park(k, operator="bob\x00"),
    "reason not text": lambda s, k: lambda: s.park(k, operator="bob", reason=object()),
    "reason nul": lambda s, k: lambda: s.park(k, operator="bob", reason="a\x00b"),
    "not-sent reason surrogate": lambda s, k: (lambda lease: lambda: s.record_not_sent(lease, reason="x\udc00"))(
        begin_authorize(s, k)
    ),
    "key surrogate": lambda s, k: lambda: s.retry("k\ud800"),
    "huge cap": lambda s, k: lambda: s.submit("acct", "post", "t", {"m": 1}, max_attempts=10**20),
    "cap over int4": lambda s, k: lambda: s.submit("acct", "post", "t", {"m": 1}, max_attempts=2**31),
    "digest not text": lambda s, k: (lambda lease: lambda: s.authorize_dispatch(lease, request_digest={"a": 1}))(
        s.begin(k)
    ),
    "negative limit": lambda s, k: lambda: s.list_intents(limit=-1),
    "reason too long": lambda s, k: lambda: s.park(k, operator="bob", reason="x" * 5000),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_input_is_the_same_typed_error_on_every_store_and_writes_nothing(any_store, case):
    s = any_store.store
    it = submit(s)
    bad_call = BAD[case](s, it.key)
    before = (s.get(it.key), s.history(it.key), s.attempts(it.key), s.list_intents())
    with pytest.raises(IntakeError):
        bad_call()
    assert (s.get(it.key), s.history(it.key), s.attempts(it.key), s.list_intents()) == before


def test_the_model_hands_out_copies_not_its_own_state():
    s = MemoryStore()
    req = {"b": "hi", "tags": ["a"]}
    k = s.submit("acct", "post", "target", req).key
    req["tags"].append("evil")
    s.get(k).request["b"] = "changed"
    assert s.get(k).request == {"b": "hi", "tags": ["a"]}
    lease = s.begin(k)
    d = {"transport": "t", "nested": {"v": 1}}
    s.authorize_dispatch(lease, request_digest=s.get(k).request_digest, descriptor=d)
    d["nested"]["v"] = 2
    assert s.get(k).descriptor["nested"]["v"] == 1
    s.record_not_sent(lease, reason="why")
    s.history(k)[-1].detail["reason"] = "rewritten"
    assert s.history(k)[-1].detail["reason"] == "why"


def test_a_move_that_raises_midway_leaves_the_model_unchanged(monkeypatch):
    s = MemoryStore()
    k = s.submit("acct", "post", "target", {"b": 1}).key
    s.begin(k)
    before = (s.get(k), s.attempts(k))

    def boom(*a, **kw):
        raise RuntimeError("history could not be built")

    monkeypatch.setattr(s, "_history_entry", boom)
    with pytest.raises(RuntimeError):
        s.park(k, operator="bob")
    assert (s.get(k), s.attempts(k)) == before


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT OR REPLACE INTO aom_history (seq, key, event, actor, from_state, to_state, detail, recorded_at) "
        "SELECT seq, key, 'forged', 'x', NULL, 'pending', '{}', 0 FROM aom_history",
        "REPLACE INTO aom_attempts (attempt_token, key, number, generation, request_digest, opened_at) "
        "SELECT attempt_token, key, number, generation + 1000, 'forged', opened_at FROM aom_attempts",
        "REPLACE INTO aom_attempts (attempt_token, key, number, generation, request_digest, opened_at) "
        "SELECT 'new-token', key, number, generation + 1000, 'forged', opened_at FROM aom_attempts",
    ],
)
def test_sqlite_replace_cannot_rewrite_append_only_rows(sqlite_store, statement):
    it = submit(sqlite_store)
    sqlite_store.begin(it.key)
    before = (sqlite_store.history(it.key), sqlite_store.attempts(it.key))
    with pytest.raises(AtMostOnceError):
        with sqlite_store._tx() as conn:
            conn.execute(sa.text(statement))
    assert (sqlite_store.history(it.key), sqlite_store.attempts(it.key)) == before
