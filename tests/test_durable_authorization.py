"""The authorization before the bytes waits for the disk on PostgreSQL whatever the server's defaults
(docs/design.md#two-durable-points-per-send).

A server, database or role default of ``synchronous_commit = off`` would let the authorizing commit return
while its WAL is still in memory; a crash at the send then loses it, the intent is pending again, and the
next worker sends it a second time. The store raises ``off`` to ``on`` for each of its sessions and leaves
every stronger setting alone.
"""

from __future__ import annotations

import psycopg
import pytest

from atmostonce.errors import AtMostOnceError
from atmostonce.runtime import Dispatcher
from tests.helpers import crashable_cluster

pytestmark = pytest.mark.postgres


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _database_default(url: str, value: str) -> None:
    dsn = _dsn(url)
    name = psycopg.conninfo.conninfo_to_dict(dsn)["dbname"]
    with psycopg.connect(dsn, autocommit=True) as admin:
        admin.execute(
            f"ALTER DATABASE {psycopg.sql.Identifier(name).as_string(admin)} SET synchronous_commit = {value}"
        )


def _settings(store) -> set[str]:
    """``synchronous_commit`` as each of the store's two kinds of connection sees it."""
    seen = set()
    for autocommit in (False, True):
        with store._exec.tx(autocommit=autocommit) as conn:
            seen.add(conn.exec_driver_sql("SHOW synchronous_commit").scalar_one())
    return seen


@pytest.mark.parametrize(("default", "expected"), [("off", "on"), ("remote_write", "remote_write"), ("local", "local")])
def test_a_database_default_that_skips_the_disk_is_raised_and_a_stronger_one_kept(pg_databases, default, expected):
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    _database_default(url, default)
    store = open_store(url, migrate=False)
    try:
        assert _settings(store) == {expected}
    finally:
        store.close()
        pg_databases.drop(url)


def test_the_async_store_raises_a_default_that_skips_the_disk_too(pg_databases):
    import asyncio

    from atmostonce_sql.aio import open_async_store

    url = pg_databases.fresh()
    _database_default(url, "off")

    async def main() -> set[str]:
        store = await open_async_store(url, migrate=False)
        try:
            return await store.call(_settings, store.sync)
        finally:
            await store.aclose()

    try:
        assert asyncio.run(main()) == {"on"}
    finally:
        pg_databases.drop(url)


@pytest.mark.slow
def test_an_authorization_survives_a_server_crash_at_the_send_on_a_database_set_to_skip_the_disk():
    """The server crashes (``pg_ctl stop -m immediate``) while the platform holds the request, on a database
    whose default is ``synchronous_commit = off`` and whose WAL writer sleeps 10 s: the authorization is
    still there after the restart, so no worker can send the intent again."""
    from atmostonce_function import FunctionTransport
    from atmostonce_sql import open_store

    store = None
    sent: list[str] = []
    with crashable_cluster("durable-auth") as cluster:
        try:
            url = cluster.create_database("durable")
            _database_default(url, "off")
            store = open_store(url)
            intent = store.submit("acct", "post", "room-1", {"text": "one send only"})

            def send(request):
                sent.append(request.idempotency_key)
                cluster.stop()  # the server crashes while the platform has the request
                return {"id": "obj-1"}

            transport = FunctionTransport(send, read_back=lambda rid: {"text": "one send only"})
            with pytest.raises(AtMostOnceError):  # the outcome cannot be written: the server is gone
                Dispatcher(store, transport).dispatch(intent)
            store.close()
            cluster.start()
            store = open_store(url, migrate=False)
            assert store.get(intent.key).state == "authorized"  # in flight under its lease, never queued again
            assert [h.event for h in store.history(intent.key)][-1] == "authorize_dispatch"
            with pytest.raises(AtMostOnceError):
                Dispatcher(store, transport).dispatch(intent.key)
            assert len(sent) == 1
        finally:
            if store is not None:
                store.close()
