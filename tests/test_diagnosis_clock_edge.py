"""A refused conditional write is diagnosed by a second statement with its own reading of the database clock
(docs/design.md#the-gate-is-the-conditional-write). When a guard judged on that clock crosses its edge between
the two, the store tries the write once more instead of reporting a race: the duplicate-text window that
refused the write and had cleared by the diagnosis lets the second write authorize."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

import atmostonce_sql
from atmostonce import Rejected
from atmostonce.errors import LOST_RACE

T0 = 1_000_000.0
WINDOW = 86_400  # the table's duplicate-text window (test_policy_gate.py's edges)


class _Clock:
    """A database clock the test moves while a move's transaction is open."""

    def __init__(self, t: float):
        self.t = t


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def moving_clock_store(request, monkeypatch):
    """``(store, clock_setter)``: a store whose database clock the test can move between two statements of
    one move. SQLite: a SQL function reading a Python value (the move's transaction holds the write lock, so
    no other connection could write a clock row). PostgreSQL: the set-clock table, written by another
    connection, which the move's read-committed statements then read."""
    if request.param == "postgresql":
        from atmostonce_sql.testing import SetClockStore

        base = request.getfixturevalue("pg_store")
        store = SetClockStore(base.engine, start=T0)
        yield store, store.set_clock
        store.close()
        return
    clock = _Clock(T0)
    register = atmostonce_sql.register_sqlite_functions

    def with_clock(dbapi_conn):
        register(dbapi_conn)
        dbapi_conn.create_function("aom_test_now", 0, lambda: clock.t)

    monkeypatch.setattr(atmostonce_sql, "register_sqlite_functions", with_clock)
    dbs = request.getfixturevalue("sqlite_databases")
    url = dbs.fresh()
    store = atmostonce_sql.open_store(url, migrate=False, pool_size=4)
    store._now = sa.literal_column("aom_test_now()", sa.Float(53))

    def set_clock(t: float) -> None:
        clock.t = t

    yield store, set_clock
    store.close()
    dbs.drop(url)


def _pending(store, target):
    it = store.submit("acct", "post", target, {"text": "same text"})
    return it, store.begin(it.key)


def test_a_window_clearing_between_the_refused_write_and_its_diagnosis_authorizes(moving_clock_store, monkeypatch):
    store, set_clock = moving_clock_store
    first, lease = _pending(store, "room-1")
    store.authorize_dispatch(lease, request_digest=first.request_digest)
    set_clock(T0 + WINDOW - 0.5)  # the write is judged inside the window (and the new lease is live)
    second, lease2 = _pending(store, "room-2")
    diagnose = type(store)._diagnose
    diagnosed = []

    def clock_crosses_the_edge_first(self, *a, **kw):
        if not diagnosed:
            set_clock(T0 + WINDOW + 0.5)
        diagnosed.append(a[1].name)
        return diagnose(self, *a, **kw)

    monkeypatch.setattr(type(store), "_diagnose", clock_crosses_the_edge_first)
    moved = store.authorize_dispatch(lease2, request_digest=second.request_digest)
    assert moved.state == "authorized"
    assert diagnosed == ["authorize_dispatch"]  # the second write moved the row: nothing left to diagnose
    assert [h.event for h in store.history(second.key)][-1] == "authorize_dispatch"


def test_a_window_still_closed_is_named_after_the_second_write(moving_clock_store):
    store, set_clock = moving_clock_store
    first, lease = _pending(store, "room-1")
    store.authorize_dispatch(lease, request_digest=first.request_digest)
    set_clock(T0 + WINDOW - 0.5)
    second, lease2 = _pending(store, "room-2")
    with pytest.raises(Rejected) as e:
        store.authorize_dispatch(lease2, request_digest=second.request_digest)
    assert (e.value.guard, e.value.state) == ("text_window_clear", "pending")


def test_a_race_that_persists_is_raised_after_one_more_write_and_moves_nothing(moving_clock_store, monkeypatch):
    store, _ = moving_clock_store
    it, lease = _pending(store, "room-1")
    stale = lease.__class__(**{**lease.__dict__, "attempt_token": "0" * 32})  # refused by its lease guard
    tried = []

    def never_named(self, conn, ev, key, params, coupled=False):
        tried.append(ev.name)
        return Rejected(ev.name, key, LOST_RACE, "pending")

    monkeypatch.setattr(type(store), "_diagnose", never_named)
    with pytest.raises(Rejected) as e:
        store.authorize_dispatch(stale, request_digest=it.request_digest)
    assert e.value.guard == LOST_RACE
    assert tried == ["authorize_dispatch", "authorize_dispatch"]
    assert store.get(it.key).state == "pending"
