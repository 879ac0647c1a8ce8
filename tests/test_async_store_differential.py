"""The differential stateful suite against the native asyncio stores (docs/design.md#asyncio-the-async-outbox-and-stores):
the model and ``atmostonce_sql.AsyncSqlStore`` on aiosqlite and on psycopg's async connection, step by step.

The shipped machine is synchronous: it drives the async store through ``BlockingStore`` (a private event loop in a
thread). Every statement runs on the async driver; the store's clock is the model's (``SetClockStore``).
"""

from __future__ import annotations

import pytest
from hypothesis import settings

from atmostonce.testing.stateful import StoreUnderTest, make_machine

from .test_store_differential import PROFILE

pytestmark = pytest.mark.slow  # a minute each: `make test` runs them, `make quick` does not

# the async stores send the same statements as the sync ones, which the sync suite drives through 60 examples
# per database: a third of them here in the default run; `make soak` runs the soak profile in full
ASYNC_PROFILE = PROFILE if PROFILE.max_examples > 60 else settings(PROFILE, max_examples=PROFILE.max_examples // 3)


def _run(dbs):
    from atmostonce_sql.aio import BlockingStore, open_async_store
    from atmostonce_sql.testing import SetClockStore

    def factory():
        url = dbs.fresh()
        store = BlockingStore(lambda: open_async_store(url, migrate=False, pool_size=2, store_class=SetClockStore))

        def close():
            store.close()
            dbs.drop(url)

        return StoreUnderTest(store, close=close, set_clock=store.set_clock)

    machine = make_machine(factory)
    machine.TestCase.settings = ASYNC_PROFILE
    machine.TestCase().runTest()


def test_async_sqlite_store_agrees_with_model(sqlite_databases):
    _run(sqlite_databases)


@pytest.mark.postgres
def test_async_postgresql_store_agrees_with_model(pg_databases):
    _run(pg_databases)
