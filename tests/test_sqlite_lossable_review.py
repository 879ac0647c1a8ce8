"""Review of the SQLite outcome commits under ``synchronous = NORMAL`` (docs/design.md#two-durable-points-per-send).

The claim under test: only a transaction made of the table's outcome moves commits under ``NORMAL``; the
authorization before the bytes, and every other move, commits under ``FULL`` (its WAL frames synced before the
commit returns), and no connection is handed out of the pool while it is still lowered. SQLite's own statement
trace on every pooled connection shows each ``PRAGMA synchronous = ...``, ``BEGIN``, the moves' history rows and
``COMMIT``/``ROLLBACK`` in order, so the level each transaction committed under is read from what SQLite ran.

The first tests interrupt an outcome's transaction at its lowering and at its setting back (an asyncio
cancellation, a SIGINT) and then look at the next authorization. They found that a connection could go back to
the pool still lowered (the lowering sat outside its guard, and the setting back caught only ``Exception``);
the connection is now marked before it is lowered, set back or dropped at the next checkout, and invalidated
on any failure to set it back."""

from __future__ import annotations

import _thread
import asyncio
import re
import signal
import sqlite3
from dataclasses import dataclass
from typing import Any

import pytest
import sqlalchemy as sa

from atmostonce import Rejected
from atmostonce.errors import StoreError
from atmostonce.names import EVENT, STATE
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.table import table
from atmostonce_sql import open_store
from atmostonce_sql.testing import age_leases
from tests.helpers import begin_authorize, submit
from tests.test_fused_dispatch import Platform
from tests.test_sqlite_durability import OPEN_WAL, SYNC, WRITE, strace_child

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)
OUTCOMES = frozenset(table().outcome_events)
FULL, NORMAL = 2, 1
_LEVELS = {"NORMAL": NORMAL, "FULL": FULL}
_EVENT = re.compile(r"'(\w+)' AS event")


@dataclass(frozen=True)
class Tx:
    """One transaction as SQLite ran it: the ``synchronous`` level its connection was at when it ended, how it
    ended (``COMMIT`` or ``ROLLBACK``) and the events of the intent history rows it wrote."""

    level: int
    end: str
    events: frozenset[str]


class Statements:
    """Every statement each pooled connection of a store runs, as SQLite traces it (sync store: sqlite3's trace
    callback set at each checkout; async store: the same callback set through aiosqlite, once per connection)."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, str]] = []
        self.hooks: list[Any] = []
        self._kept: list[Any] = []  # each traced connection stays alive, so no other one is given its id

    def callback(self, conn_id: int, raw: Any) -> Any:
        self._kept.append(raw)

        def traced(sql: str) -> None:
            self.lines.append((conn_id, sql))
            for hook in self.hooks:
                hook(raw, sql)

        return traced

    def watch_sync(self, engine: sa.Engine) -> Statements:
        def checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
            dbapi_conn.set_trace_callback(self.callback(id(dbapi_conn), dbapi_conn))

        sa.event.listen(engine, "checkout", checkout)
        return self

    def watch_async(self, engine: sa.Engine) -> Statements:
        from sqlalchemy.util import await_only

        def checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
            if not record.info.get("review_traced"):
                record.info["review_traced"] = True
                await_only(dbapi_conn._connection.set_trace_callback(self.callback(id(dbapi_conn), dbapi_conn)))

        sa.event.listen(engine, "checkout", checkout)
        return self

    def transactions(self) -> list[Tx]:
        level: dict[int, int] = {}
        open_tx: dict[int, set[str]] = {}
        out: list[Tx] = []
        for conn, sql in list(self.lines):
            upper = sql.strip().upper()
            if upper.startswith("PRAGMA SYNCHRONOUS") and "=" in upper:
                level[conn] = _LEVELS[upper.split("=")[1].strip()]
            elif upper.startswith("BEGIN"):
                open_tx[conn] = set()
            elif upper in ("COMMIT", "ROLLBACK") and conn in open_tx:
                out.append(Tx(level.get(conn, FULL), upper, frozenset(open_tx.pop(conn))))
            elif conn in open_tx and upper.startswith("INSERT INTO AOM_HISTORY"):
                open_tx[conn].update(_EVENT.findall(sql))
        return out


def committed_levels(txs: list[Tx], event: str) -> list[int]:
    """The level of each committed transaction that wrote a history row of ``event``."""
    return [t.level for t in txs if t.end == "COMMIT" and event in t.events]


def lowered_commits_of_other_moves(txs: list[Tx]) -> list[Tx]:
    """Committed transactions that were not made of outcome moves alone but ran under ``NORMAL``."""
    return [t for t in txs if t.end == "COMMIT" and t.level != FULL and (not t.events or t.events - OUTCOMES)]


def pooled_levels(engine: sa.Engine) -> list[int]:
    """``PRAGMA synchronous`` of every connection the pool holds (read on the driver: no ``BEGIN``)."""
    raws = [engine.raw_connection() for _ in range(engine.pool.checkedin())]
    try:
        out = []
        for raw in raws:
            cur = raw.cursor()
            cur.execute("PRAGMA synchronous")
            out.append(cur.fetchone()[0])
            cur.close()
        return out
    finally:
        for raw in raws:
            raw.close()


# ------------------------------------------------------------------------------------------------------------
# Defects: an outcome interrupted at the lowering leaves its connection at NORMAL in the pool
# ------------------------------------------------------------------------------------------------------------


def test_an_async_outcome_cancelled_at_its_lowering_leaves_no_authorization_committing_without_a_sync(tmp_path):
    """The task recording an outcome is cancelled (a timeout, a shutdown) while ``PRAGMA synchronous = NORMAL``
    runs: aiosqlite's thread applies it, the task gets ``CancelledError`` before ``_sqlite_lowered`` entered its
    ``try``, nothing sets ``FULL`` back, and the connection returns to the pool lowered. The next submit and
    authorization on it commit under ``NORMAL``: the authorization is in the page cache when the bytes leave.
    Since then an operation of the native async store runs to its end when its caller is cancelled: the task
    gets ``CancelledError``, the outcome is recorded whole, and the connection is given back at ``FULL``."""
    from atmostonce_sql.aio import open_async_store

    async def scenario() -> tuple[list[Tx], list[int], str, str]:
        store = await open_async_store(f"sqlite:///{tmp_path}/c.sqlite3")
        loop = asyncio.get_running_loop()
        log = Statements().watch_async(store.sync.engine)
        target: dict[str, asyncio.Future[Any]] = {}

        def cancel_at_lowering(_raw: Any, sql: str) -> None:
            if sql == "PRAGMA synchronous = NORMAL" and "task" in target:
                loop.call_soon_threadsafe(target.pop("task").cancel)

        log.hooks.append(cancel_at_lowering)
        try:
            it = await store.submit("acct", "post", "room-1", {"text": "first"})
            lease, _ = await store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
            task = asyncio.ensure_future(store.record_sent(lease, remote_id="r-1", read_back="read_back.match"))
            target["task"] = task
            with pytest.raises(asyncio.CancelledError):
                await task
            first_state = (await store.get(it.key)).state
            later = await store.submit("acct", "post", "room-2", {"text": "second"})
            await store.begin_and_authorize(later.key, request_digest=later.request_digest, send_lease_seconds=10)
            levels = await store.call(pooled_levels, store.sync.engine)
            return log.transactions(), levels, first_state, (await store.get(later.key)).state
        finally:
            await store.aclose()

    txs, levels, first_state, later_state = asyncio.run(scenario())
    assert (first_state, later_state) == (STATE.published, STATE.authorized)
    # both authorizations (the first, and the one after the cancelled outcome) wait for the disk
    assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL, FULL]
    assert lowered_commits_of_other_moves(txs) == []
    assert levels and set(levels) == {FULL}


def test_a_sigint_during_the_lowering_pragma_leaves_no_authorization_committing_without_a_sync(tmp_path):
    """A SIGINT that arrives while ``PRAGMA synchronous = NORMAL`` runs (here raised from SQLite's progress
    handler during that statement, as a signal from outside would be caught) is raised by the interpreter
    when the call returns, before ``_sqlite_lowered``'s ``try``: the connection goes back to the pool at
    ``NORMAL``, not invalidated, and the next authorization taken from the pool commits without a sync. A
    program that catches ``KeyboardInterrupt`` and keeps publishing (a REPL, a worker that shuts down
    gracefully) then sends bytes whose authorization is not on the disk."""
    store = open_store(f"sqlite:///{tmp_path}/i.sqlite3")
    log = Statements().watch_sync(store.engine)
    armed: dict[str, Any] = {}

    def checkout(dbapi_conn: Any, _record: Any, _proxy: Any) -> None:
        if armed.pop("on", False):  # the next statement on this connection is the outcome's lowering
            armed["raw"] = dbapi_conn
            dbapi_conn.set_progress_handler(_thread.interrupt_main, 1)  # a SIGINT while SQLite runs it

    def disarm(raw: Any, sql: str) -> None:
        if armed.get("raw") is raw and sql != "PRAGMA synchronous = NORMAL":
            raw.set_progress_handler(None, 0)  # one statement only
            armed.pop("raw")

    sa.event.listen(store.engine, "checkout", checkout)
    log.hooks.append(disarm)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        it = submit(store, text="first")
        lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
        armed["on"] = True
        with pytest.raises(KeyboardInterrupt):
            store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
        raw = armed.pop("raw", None)
        if raw is not None:
            try:
                raw.set_progress_handler(None, 0)
            except sqlite3.ProgrammingError:
                pass  # invalidated and closed: what the fix would do
        signal.signal(signal.SIGINT, previous)
        sa.event.remove(store.engine, "checkout", checkout)
        assert store.get(it.key).state == STATE.authorized
        later = submit(store, text="second", target="room-2")
        store.begin_and_authorize(later.key, request_digest=later.request_digest, send_lease_seconds=10)
        txs = log.transactions()
        assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL, FULL]
        assert lowered_commits_of_other_moves(txs) == []
        assert set(pooled_levels(store.engine)) == {FULL}
    finally:
        signal.signal(signal.SIGINT, previous)
        store.close()


def test_an_async_outcome_cancelled_while_its_connection_is_set_back_is_never_reused_lowered(tmp_path, monkeypatch):
    """The outcome committed; the task is cancelled while ``_sqlite_lowered`` sets ``FULL`` back (the cursor
    for that ``PRAGMA`` is being opened on aiosqlite's thread). ``CancelledError`` is a ``BaseException``: the
    ``except Exception`` around the reset does not invalidate the connection, the ``PRAGMA synchronous = FULL``
    never ran, and the pool hands the lowered connection to the next authorization. The docstring's promise
    ("a connection that cannot be set back is invalidated") holds only for ``Exception``."""
    from sqlalchemy.dialects.sqlite.aiosqlite import AsyncAdapt_aiosqlite_connection

    from atmostonce_sql.aio import open_async_store

    state: dict[str, bool] = {"armed": False, "committed": False}
    original = AsyncAdapt_aiosqlite_connection.cursor

    def cursor(self: Any, server_side: bool = False) -> Any:
        if state["committed"]:  # the first cursor after the outcome's COMMIT: the reset's
            state["committed"] = False
            task = asyncio.current_task()
            assert task is not None
            task.cancel()  # delivered at the cursor's await, before the PRAGMA is queued
        return original(self, server_side)

    monkeypatch.setattr(AsyncAdapt_aiosqlite_connection, "cursor", cursor)

    def on_commit(_raw: Any, sql: str) -> None:
        if state["armed"] and sql.strip().upper() == "COMMIT":
            state["armed"], state["committed"] = False, True

    async def scenario() -> tuple[list[Tx], list[int], str]:
        store = await open_async_store(f"sqlite:///{tmp_path}/r.sqlite3")
        log = Statements().watch_async(store.sync.engine)
        log.hooks.append(on_commit)
        try:
            it = await store.submit("acct", "post", "room-1", {"text": "first"})
            lease, _ = await store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
            state["armed"] = True
            with pytest.raises(asyncio.CancelledError):
                await asyncio.ensure_future(store.record_sent(lease, remote_id="r-1", read_back="read_back.match"))
            first_state = (await store.get(it.key)).state
            later = await store.submit("acct", "post", "room-2", {"text": "second"})
            await store.begin_and_authorize(later.key, request_digest=later.request_digest, send_lease_seconds=10)
            return log.transactions(), await store.call(pooled_levels, store.sync.engine), first_state
        finally:
            await store.aclose()

    txs, levels, first_state = asyncio.run(scenario())
    assert first_state == STATE.published  # the outcome itself committed before the cancellation
    assert committed_levels(txs, EVENT.confirm_read_back) == [NORMAL]
    assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL, FULL]
    assert lowered_commits_of_other_moves(txs) == []
    assert levels and set(levels) == {FULL}


CHILD_CANCELLED = r"""
import asyncio, os, sys
import sqlalchemy as sa
from sqlalchemy.util import await_only
from atmostonce_sql.aio import open_async_store

db, marker = sys.argv[1:3]

async def main():
    store = await open_async_store("sqlite:///" + db)
    loop = asyncio.get_running_loop()
    target = {}

    @sa.event.listens_for(store.sync.engine, "checkout")
    def watch(dbapi_conn, record, _proxy):
        if record.info.get("traced"):
            return
        record.info["traced"] = True

        def traced(sql):
            if sql == "PRAGMA synchronous = NORMAL" and "task" in target:
                loop.call_soon_threadsafe(target.pop("task").cancel)

        await_only(dbapi_conn._connection.set_trace_callback(traced))

    it = await store.submit("acct", "post", "room-1", {"text": "first"})
    lease, _ = await store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
    task = asyncio.ensure_future(store.record_sent(lease, remote_id="r-1", read_back="read_back.match"))
    target["task"] = task
    try:
        await task
        print("not cancelled")
    except asyncio.CancelledError:
        print("cancelled")
    later = await store.submit("acct", "post", "room-2", {"text": "second"})
    os.path.exists(marker + "_AUTHORIZE")  # the second authorization starts
    await store.begin_and_authorize(later.key, request_digest=later.request_digest, send_lease_seconds=10)
    os.path.exists(marker + "_SEND")  # the bytes of the second send would leave here
    await store.aclose()

asyncio.run(main())
"""


def test_after_a_cancelled_async_outcome_the_next_authorization_is_synced_before_its_send(tmp_path):
    """The system calls of the cancellation above, under ``strace``: the second authorization's WAL frames
    must be synced (``fsync``/``fdatasync`` of the WAL) before the send. On the lowered connection they are
    written and not synced: a power loss at the send loses an authorization whose bytes the platform took."""
    lines, out = strace_child(tmp_path, CHILD_CANCELLED, marker="MARK")
    assert out.split() == ["cancelled"]
    start = next(i for i, line in enumerate(lines) if "MARK_AUTHORIZE" in line)
    send = next(i for i, line in enumerate(lines) if "MARK_SEND" in line)
    wal_fds = {m.group(1) for line in lines if (m := OPEN_WAL.search(line))}
    writes = [i for i in range(start, send) if (m := WRITE.match(lines[i])) and m.group(3) in wal_fds]
    syncs = [i for i in range(start, send) if (m := SYNC.match(lines[i])) and m.group(3) in wal_fds]
    assert writes, "the second authorization wrote no WAL frame before the send"
    assert {"synced_after_last_write": bool(syncs) and syncs[-1] > writes[-1]} == {"synced_after_last_write": True}


# ------------------------------------------------------------------------------------------------------------
# Attacks that held: every other move commits under FULL, and the pool never keeps a lowered connection
# ------------------------------------------------------------------------------------------------------------


def test_every_move_but_an_outcome_commits_under_full_across_a_whole_lifecycle(tmp_path):
    """Publish (created and authorized in one transaction), step-by-step begin and authorization, each outcome,
    retry, the sweeper's batches (expire and abandon), the reconciler's batch, operator moves, a policy
    gate, an approval-gated intent whose moves carry its claim's: each transaction that wrote a
    history row of any move that is not an outcome committed under ``FULL``; every ``NORMAL`` commit wrote
    outcome rows only; every pooled connection is ``FULL`` at the end."""
    store = open_store(f"sqlite:///{tmp_path}/l.sqlite3")
    log = Statements().watch_sync(store.engine)
    try:
        ok, refused, unknown = Platform(), Platform(answer="not_sent"), Platform(answer="unknown")
        Dispatcher(store, ok, CONFIG).publish("acct", "post", "room-1", {"text": "published"})
        key_failed, _ = Dispatcher(store, refused, CONFIG).publish("acct", "post", "room-2", {"text": "not sent"})
        assert store.get(key_failed).state == STATE.failed
        key_unknown, _ = Dispatcher(store, unknown, CONFIG).publish("acct", "post", "room-3", {"text": "unknown"})

        # step by step: begin, authorize, record_success, read_back_failed
        a = submit(store, text="read back fails", target="room-4")
        la = begin_authorize(store, a.key)
        store.record_success(la, remote_id="r-a")
        store.read_back_failed(la, reason="edited", evidence={"diff": "x"})

        # not sent, then retried and published
        b = submit(store, text="retried", target="room-5")
        lb = begin_authorize(store, b.key)
        store.record_not_sent(lb, reason="connect refused")
        store.retry(b.key)
        lb2 = begin_authorize(store, b.key)
        store.record_sent(lb2, remote_id="r-b", read_back="read_back.match")

        # the sweeper: an authorized send whose lease ran out, and a begun attempt never authorized
        c = submit(store, text="expires", target="room-6")
        begin_authorize(store, c.key)
        d = submit(store, text="abandoned", target="room-7")
        store.begin(d.key, lease_seconds=30)
        age_leases(store, 60)
        Sweeper(store, CONFIG).tick()
        assert store.get(c.key).state == STATE.indeterminate
        # the reconciler looks (nothing found) for the unknown sends
        Reconciler(store, Platform(), CONFIG).run()

        # operator moves
        store.park(key_unknown, operator="ops", reason="look by hand")
        store.resolve_not_sent(key_unknown, operator="ops")
        e = submit(store, text="parked then resent", target="room-8")
        store.park(e.key, operator="ops")
        store.resend(e.key, operator="ops")

        # a policy gate refuses at publish time: the begun attempt is parked at the gate
        f = submit(store, text="gated", target="room-9")
        store.block_at_gate(store.begin(f.key, lease_seconds=30), reason="policy")

        # an approval-gated intent: its authorization takes the claim, its outcome settles it (coupled moves)
        g = store.submit("acct", "post", "room-10", {"text": "approved"}, requires_approval=True)
        apv = store.approve(g.key, approver="alice", expires_in=600)
        claim = store.reserve_claim(g.key, approval_id=apv.approval_id, request_digest=g.request_digest, owner="w1")
        lg = store.begin(g.key, lease_seconds=30)
        store.authorize_dispatch(lg, request_digest=g.request_digest, claim=claim)
        store.record_sent(lg, remote_id="r-g", read_back="read_back.match")
        assert store.get(g.key).state == STATE.published

        txs = log.transactions()
        seen = set().union(*(t.events for t in txs if t.end == "COMMIT"))
        assert {
            EVENT.submit, EVENT.begin, EVENT.authorize_dispatch, EVENT.retry, EVENT.expire_lease,
            EVENT.abandon_attempt, EVENT.park, EVENT.resolve_not_sent, EVENT.resend, EVENT.block_at_gate,
            EVENT.record_success, EVENT.confirm_read_back, EVENT.read_back_failed, EVENT.record_not_sent,
            EVENT.record_unknown,
        } <= seen  # fmt: skip
        assert seen & {EVENT.reconcile_not_found, EVENT.reconcile_unproven, EVENT.park_unreconcilable}
        assert lowered_commits_of_other_moves(txs) == []
        lowered = [t for t in txs if t.end == "COMMIT" and t.level == NORMAL]
        assert lowered and all(t.events and t.events <= OUTCOMES for t in lowered)
        assert {
            lvl for e in (EVENT.authorize_dispatch, EVENT.begin, EVENT.retry) for lvl in committed_levels(txs, e)
        } == {FULL}
        assert set(pooled_levels(store.engine)) == {FULL}
    finally:
        store.close()


def test_concurrent_publishers_sharing_the_pool_never_authorize_on_a_lowered_connection(tmp_path):
    """Four threads publish at once through one store (sent, not sent, unknown answers), so pooled
    connections pass between threads right after an outcome's transaction: every authorization committed
    under ``FULL``, and the pool holds no lowered connection afterwards."""
    import threading

    store = open_store(f"sqlite:///{tmp_path}/t.sqlite3")
    log = Statements().watch_sync(store.engine)
    errors: list[BaseException] = []

    def publisher(n: int) -> None:
        try:
            platform = Platform(answer=("sent", "not_sent", "unknown", "sent")[n])
            d = Dispatcher(store, platform, CONFIG)
            for i in range(6):
                d.publish("acct", "post", f"room-{n}-{i}", {"text": f"thread {n} post {i}"})
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    try:
        threads = [threading.Thread(target=publisher, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        txs = log.transactions()
        assert len(committed_levels(txs, EVENT.authorize_dispatch)) == 24
        assert set(committed_levels(txs, EVENT.authorize_dispatch)) == {FULL}
        assert lowered_commits_of_other_moves(txs) == []
        assert {t.level for t in txs if t.events & {EVENT.record_not_sent, EVENT.record_unknown}} == {NORMAL}
        assert set(pooled_levels(store.engine)) == {FULL}
    finally:
        store.close()


def test_an_outcome_whose_begin_immediate_finds_the_database_locked_sets_its_connection_back(tmp_path):
    """Lock contention: another process holds the write lock, so the outcome's ``BEGIN IMMEDIATE`` fails
    (busy timeout cut to 0 here instead of waiting 30 s). The move fails as a ``StoreError`` and its
    connection is ``FULL`` again before it is pooled; the next authorization waits for the disk."""
    path = tmp_path / "b.sqlite3"
    store = open_store(f"sqlite:///{path}")
    log = Statements().watch_sync(store.engine)
    sa.event.listen(store.engine, "checkout", lambda c, _r, _p: c.execute("PRAGMA busy_timeout = 0"))
    other = sqlite3.connect(path, isolation_level=None)
    try:
        it = submit(store)
        lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreError):
            store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
        assert set(pooled_levels(store.engine)) == {FULL}
        other.execute("ROLLBACK")
        later = submit(store, text="second", target="room-2")
        store.begin_and_authorize(later.key, request_digest=later.request_digest, send_lease_seconds=10)
        txs = log.transactions()
        assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL, FULL]
        assert lowered_commits_of_other_moves(txs) == []
        assert store.get(it.key).state == STATE.authorized
    finally:
        other.close()
        store.close()


def test_an_outcome_whose_commit_fails_never_leaves_a_lowered_connection_in_the_pool(tmp_path):
    """A ``COMMIT`` that fails leaves SQLite's transaction open (a deferred foreign key, checked at commit):
    setting ``FULL`` inside it is refused, so the connection must be invalidated or rolled back and set back,
    never pooled at ``NORMAL``."""
    path = tmp_path / "f.sqlite3"
    store = open_store(f"sqlite:///{path}")
    log = Statements().watch_sync(store.engine)
    setup = sqlite3.connect(path)
    setup.executescript(
        "CREATE TABLE review_parent (id INTEGER PRIMARY KEY);"
        "CREATE TABLE review_child (pid INTEGER REFERENCES review_parent (id) DEFERRABLE INITIALLY DEFERRED);"
    )
    setup.close()
    try:
        with pytest.raises(StoreError), store._exec.tx(lossable=True) as conn:
            conn.exec_driver_sql("INSERT INTO review_child (pid) VALUES (42)")
        assert set(pooled_levels(store.engine)) <= {FULL}
        it = submit(store)
        store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
        txs = log.transactions()
        assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL]
        assert lowered_commits_of_other_moves(txs) == [Tx(NORMAL, "COMMIT", frozenset())]  # the failed COMMIT
        with sqlite3.connect(path) as check:
            assert check.execute("SELECT count(*) FROM review_child").fetchone() == (0,)
    finally:
        store.close()


def test_a_sigint_inside_an_outcome_s_transaction_rolls_it_back_and_sets_the_connection_back(tmp_path):
    """A SIGINT raised while the outcome's first move runs (inside ``_sqlite_lowered``'s ``try``): the
    transaction rolls back, ``FULL`` is set again (or the connection dropped), the intent is still in flight,
    and the next authorization waits for the disk."""
    store = open_store(f"sqlite:///{tmp_path}/k.sqlite3")
    log = Statements().watch_sync(store.engine)
    phase = {"now": "idle"}

    def interrupt_first_move(raw: Any, sql: str) -> None:
        now = phase["now"]
        if now == "armed" and sql == "PRAGMA synchronous = NORMAL":
            phase["now"] = "lowered"
        elif now == "lowered" and sql.startswith("BEGIN"):
            raw.set_progress_handler(_thread.interrupt_main, 1)  # fires in the next statement: the first move
            phase["now"] = "installed"
        elif now == "installed":
            phase["now"] = "firing"
        elif now == "firing":
            raw.set_progress_handler(None, 0)
            phase["now"] = "done"

    log.hooks.append(interrupt_first_move)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        it = submit(store)
        lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
        phase["now"] = "armed"
        with pytest.raises(KeyboardInterrupt):
            store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
        signal.signal(signal.SIGINT, previous)
        assert phase["now"] == "done"
        assert store.get(it.key).state == STATE.authorized
        assert set(pooled_levels(store.engine)) <= {FULL}
        later = submit(store, text="second", target="room-2")
        store.begin_and_authorize(later.key, request_digest=later.request_digest, send_lease_seconds=10)
        txs = log.transactions()
        assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL, FULL]
        assert committed_levels(txs, EVENT.record_success) == []
        assert lowered_commits_of_other_moves(txs) == []
    finally:
        signal.signal(signal.SIGINT, previous)
        store.close()


def test_a_refused_outcome_in_the_blocking_async_store_leaves_every_connection_full(tmp_path):
    """``BlockingStore`` over the async SQLite store: the outcome commits under ``NORMAL``, a refused outcome
    (its lease expired and the sweeper made it unknown) rolls back under ``NORMAL``, and each time the
    connection is ``FULL`` again; the authorizations and the sweeper's batch commit under ``FULL``."""
    from atmostonce_sql.aio import BlockingStore, open_async_store

    store = BlockingStore(lambda: open_async_store(f"sqlite:///{tmp_path}/bs.sqlite3"))
    try:
        log = Statements()

        async def attach() -> None:
            log.watch_async(store.inner.sync.engine)

        store.wait(attach())
        it = store.submit("acct", "post", "room-1", {"text": "one"})
        lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
        store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
        late = store.submit("acct", "post", "room-2", {"text": "two"})
        lease2, _ = store.begin_and_authorize(late.key, request_digest=late.request_digest, send_lease_seconds=10)
        store.wait(store.inner.call(age_leases, store.inner.sync, 60))
        due = store.due_leases()
        store.expire_leases([(EVENT.expire_lease, i) for i in due])
        with pytest.raises(Rejected):
            store.record_sent(lease2, remote_id="r-2", read_back="read_back.match")
        txs = log.transactions()
        assert committed_levels(txs, EVENT.authorize_dispatch) == [FULL, FULL]
        assert committed_levels(txs, EVENT.expire_lease) == [FULL]
        assert committed_levels(txs, EVENT.confirm_read_back) == [NORMAL]
        assert [t.level for t in txs if t.end == "ROLLBACK" and not t.events][-1:] == [NORMAL]
        assert lowered_commits_of_other_moves(txs) == []
        levels = store.wait(store.inner.call(pooled_levels, store.inner.sync.engine))
        assert levels and set(levels) == {FULL}
    finally:
        store.close()


def test_async_outcomes_off_keeps_every_sqlite_commit_full_on_the_async_store(tmp_path):
    from atmostonce_sql.aio import open_async_store

    async def scenario() -> list[Tx]:
        store = await open_async_store(f"sqlite:///{tmp_path}/off.sqlite3", async_outcomes=False)
        log = Statements().watch_async(store.sync.engine)
        try:
            it = await store.submit("acct", "post", "room-1", {"text": "x"})
            lease, _ = await store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
            await store.record_not_sent(lease, reason="connect refused")
            return log.transactions()
        finally:
            await store.aclose()

    txs = asyncio.run(scenario())
    assert committed_levels(txs, EVENT.record_not_sent) == [FULL]
    assert {t.level for t in txs} == {FULL}


def test_lossable_needs_every_move_to_be_an_outcome(tmp_path):
    """The decision itself, for each set of moves a transaction can hold."""
    store = open_store(f"sqlite:///{tmp_path}/d.sqlite3")
    try:
        assert store._lossable([EVENT.record_success, EVENT.confirm_read_back]) is True
        assert store._lossable([EVENT.record_success, EVENT.read_back_failed]) is True
        assert store._lossable([EVENT.begin, EVENT.authorize_dispatch]) is False
        assert store._lossable([EVENT.record_not_sent, EVENT.retry]) is False
        assert store._lossable([EVENT.expire_lease]) is False
        assert {e for e in table().events if store._lossable([e])} == set(OUTCOMES)
        assert set(OUTCOMES) == {
            EVENT.record_success, EVENT.confirm_read_back, EVENT.read_back_failed,
            EVENT.record_not_sent, EVENT.record_unknown,
        }  # fmt: skip
    finally:
        store.close()
