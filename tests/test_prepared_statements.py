"""The PostgreSQL store sends its autocommit statements as prepared statements of its own, outside psycopg's
cursors (``Executor._query``): these tests hold it to what the cursor path gave, on a real server."""

from __future__ import annotations

import psycopg
import pytest

from atmostonce.runtime import Dispatcher
from tests.test_fused_dispatch import CONFIG, Platform, events


def _open(url):
    from atmostonce_sql import open_store

    return open_store(url, migrate=False, pool_size=1)


def _forget_prepared(store, sql: str) -> None:
    """Run ``sql`` (``DEALLOCATE ALL``, ``DISCARD ALL``) on the store's one pooled autocommit connection."""
    with store._exec.tx(autocommit=True) as conn:
        conn.exec_driver_sql(sql)


@pytest.mark.postgres
@pytest.mark.parametrize("forget", ["DEALLOCATE ALL", "DISCARD ALL"])
def test_a_publish_after_the_server_forgot_the_prepared_statements_is_sent_once(pg_databases, forget):
    """A pooler's ``DISCARD ALL`` or a ``DEALLOCATE`` drops the store's prepared statements on the server while
    the store still counts them as prepared. The next publish does not fail: its statement never ran, so it is
    prepared again and sent once more; the platform gets one send per publish and the history is the usual one."""
    url = pg_databases.fresh()
    store = _open(url)
    try:
        platform = Platform()
        dispatcher = Dispatcher(store, platform, CONFIG)
        first, outcome = dispatcher.publish("acct", "post", "room-1", {"text": "before"})
        assert outcome == "read_back.match"
        _forget_prepared(store, forget)
        second, outcome = dispatcher.publish("acct", "post", "room-1", {"text": "after"})
        assert outcome == "read_back.match"
        assert platform.sends == 2
        assert events(store, second) == events(store, first)
        assert store.get(second).state == "published"
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.postgres
def test_a_statement_prepared_on_one_connection_is_prepared_again_on_a_new_one(pg_databases):
    """Prepared statements belong to a server session: after the pool's connection is terminated, the next
    publish's first attempt fails (nothing written: its statement was not received), and the one after it runs on
    a fresh connection, where the statements are prepared anew."""
    from atmostonce import StoreError

    url = pg_databases.fresh()
    store = _open(url)
    try:
        platform = Platform()
        dispatcher = Dispatcher(store, platform, CONFIG)
        dispatcher.publish("acct", "post", "room-1", {"text": "one"})
        with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        with pytest.raises(StoreError):
            dispatcher.publish("acct", "post", "room-1", {"text": "two"})
        key, outcome = dispatcher.publish("acct", "post", "room-1", {"text": "two"})
        assert outcome == "read_back.match"
        assert platform.sends == 2
        assert store.get(key).state == "published"
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.postgres
def test_a_store_statement_is_prepared_with_the_types_of_its_binds(pg_store):
    """Parameters go as text; the types the statement is prepared with come from its binds (a boolean, a
    number, a JSON document), so a value the statement does not cast is still read as its type, and a value
    the row returns comes back as the Python value that went in."""
    key, outcome = Dispatcher(pg_store, Platform(), CONFIG).publish(
        "acct", "post", "room-1", {"text": "typed", "n": 3, "ratio": 0.1, "flag": False, "none": None}
    )
    assert outcome == "read_back.match"
    it = pg_store.get(key)
    assert it.request == {"text": "typed", "n": 3, "ratio": 0.1, "flag": False, "none": None}
    assert it.requires_approval is False and it.attempt_count == 1
    assert isinstance(it.lease_expires_at, float) or it.lease_expires_at is None


def test_a_parameter_is_sent_as_the_text_postgresql_reads_back_as_the_same_value():
    """Subclasses go as their value (an ``IntEnum`` is not its name), a float as the shortest text that is the
    same double, JSON as its document, and a type the store has no rule for through psycopg's own dumper."""
    import decimal
    import enum

    from psycopg.types.json import Jsonb

    from atmostonce_sql.execution import _text_value

    class Level(enum.IntEnum):
        high = 3

    class Name(str):
        def __str__(self) -> str:
            return "not the value"

    assert _text_value(Level.high) == b"3"
    assert _text_value(Name("acct")) == b"acct"
    assert _text_value(True) == b"t" and _text_value(0) == b"0"
    assert float(_text_value(0.1)) == 0.1 and _text_value(1e300) == b"1e+300"
    assert _text_value(Jsonb({"a": [1, "x"]})) == b'{"a": [1, "x"]}'
    assert _text_value(decimal.Decimal("1.50")) == b"1.50"
    assert _text_value(None) is None


def test_a_text_value_with_a_nul_byte_is_refused_rather_than_cut_short():
    """libpq reads a text-format value up to its first NUL: sent as it is, ``"r1\\x00tail"`` would be stored as
    ``"r1"``. It is refused before anything is sent, as psycopg's own dumper refuses it."""
    import psycopg

    from atmostonce_sql.execution import _text_value

    with pytest.raises(psycopg.DataError):
        _text_value("r1\x00tail")


@pytest.mark.postgres
def test_a_closed_store_leaves_no_connection_alive_in_the_prepared_statement_cache(pg_databases):
    """Each connection's prepared statements are remembered with the loaders of their rows, keyed weakly by
    the connection. What is remembered must not refer back to the connection: once the store is closed its
    connections are freed, not kept for the life of the process."""
    import gc
    import weakref

    from atmostonce_sql import execution

    url = pg_databases.fresh()
    store = _open(url)
    try:
        dispatcher = Dispatcher(store, Platform(), CONFIG)
        dispatcher.publish("acct", "post", "room-1", {"text": "one"})
        with store._exec.tx(autocommit=True) as conn:
            raw = weakref.ref(conn.connection.dbapi_connection)
        remembered = execution._PREPARED.get(raw())
        assert remembered is not None and any(t is not None for t in remembered.values())
        del remembered
    finally:
        store.close()
        pg_databases.drop(url)
    gc.collect()
    assert raw() is None
