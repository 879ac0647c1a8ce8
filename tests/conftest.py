"""Shared fixtures: real databases (PostgreSQL and SQLite) built from migration 1.

PostgreSQL: ``$DATABASE_URL`` when set, else a testcontainer when a Docker engine
answers, else a throwaway local cluster (``atmostonce_sql.pgserver``). Each
pytest-xdist worker gets its own server or template, and each test its own
database.
"""

from __future__ import annotations

import locale

import pytest

from atmostonce import MemoryStore
from atmostonce.testing.stateful import FakeClock


@pytest.fixture(scope="session")
def pg_databases():
    from atmostonce_sql.pgserver import postgres_url_for_tests
    from atmostonce_sql.testing import PostgresDatabases

    base, cleanup = postgres_url_for_tests()
    dbs = PostgresDatabases(base)
    yield dbs
    dbs.close()
    cleanup()


@pytest.fixture(scope="session")
def sqlite_databases():
    from atmostonce_sql.testing import SqliteDatabases

    dbs = SqliteDatabases()  # in memory where there is room
    yield dbs
    dbs.close()


def _sql_store(dbs):
    from atmostonce_sql import open_store

    url = dbs.fresh()
    store = open_store(url, migrate=False, pool_size=4)
    return store, url


@pytest.fixture
def pg_url(pg_databases):
    """The URL of a fresh PostgreSQL database built from migration 1 (dropped after the test)."""
    url = pg_databases.fresh()
    yield url
    pg_databases.drop(url)


@pytest.fixture
def pg_store(pg_databases):
    store, url = _sql_store(pg_databases)
    yield store
    store.close()
    pg_databases.drop(url)


@pytest.fixture
def sqlite_store(sqlite_databases):
    store, url = _sql_store(sqlite_databases)
    yield store
    store.close()
    sqlite_databases.drop(url)


class ClockedStore:
    """A store plus ``advance(seconds)`` that moves its clock (model) or ages its leases (SQL)."""

    def __init__(self, store, advance, kind):
        self.store, self.advance, self.kind = store, advance, kind


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def any_store(request):
    """Every implementation of the store protocol, one after the other."""
    if request.param == "memory":
        clock = FakeClock()
        yield ClockedStore(MemoryStore(clock=clock), clock.advance, "memory")
        return
    from atmostonce_sql.testing import age_leases

    fixture = "sqlite_store" if request.param == "sqlite" else "pg_store"
    store = request.getfixturevalue(fixture)
    yield ClockedStore(store, lambda s: age_leases(store, s), request.param)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def sql_store(request):
    """Both SQL dialects."""
    return request.getfixturevalue("sqlite_store" if request.param == "sqlite" else "pg_store")


@pytest.fixture
def ascii_locale():
    """An ASCII (C) character locale for the test, as a process started under ``LANG=C`` without UTF-8
    mode has; restored afterwards. Files read or written without an explicit encoding then use ASCII,
    so a missing ``"utf-8"`` shows as a UnicodeError. Under Python's UTF-8 mode (``PYTHONUTF8=1``, or a
    process started in the C locale) the default stays UTF-8 whatever this sets, and the tests that use
    it only check the result, not the encoding; the mutmut runs are made without UTF-8 mode."""
    old = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        yield locale.getpreferredencoding(False)
    finally:
        locale.setlocale(locale.LC_CTYPE, old)


@pytest.fixture
def set_clock_store(any_store):
    """A store on every implementation whose clock the test sets, and the function that sets it (seconds):
    the model's injected clock, or for the SQL stores a database clock read from a one-row table, so a test
    can hit an edge exactly or run wall time backwards without sleeping."""
    if any_store.kind == "memory":
        now = [0.0]

        def set_clock(t):
            now[0] = t

        yield MemoryStore(clock=lambda: now[0]), set_clock
        return
    from tests.sql_clock import SetClockStore

    store = SetClockStore(any_store.store.engine)
    yield store, store.set_clock
    store.close()


@pytest.fixture
def cli_db(tmp_path):
    """A fresh SQLite database for a CLI test: ``(url, store)``; the store is closed afterwards."""
    from atmostonce_sql import open_store

    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    store = open_store(url)
    yield url, store
    store.close()


MOVING_CLOCK_START = 1_000_000.0
"""Where ``moving_clock_store``'s database clock starts (seconds since the Unix epoch)."""


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def moving_clock_store(request, monkeypatch):
    """``(store, set_clock)``: a SQL store whose database clock the test moves, also between two statements of one
    move, starting at :data:`MOVING_CLOCK_START`. SQLite: a SQL function reading a Python value (the move's
    transaction holds the write lock, so no other connection could write a clock row). PostgreSQL: the set-clock
    table, written by another connection and read by the move's read-committed statements."""
    import sqlalchemy as sa

    import atmostonce_sql

    if request.param == "postgresql":
        from atmostonce_sql.testing import SetClockStore

        base = request.getfixturevalue("pg_store")
        store = SetClockStore(base.engine, start=MOVING_CLOCK_START)
        yield store, store.set_clock
        store.close()
        return
    now = [MOVING_CLOCK_START]
    tick = [0.0]
    register = atmostonce_sql.register_sqlite_functions

    def read() -> float:
        now[0] += tick[0]
        return now[0]

    def with_clock(dbapi_conn):
        register(dbapi_conn)
        dbapi_conn.create_function("aom_test_now", 0, read)

    monkeypatch.setattr(atmostonce_sql, "register_sqlite_functions", with_clock)
    dbs = request.getfixturevalue("sqlite_databases")
    url = dbs.fresh()
    store = atmostonce_sql.open_store(url, migrate=False, pool_size=4)
    store._now = sa.literal_column("aom_test_now()", sa.Float(53))

    def set_clock(t: float, tick_per_read: float = 0.0) -> None:
        """SQLite only: ``tick_per_read`` moves the clock that much at each reading, even within a statement."""
        now[0] = t - tick_per_read
        tick[0] = tick_per_read

    yield store, set_clock
    store.close()
    dbs.drop(url)


@pytest.fixture
def cli_on_json_server(tmp_path):
    """``(store, url, server, config)``: a SQLite store for the CLI, json-server (a REST server nobody here wrote)
    and a platform config file for it (JSON, the shipped json-server profile's fields)."""
    import json

    from atmostonce_sql import open_store
    from tests.http.jsonserver import JsonServer, profile

    url = f"sqlite:///{tmp_path / 'ops.sqlite3'}"
    store = open_store(url)
    (tmp_path / "js").mkdir()
    with JsonServer(tmp_path / "js") as server:
        cfg = tmp_path / "platform.json"
        cfg.write_text(json.dumps(profile(server.url)))
        yield store, url, server, str(cfg)
    store.close()
