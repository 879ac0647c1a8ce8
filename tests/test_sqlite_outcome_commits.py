"""SQLite: only an outcome's transaction commits without syncing the WAL (docs/design.md#two-durable-points-per-send).

The authorization before the bytes commits under ``synchronous = FULL``: the WAL is on the disk before any
byte leaves. The outcome's transaction commits under ``NORMAL`` (no sync), and the next ``FULL`` commit syncs
it with its own, since the WAL is one file written in order. A power loss in between loses the outcome and
nothing before it; the intent is then still in flight under its lease, which expires into an unknown send
that the reconciler settles by looking, never by sending again. The tests read what each transaction ran
under from SQLite's own statement trace, and stand in for the power loss by keeping only the files as they
were when the authorization's sync returned (what a disk keeps when nothing later was synced)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
import sqlalchemy as sa

from atmostonce import Rejected
from atmostonce.names import EVENT, STATE
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.transport import Found
from atmostonce_sql import open_store
from atmostonce_sql.testing import age_leases
from tests.helpers import submit
from tests.test_fused_dispatch import Platform

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)


class Trace:
    """Every statement each pooled SQLite connection of a store runs, as SQLite expands it."""

    def __init__(self, store):
        self.lines: list[tuple[int, str]] = []
        sa.event.listen(store.engine, "checkout", self._watch)

    def levels(self) -> set[str]:
        """The ``synchronous`` level each connection was last set to."""
        last = {}
        for conn, sql in self.lines:
            if sql.strip().upper().startswith("PRAGMA SYNCHRONOUS"):
                last[conn] = sql.strip().upper().split("=")[1].strip()
        return set(last.values())

    def _watch(self, dbapi_conn, _record, _proxy) -> None:
        conn = id(dbapi_conn)
        dbapi_conn.set_trace_callback(lambda sql: self.lines.append((conn, sql)))

    def transactions(self) -> list[tuple[str, list[str]]]:
        """Each committed or rolled-back transaction: the ``synchronous`` level it ended under (``FULL`` as the
        store opens its connections) and its statements, the last being ``COMMIT`` or ``ROLLBACK``."""
        level: dict[int, str] = {}
        open_tx: dict[int, list[str]] = {}
        out: list[tuple[str, list[str]]] = []
        for conn, sql in self.lines:
            upper = sql.strip().upper()
            if upper.startswith("PRAGMA SYNCHRONOUS"):
                level[conn] = upper.split("=")[1].strip()
            elif upper.startswith("BEGIN"):
                open_tx[conn] = []
            elif upper in ("COMMIT", "ROLLBACK") and conn in open_tx:
                out.append((level.get(conn, "FULL"), [*open_tx.pop(conn), upper]))
            elif conn in open_tx:
                open_tx[conn].append(sql)
        return out


def _writing(transactions, event: str) -> list[str]:
    """The levels of the transactions that wrote a history row of ``event``."""
    return [lvl for lvl, stmts in transactions if any(f"'{event}'" in s and "INSERT" in s.upper() for s in stmts)]


def test_on_sqlite_the_authorization_syncs_and_only_the_outcome_commits_without_a_sync(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/o.sqlite3")
    trace = Trace(store)
    try:
        platform = Platform()
        d = Dispatcher(store, platform, CONFIG)
        _, outcome = d.publish("acct", "post", "room-1", {"text": "synced before the bytes"})
        assert outcome == "read_back.match"
        tx = trace.transactions()
        assert _writing(tx, EVENT.authorize_dispatch) == ["FULL"]
        assert _writing(tx, EVENT.confirm_read_back) == ["NORMAL"]
        # every connection is FULL again once the outcome committed: the next authorization syncs
        assert trace.levels() == {"FULL"}
    finally:
        store.close()


def test_on_sqlite_a_store_told_to_keep_outcomes_durable_syncs_every_commit(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/d.sqlite3", async_outcomes=False)
    trace = Trace(store)
    try:
        _, outcome = Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "x"})
        assert outcome == "read_back.match"
        assert {lvl for lvl, _ in trace.transactions()} == {"FULL"}
    finally:
        store.close()


def test_on_sqlite_a_refused_outcome_leaves_its_connection_syncing_again(tmp_path):
    """An outcome refused by its guard (the send's lease expired and the sweeper made it unknown) rolls back
    under ``NORMAL``, and its connection is set back to ``FULL`` all the same."""
    store = open_store(f"sqlite:///{tmp_path}/r.sqlite3")
    trace = Trace(store)
    try:
        it = submit(store)
        lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
        age_leases(store, 60)
        assert Sweeper(store, CONFIG).sweep_leases()["expired"] == 1
        with pytest.raises(Rejected):
            store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
        refused = [lvl for lvl, stmts in trace.transactions() if stmts[-1] == "ROLLBACK"]
        assert refused == ["NORMAL"]  # the outcome's transaction, refused and rolled back
        assert trace.levels() == {"FULL"}
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar_one() == 2  # FULL
    finally:
        store.close()


def test_on_sqlite_a_connection_that_cannot_be_set_back_to_full_is_never_reused(tmp_path):
    store = open_store(f"sqlite:///{tmp_path}/i.sqlite3")
    try:
        from atmostonce_sql.execution import Executor

        with store.engine.connect() as conn:
            dbapi = conn.connection.dbapi_connection
            with pytest.raises(sqlite3.ProgrammingError), Executor._sqlite_lowered(conn):
                dbapi.close()  # the reset after the transaction cannot run on it
                raise sqlite3.ProgrammingError("closed")
            assert conn.invalidated
    finally:
        store.close()


def _files(path: Path) -> list[Path]:
    return [p for p in (path, Path(f"{path}-wal")) if p.exists()]


def test_an_sqlite_outcome_lost_to_a_power_loss_is_settled_by_looking_and_never_resent(tmp_path):
    """The files as they were when the authorization's sync returned are what a disk keeps if nothing later
    was synced. Opened from them, the intent is where the authorization left it; its lease expires into an
    unknown send, and the reconciler finds the object: published, one object on the platform."""
    db = tmp_path / "live.sqlite3"
    crashed = tmp_path / "crashed"
    crashed.mkdir()
    store = open_store(f"sqlite:///{db}")
    try:

        class Kept(Platform):
            keys: dict[str, str] = {}

            def send(self, wire):
                for f in _files(db):  # the authorization committed (FULL): the disk has all of this
                    shutil.copyfile(f, crashed / f.name)
                sent = super().send(wire)
                self.keys[wire.delivery_key] = sent.remote_id
                return sent

            def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
                rid = self.keys.get(delivery_key)
                return super().lookup(delivery_key) if rid is None else Found(rid, self.objects[rid])

        platform = Kept()
        key, outcome = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "lost outcome"})
        assert outcome == "read_back.match"
        assert store.get(key).state == STATE.published
    finally:
        store.close()

    after = open_store(f"sqlite:///{crashed / db.name}", migrate=False)
    try:
        assert after.get(key).state == STATE.authorized
        assert [h.event for h in after.history(key)][-1] == EVENT.authorize_dispatch
        age_leases(after, 60)
        Sweeper(after, CONFIG).tick()
        assert after.get(key).state == STATE.indeterminate
        Reconciler(after, platform, CONFIG).run()
        assert after.get(key).state == STATE.published
        assert platform.sends == 1  # found by looking, never sent again
    finally:
        after.close()


def test_the_async_sqlite_store_lowers_only_its_outcome_s_commit_and_sets_full_again(tmp_path, monkeypatch):
    """The async store's driver layer takes the same transactions: its outcome commits under ``NORMAL`` (1)
    and its connection reads ``FULL`` (2) again afterwards, still in the pool."""
    import asyncio
    import contextlib

    from atmostonce_sql.aio import open_async_store
    from atmostonce_sql.execution import Executor

    lowered = Executor._sqlite_lowered
    seen: list[tuple[int, int, bool]] = []

    def level(raw) -> int:
        cur = raw.cursor()
        cur.execute("PRAGMA synchronous")
        (value,) = cur.fetchone()
        cur.close()
        return value

    @contextlib.contextmanager
    def watched(conn):
        raw = conn.connection.dbapi_connection
        with lowered(conn):
            during = level(raw)
            yield
        seen.append((during, level(raw), conn.invalidated))

    monkeypatch.setattr(Executor, "_sqlite_lowered", staticmethod(watched))

    async def scenario():
        store = await open_async_store(f"sqlite:///{tmp_path}/a.sqlite3")
        try:
            it = await store.submit("acct", "post", "room-1", {"text": "async"})
            lease, _ = await store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
            assert seen == []  # the authorization is not lowered
            await store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
            return (await store.get(it.key)).state
        finally:
            await store.close()

    assert asyncio.run(scenario()) == STATE.published
    assert seen == [(1, 2, False)]


def test_on_sqlite_without_a_wal_journal_every_commit_syncs(tmp_path, monkeypatch):
    """Where the journal does not take WAL (``PRAGMA journal_mode=WAL`` answers with the mode it kept, as on a
    file system without shared memory), ``NORMAL`` could cost the file itself on a power loss: the outcome's
    commit syncs like every other."""
    import atmostonce_sql

    pragmas = tuple("journal_mode=DELETE" if p.startswith("journal_mode") else p for p in atmostonce_sql.SQLITE_PRAGMAS)
    monkeypatch.setattr(atmostonce_sql, "SQLITE_PRAGMAS", pragmas)
    store = open_store(f"sqlite:///{tmp_path}/j.sqlite3")
    trace = Trace(store)
    try:
        _, outcome = Dispatcher(store, Platform(), CONFIG).publish(
            "acct", "post", "room-1", {"text": "rollback journal"}
        )
        assert outcome == "read_back.match"
        with store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar_one() == "delete"
        assert {lvl for lvl, _ in trace.transactions()} == {"FULL"}
        assert _writing(trace.transactions(), EVENT.confirm_read_back) == ["FULL"]
    finally:
        store.close()


def test_a_connection_left_lowered_is_set_back_at_checkout_or_dropped_and_an_interrupt_there_keeps_its_mark():
    """The checkout's backstop for a connection an interrupted outcome left at ``NORMAL``: set back to ``FULL``
    and unmarked; a failure drops it (the pool connects afresh); an interrupt is raised as it is, not taken
    for a broken connection, and the mark stays for the next checkout."""
    from types import SimpleNamespace

    from atmostonce_sql.execution import SQLITE_LOWERED, sqlite_checkout

    class Conn:
        def __init__(self, fails=None):
            self.fails, self.ran = fails, []

        def execute(self, sql):
            if self.fails is not None:
                raise self.fails
            self.ran.append(sql)

    record = SimpleNamespace(info={SQLITE_LOWERED: True})
    ok = Conn()
    sqlite_checkout(ok, record, None)
    assert ok.ran == ["PRAGMA synchronous = FULL"] and SQLITE_LOWERED not in record.info

    record.info[SQLITE_LOWERED] = True
    with pytest.raises(sa.exc.DisconnectionError):
        sqlite_checkout(Conn(sqlite3.OperationalError("disk I/O error")), record, None)
    with pytest.raises(KeyboardInterrupt):
        sqlite_checkout(Conn(KeyboardInterrupt()), record, None)
    assert record.info[SQLITE_LOWERED] is True

    unmarked = Conn()
    sqlite_checkout(unmarked, SimpleNamespace(info={}), None)
    assert unmarked.ran == []
