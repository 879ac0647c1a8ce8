"""``Store.check``: the table's guards evaluated without writing, through the registry the move uses."""

from __future__ import annotations

import pytest

from atmostonce import IntakeError, UnknownIntent
from tests.helpers import submit


def snapshot(store, key):
    return store.get(key), store.history(key), store.attempts(key), store.total_attempts()


def test_check_names_the_first_refusing_guard_and_writes_nothing(any_store):
    any_store = any_store.store
    it = submit(any_store)
    before = snapshot(any_store, it.key)
    assert any_store.check("begin", it.key) is None
    assert any_store.check("authorize_dispatch", it.key, guards=["kill_switch_off", "rate_limit_clear"]) is None
    any_store.set_kill_switch(f"account:{it.account}", True, operator="ops")
    assert any_store.check("authorize_dispatch", it.key, guards=["kill_switch_off"]) == "kill_switch_off"
    assert any_store.check("authorize_dispatch", it.key) == "lease_holder"  # no lease presented: the first guard
    assert snapshot(any_store, it.key) == before


def test_check_agrees_with_the_move_it_stands_for(any_store):
    any_store = any_store.store
    it = submit(any_store)
    any_store.begin(it.key)
    assert any_store.check("begin", it.key) == "no_open_attempt"
    assert any_store.check("retry", it.key) == "source_state"  # retry leaves failed only


def test_check_refuses_an_unknown_intent_event_or_guard(any_store):
    any_store = any_store.store
    it = submit(any_store)
    with pytest.raises(UnknownIntent):
        any_store.check("begin", "no-such-key")
    with pytest.raises(IntakeError):
        any_store.check("no_such_event", it.key)
    with pytest.raises(IntakeError):
        any_store.check("begin", it.key, guards=["kill_switch_off"])  # not a guard of begin
