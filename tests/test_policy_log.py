"""Policy changes on the record, with the operator's name, and the duplicate-text window as a stored
policy the guard reads in its conditional write (docs/design.md#policy-changes-are-on-the-record,
docs/design.md#the-duplicate-text-window), on every store."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from atmostonce import GuardRefused, IntakeError
from atmostonce.errors import AppendOnlyViolation
from tests.helpers import to_state


def _changes(store):
    return [(c.kind, c.name, c.value, c.operator) for c in reversed(store.policy_changes())]


def test_each_policy_setter_logs_kind_name_value_and_operator(any_store):
    s = any_store.store
    s.set_kill_switch("account:acct", True, operator="ann")
    s.set_rate_limit("acct", 3, window_seconds=30, operator="bob")
    s.set_rate_limit("acct", None, operator="bob")
    s.set_credential_version("acct", "cred-2", operator="cy")
    s.set_contract_version("http", None, operator="di")
    s.set_signing_required("acct", True, operator="ed")
    s.set_text_window(600, operator="flo")
    assert _changes(s) == [
        ("kill_switches", "account:acct", True, "ann"),
        ("rate_limits", "acct", {"max_sends": 3, "window_seconds": 30.0}, "bob"),
        ("rate_limits", "acct", None, "bob"),
        ("credentials", "acct", "cred-2", "cy"),
        ("contracts", "http", None, "di"),
        ("signing", "acct", True, "ed"),
        ("text_window_seconds", "global", 600, "flo"),
    ]
    rows = s.policy_changes()
    assert [r.seq for r in rows] == sorted((r.seq for r in rows), reverse=True)  # newest first
    assert all(r.recorded_at > 0 for r in rows)
    assert [r.kind for r in s.policy_changes(limit=2)] == ["text_window_seconds", "signing"]
    assert s.policies()["text_window_seconds"] == 600


def test_a_policy_set_by_a_program_is_logged_without_an_operator(any_store):
    s = any_store.store
    s.set_credential_version("acct", "v9")
    assert _changes(s) == [("credentials", "acct", "v9", None)]


@pytest.mark.parametrize(
    "change",
    [
        lambda s: s.set_kill_switch("global", True, operator="  "),
        lambda s: s.set_rate_limit("acct", 1, operator=""),
        lambda s: s.set_text_window(60, operator=" "),
        lambda s: s.set_text_window(0, operator="ann"),
        lambda s: s.set_signing_required("acct", True, operator=""),
    ],
    ids=["kill-switch", "rate-limit", "text-window", "text-window-zero", "signing"],
)
def test_a_policy_change_with_a_blank_operator_or_bad_value_changes_and_logs_nothing(any_store, change):
    s = any_store.store
    before = s.policies()
    with pytest.raises(IntakeError):
        change(s)
    assert s.policies() == before and s.policy_changes() == []


def test_an_operators_retry_names_the_operator_in_the_history_row(any_store):
    s = any_store.store
    it, _ = to_state(s, "failed")
    with pytest.raises(IntakeError):
        s.retry(it.key, operator=" ")
    assert s.retry(it.key, operator="ann").state == "pending"
    last = s.history(it.key)[-1]
    assert (last.event, last.actor, last.detail.get("operator")) == ("retry", "operator:ann", "ann")


def _authorize(store, target):
    it = store.submit("acct", "post", target, {"text": "the same text"})
    lease = store.begin(it.key)
    return lambda: store.authorize_dispatch(lease, request_digest=it.request_digest)


def test_a_shorter_stored_window_lets_the_same_text_through_sooner(any_store):
    s = any_store.store
    s.set_text_window(60, operator="ann")
    _authorize(s, "room-1")()
    any_store.advance(30)
    with pytest.raises(GuardRefused) as e:
        _authorize(s, "room-2")()
    assert e.value.guard == "text_window_clear"
    any_store.advance(31)  # 61 s: past the stored window, well inside the 24 h default
    assert _authorize(s, "room-3")().state == "authorized"


def test_a_longer_stored_window_refuses_what_the_default_allows(any_store):
    s = any_store.store
    s.set_text_window(2 * 86_400, operator="ann")
    _authorize(s, "room-1")()
    any_store.advance(86_401)  # past the default window
    with pytest.raises(GuardRefused) as e:
        _authorize(s, "room-2")()
    assert e.value.guard == "text_window_clear"
    any_store.advance(86_400)
    assert _authorize(s, "room-3")().state == "authorized"


def test_the_constructor_window_is_the_default_until_one_is_stored(sqlite_databases):
    from atmostonce.model import MemoryStore
    from atmostonce_sql import open_store

    url = sqlite_databases.fresh()
    for s in (MemoryStore(text_window_seconds=120), open_store(url, migrate=False, text_window_seconds=120)):
        assert s.policies()["text_window_seconds"] == 120
        s.set_text_window(30, operator="ann")
        assert s.policies()["text_window_seconds"] == 30 == s.text_window_seconds
        s.close()


@pytest.mark.parametrize(
    "statement", ["UPDATE aom_policy_changes SET operator = 'mallory'", "DELETE FROM aom_policy_changes"]
)
def test_the_policy_log_is_append_only(sql_store, statement):
    sql_store.set_kill_switch("global", True, operator="ann")
    with pytest.raises(AppendOnlyViolation):
        with sql_store._tx() as conn:
            conn.exec_driver_sql(statement)
    with sql_store.engine.connect() as conn:
        rows = conn.execute(sa.text("SELECT operator FROM aom_policy_changes")).scalars().all()
    assert rows == ["ann"]
