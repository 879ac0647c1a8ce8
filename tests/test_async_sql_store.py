"""The native asyncio SQL stores (``atmostonce_sql.aio``; docs/design.md#asyncio-the-async-outbox-and-stores): the
store's own contract tests, run again on aiosqlite and on psycopg's async connection.

``any_store`` is overridden here by the async stores behind ``BlockingStore``, so the two-durable-points tests of
``tests/test_fused_dispatch.py`` (on PostgreSQL the pipelined moves, a later move's refusal, the diagnosis of the
guard that refused) run on the async drivers with no change; the rest checks what only the async stores have.
"""

from __future__ import annotations

import asyncio

import pytest

from atmostonce import IllegalMove
from atmostonce.errors import SOURCE_STATE
from atmostonce.names import EVENT, STATE
from tests.conftest import ClockedStore
from tests.test_fused_dispatch import (  # noqa: F401 - collected here, on the async stores
    test_a_fused_dispatch_ends_where_the_step_by_step_one_does,
    test_a_kill_switch_stops_a_fused_dispatch_before_anything_is_begun,
    test_a_mismatched_read_back_is_recorded_with_its_success_and_its_evidence,
    test_a_refused_authorization_leaves_no_attempt_and_spends_nothing,
    test_a_refused_begin_is_raised_as_begin_and_moves_nothing,
    test_an_outcome_under_a_lapsed_lease_writes_neither_move,
    test_record_sent_takes_only_a_read_back_outcome,
    test_the_fused_moves_write_the_history_of_the_moves_one_by_one,
)
from tests.test_publish import (  # noqa: F401 - collected here, on the async stores
    test_a_kill_switch_leaves_the_published_delivery_queued_and_sends_nothing,
    test_publish_ends_where_submit_then_dispatch_ends,
    test_publishing_a_queued_delivery_dispatches_that_intent_without_a_second_one,
    test_publishing_a_settled_delivery_again_is_refused_and_sends_nothing,
)

KINDS = ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]


def _dbs(request, kind):
    return request.getfixturevalue("sqlite_databases" if kind == "sqlite" else "pg_databases")


@pytest.fixture(params=KINDS)
def any_store(request):
    """The async store of each dialect, driven synchronously (``BlockingStore``)."""
    from atmostonce_sql.aio import BlockingStore, open_async_store
    from atmostonce_sql.testing import age_leases

    dbs = _dbs(request, request.param)
    url = dbs.fresh()
    store = BlockingStore(lambda: open_async_store(url, migrate=False, pool_size=4))
    yield ClockedStore(store, lambda s: store.wait(store.inner.call(age_leases, store.inner.sync, s)), request.param)
    store.close()
    dbs.drop(url)


@pytest.mark.parametrize("kind", KINDS)
def test_the_async_store_runs_every_statement_on_the_async_driver(request, kind):
    from atmostonce_sql.aio import AsyncExecutor, open_async_store

    url = _dbs(request, kind).fresh()

    async def scenario():
        async with await open_async_store(url, migrate=False) as store:
            it = await store.submit("acct", "post", "room", {"text": "hi"})
            again = await store.submit("acct", "post", "room", {"text": "hi"})  # idempotent
            lease, _ = await store.begin_and_authorize(it.key, request_digest=it.request_digest)
            done = await store.record_not_sent(lease, reason="connect refused")
            stale = None
            try:
                await store.record_not_sent(lease, reason="twice")
            except IllegalMove as exc:
                stale = exc
            driver = type(store.engine.sync_engine.dialect).__name__
            return (
                it,
                again,
                done,
                stale,
                type(store.sync._exec),
                driver,
                [h.event for h in await store.history(it.key)],
            )

    it, again, done, stale, executor, driver, history = asyncio.run(scenario())
    assert again.key == it.key
    assert done.state == STATE.failed  # a definitive not-sent outcome: retryable, never resent by itself
    assert executor is AsyncExecutor
    assert driver in ("SQLiteDialect_aiosqlite", "PGDialectAsync_psycopg")
    assert stale is not None and (stale.event, stale.key) == (EVENT.record_not_sent, it.key)
    # the second outcome is refused by the state it found, named from the table, and wrote nothing
    assert isinstance(stale, IllegalMove)
    assert stale.as_dict() == {
        "event": EVENT.record_not_sent,
        "key": it.key,
        "guard": SOURCE_STATE,
        "state": STATE.failed,
    }
    assert history == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch, EVENT.record_not_sent]


def test_an_async_store_has_no_ha_mode():
    from atmostonce_sql.aio import open_async_store

    with pytest.raises(ValueError, match="HA mode"):
        asyncio.run(open_async_store("postgresql://nowhere/db?atmostonce_ha=sync"))


def test_a_synchronous_driver_url_is_refused_by_the_async_store():
    from atmostonce_sql.aio import async_url

    assert async_url("sqlite:///x.sqlite3") == "sqlite+aiosqlite:///x.sqlite3"
    assert async_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    with pytest.raises(ValueError):
        async_url("postgresql+psycopg2://u@h/db")


@pytest.mark.parametrize("kind", KINDS)
def test_open_async_awaits_the_native_store_and_runs_to_idle_with_one_send(request, kind):
    import atmostonce
    from atmostonce.runtime import RuntimeConfig
    from atmostonce_sql.aio import AsyncSqlStore
    from tests.test_aio import QUICK, AsyncEcho

    url, echo = _dbs(request, kind).fresh(), AsyncEcho()

    async def go():
        async with atmostonce.open_async(url, transport=echo, config=RuntimeConfig(), **QUICK) as outbox:
            native = outbox.async_store
            it = await outbox.submit("acct", "post", "room-1", {"text": "hi"})
            again = await outbox.submit("acct", "post", "room-1", {"text": "hi"})  # idempotent
            report = await outbox.run(until_idle=True, timeout=30)
            with pytest.raises(RuntimeError):  # the service's store waits on the loop: never called on it
                outbox.store.get(it.key)
            second = await outbox.run(until_idle=True, timeout=30)
            return native, it.key == again.key, report, second, (await outbox.get(it.key)).state

    native, same, report, second, state = asyncio.run(go())
    assert isinstance(native, AsyncSqlStore) and same
    assert report.idle and report.dispatched == {"read_back.match": 1}
    assert second.idle  # the report counts the whole service: echo.sends says nothing was sent again
    assert state == STATE.published and echo.sends == 1 and echo.closed


def test_a_scheme_without_an_async_store_keeps_its_synchronous_store():
    import atmostonce
    from tests.test_aio import AsyncEcho

    async def go():
        async with atmostonce.open_async("memory://", transport=AsyncEcho()) as outbox:
            return outbox.async_store

    assert asyncio.run(go()) is None
    with pytest.raises(ValueError, match="no async store"):
        asyncio.run(atmostonce.open_async_store("memory://"))


@pytest.mark.postgres
def test_a_pipelined_transaction_whose_later_step_fails_writes_none_of_its_moves(pg_databases):
    from atmostonce_sql.aio import open_async_store

    url = pg_databases.fresh()

    async def scenario():
        async with await open_async_store(url, migrate=False, pool_size=1) as store:
            it = await store.submit("acct", "post", "room", {"text": "hi"})

            def broken(_prev):
                raise RuntimeError("the second move's arguments could not be built")

            with pytest.raises(RuntimeError):
                steps = [(EVENT.begin, {"lease_seconds": 30.0}), (EVENT.authorize_dispatch, broken)]
                await store.call(store.sync._moves, it.key, steps)
            # the begin sent before the failure was rolled back with it: the intent is pending, its connection clean
            lease, authorized = await store.begin_and_authorize(it.key, request_digest=it.request_digest)
            return authorized.state, [h.event for h in await store.history(it.key)]

    state, history = asyncio.run(scenario())
    assert state == STATE.authorized
    assert history == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch]


@pytest.mark.parametrize("kind", KINDS)
def test_cancelling_a_run_on_the_native_store_records_the_send_unknown_never_not_sent(request, kind):
    import atmostonce
    from atmostonce.runtime import RuntimeConfig
    from atmostonce.transport import CANCELLED_SEND
    from tests.test_aio import QUICK, AsyncEcho

    url, echo = _dbs(request, kind).fresh(), AsyncEcho(hold=True)

    async def go():
        async with atmostonce.open_async(url, transport=echo, config=RuntimeConfig(), **QUICK) as outbox:
            it = await outbox.submit("acct", "post", "room-1", {"text": "hi"})
            run = asyncio.create_task(outbox.run(until_idle=True, timeout=30))
            assert await asyncio.to_thread(echo.entered.wait, 10)  # the send is at the platform
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            history = await outbox.async_store.history(it.key)
            return (await outbox.get(it.key)), history, outbox.async_store.table

    after, history, table = asyncio.run(go())
    assert after.state == STATE.indeterminate and after.attempt_count == 1
    unknown = [h for h in history if h.event == table.outcomes["send.unknown"].event]
    assert len(unknown) == 1 and str(unknown[0].detail["reason"]).startswith(CANCELLED_SEND)


@pytest.mark.parametrize("kind", KINDS)
def test_a_cancelled_write_on_the_native_store_leaves_no_transaction_open(request, kind):
    """Submits cancelled at every point of their life: each is all or nothing (committed with its history, or
    absent), and once the store is quiet no connection holds a transaction: on SQLite another connection takes
    the write lock without waiting at all (a cancellation inside the driver's await had left a pooled connection
    holding it, and every writer waited out the 30 s busy timeout); on PostgreSQL no session of the database is
    idle in a transaction."""
    import sqlite3

    import psycopg

    from atmostonce_sql.aio import open_async_store

    dbs = _dbs(request, kind)
    url = dbs.fresh()

    async def scenario():
        store = await open_async_store(url, migrate=False, pool_size=4)
        try:
            targets = []
            for r in range(30):
                tasks = []
                for i in range(4):
                    targets.append(f"r{r}-{i}")
                    tasks.append(asyncio.create_task(store.submit("acct", "post", targets[-1], {"text": "hi"})))
                await asyncio.sleep(0.001 * (r % 15))
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
                await store.quiesce()
                if kind == "sqlite":
                    other = sqlite3.connect(store.engine.url.database, timeout=0, isolation_level=None)
                    try:
                        other.execute("BEGIN IMMEDIATE")  # raises "database is locked" if a write lock leaked
                        other.execute("ROLLBACK")
                    finally:
                        other.close()
                else:
                    dsn = store.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)
                    with psycopg.connect(dsn) as conn:
                        row = conn.execute(
                            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                            " AND state LIKE 'idle in transaction%'"
                        ).fetchone()
                    assert row == (0,)
            found = {it.target: it for it in await store.list_intents(limit=1000)}
            for it in found.values():
                assert [h.event for h in await store.history(it.key)] == [EVENT.submit]
            return set(found) <= set(targets)
        finally:
            await store.aclose()

    assert asyncio.run(scenario())
    dbs.drop(url)
