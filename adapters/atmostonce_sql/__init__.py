"""SQL stores for atmostonce: PostgreSQL (production) and SQLite (embedded default).

``open_store(url)`` builds a :class:`SqlStore` for ``sqlite:///path`` or
``postgresql://...`` URLs and applies migrations unless ``migrate=False``. A PostgreSQL URL may carry
``atmostonce_ha=sync`` or ``atmostonce_ha=async`` (the store's HA mode, docs/design.md "Failover and synchronous
replication"); it is taken out of the URL before libpq sees it.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from atmostonce.errors import SchemaNewer, SequenceBehind, StoreError, StoreNotFound

from .execution import SQLITE_WAL, durable_commits, sqlite_checkout
from .migrate import check_known_revision, upgrade
from .roles import grant_app_role
from .sequences import sequences_behind
from .store import HA_MODES, SqlStore, register_sqlite_functions

__all__ = [
    "AsyncSqlStore",
    "SqlStore",
    "grant_app_role",
    "make_engine",
    "open_async_store",
    "open_store",
    "split_ha_mode",
    "upgrade",
]


def __getattr__(name: str) -> Any:
    """``AsyncSqlStore`` and ``open_async_store`` from ``atmostonce_sql.aio``, imported when first asked for."""
    if name in ("AsyncSqlStore", "open_async_store"):
        from . import aio

        return getattr(aio, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


HA_PARAM = "atmostonce_ha"


def split_ha_mode(url: str) -> tuple[str, str | None]:
    """``(url without the atmostonce_ha query parameter, its value or None)``; ``ValueError`` for a value that is
    not an HA mode, for the parameter given twice, or on a URL that is not PostgreSQL."""
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    if not isinstance(url, str) or HA_PARAM not in url:
        return url, None
    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    modes = [v for k, v in pairs if k == HA_PARAM]
    if not modes:
        return url, None
    if len(modes) > 1 or modes[0] not in HA_MODES:
        raise ValueError(f"{HA_PARAM}={','.join(modes)!s}: give it once, one of {', '.join(HA_MODES)}")
    if not parts.scheme.startswith("postgres"):
        raise ValueError(f"{HA_PARAM} applies to PostgreSQL URLs only")
    rest = urlencode([(k, v) for k, v in pairs if k != HA_PARAM], safe="/:,")
    return urlunsplit(parts._replace(query=rest)), modes[0]


def normalize_url(url: str) -> str:
    """Map ``postgres://`` and ``postgresql://`` to the psycopg 3 driver, and libpq's multi-host form
    ``?host=h1:p1,h2:p2`` (hosts with their ports in one parameter) to ``?host=h1,h2&port=p1,p2``, which libpq
    reads the same and SQLAlchemy passes through unchanged."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            url = "postgresql+psycopg://" + url[len(prefix) :]
            break
    if url.startswith("postgresql") and "host=" in url and "," in url:
        url = _split_host_ports(url)
    return url


def _split_host_ports(url: str) -> str:
    from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

    parts = urlsplit(url)
    pairs = parse_qsl(parts.query, keep_blank_values=True)
    hosts = [v for k, v in pairs if k == "host"]
    if len(hosts) != 1 or "," not in hosts[0] or any(k == "port" for k, _ in pairs):
        return url
    names, ports = [], []
    for entry in hosts[0].split(","):
        name, sep, port = entry.rpartition(":")
        if not sep or not port.isdigit() or entry.startswith("/"):
            return url  # not every host names its port: leave it to libpq
        names.append(name)
        ports.append(port)
    rest = [(k, v) for k, v in pairs if k != "host"]
    query = urlencode([("host", ",".join(names)), ("port", ",".join(ports)), *rest], safe="/:,")
    return urlunsplit(parts._replace(query=query))


SQLITE_PRAGMAS = ("journal_mode=WAL", "foreign_keys=ON", "busy_timeout=30000", "synchronous=FULL")
"""Set on every SQLite connection of a store (sync and async). ``synchronous=FULL``: in WAL mode every commit
syncs the WAL before it returns, so the authorization is on the disk before any byte leaves; ``NORMAL``
would leave it in the page cache until a checkpoint, and a power loss at the send would make a sent intent
look unsent (docs/design.md#two-durable-points-per-send). Only an outcome's transaction, whose loss the lease
and the reconciler settle, is committed under ``NORMAL`` (``Executor.tx`` with ``lossable``), and the next
``FULL`` commit syncs it with its own."""


def sqlite_session(dbapi_conn: Any, record: Any) -> None:
    """The ``connect`` listener of the store's SQLite engines (sync and async): the driver leaves transactions to
    the store (``BEGIN IMMEDIATE``), :data:`SQLITE_PRAGMAS` are set, whether the journal took WAL is noted
    (``atmostonce_sql.execution.SQLITE_WAL``), and the store's SQL functions are registered."""
    dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
    cur = dbapi_conn.cursor()
    for pragma in SQLITE_PRAGMAS:
        cur.execute(f"PRAGMA {pragma}")
        if pragma.startswith("journal_mode"):
            row = cur.fetchone()
            record.info[SQLITE_WAL] = row is not None and str(row[0]).lower() == "wal"
    cur.close()
    register_sqlite_functions(dbapi_conn)


def make_engine(url: str, *, pool_size: int = 8) -> Engine:
    """An engine configured for the store: SQLite in WAL with ``BEGIN IMMEDIATE`` transactions
    (write serialization), PostgreSQL through psycopg 3 with a connection pool."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("a database URL is required (sqlite:///path or postgresql://...)")
    url = normalize_url(url)
    try:
        sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise ValueError(f"malformed database URL {url!r}: {exc}") from exc
    if url.startswith("sqlite") and not url.startswith(("sqlite:///", "sqlite+pysqlite:///")):
        raise ValueError(f"malformed SQLite URL {url!r}: use sqlite:///relative/path or sqlite:////absolute/path")
    if url.startswith("sqlite"):
        engine = sa.create_engine(url, connect_args={"timeout": 30, "check_same_thread": False})

        sa.event.listen(engine, "connect", sqlite_session)
        sa.event.listen(engine, "checkout", sqlite_checkout)

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn):
            # straight to the driver (SQLAlchemy's execution context costs more than the statement); a driver
            # error is wrapped as SQLAlchemy would have, so the store maps it as any other
            try:
                conn.connection.dbapi_connection.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise sa.exc.DBAPIError.instance("BEGIN IMMEDIATE", None, exc, sqlite3.Error) from exc

        return engine
    if url.startswith("postgresql"):
        engine = sa.create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False)
        sa.event.listen(engine, "connect", durable_commits)  # from the first connection (the migrations' too)
        return engine
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


def open_store(
    url: str,
    *,
    migrate: bool = True,
    pool_size: int = 8,
    check_sequences: bool = True,
    create: bool = True,
    **kw: Any,
) -> SqlStore:
    """Open a store at ``url``.

    Unless ``check_sequences`` is false (only ``atmostonce db declare-restore``, which repairs them,
    opens without it), every sequence the store draws from is compared with the highest value stored
    where it is used, in one statement (``atmostonce_sql.sequences``). Raises ``ValueError`` for an
    unsupported or malformed URL, ``SequenceBehind`` (fields ``sequence``, ``value``, ``stored_max``,
    ``repair``, ``behind``) when a sequence is behind the data, as after a restore that left the
    sequence positions behind, and ``StoreError`` when the database cannot be reached or opened.
    With ``create=False`` a SQLite file that does not exist is a ``StoreError`` instead of a new, empty
    database (read commands: a mistyped path must not leave an empty file behind). ``ha`` (or
    ``atmostonce_ha`` in the URL): the HA mode, ``"sync"`` or ``"async"`` (docs/design.md, "Failover and
    synchronous replication")."""
    url, ha_in_url = split_ha_mode(url)
    ha = kw.pop("ha", None) or ha_in_url
    if ha is not None:
        kw["ha"] = ha
    return open_on(make_engine(url, pool_size=pool_size), url, migrate, check_sequences, create, SqlStore, **kw)


def open_on(
    engine: Engine,
    url: str,
    migrate: bool,
    check_sequences: bool,
    create: bool,
    store_class: type[SqlStore],
    **kw: Any,
) -> SqlStore:
    """:func:`open_store`'s checks and migrations on an engine made for ``url``, then ``store_class(engine, **kw)``
    (``atmostonce_sql.aio`` runs it over an async engine's ``sync_engine``, inside a greenlet)."""
    if not create:
        missing = _missing_sqlite_file(engine)
        if missing is not None:
            engine.dispose()
            raise StoreNotFound(
                missing,
                f"cannot open the database at {missing}: the SQLite file does not exist (check the path; "
                "`atmostonce db upgrade` creates a new database)",
            )
    try:
        if migrate:
            # refuses a schema a newer atmostonce migrated (SchemaNewer) before changing anything
            upgrade(engine)
        with engine.connect() as conn:
            if not migrate:
                check_known_revision(conn)
            behind = sequences_behind(conn) if check_sequences else ()
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        raise StoreError(f"cannot open the database at {_redact(url)}: {_reason(exc)}") from exc
    except SchemaNewer:
        engine.dispose()
        raise
    if behind:
        engine.dispose()
        raise SequenceBehind(behind)
    return store_class(engine, **kw)


def _missing_sqlite_file(engine: Engine) -> str | None:
    """The path of the SQLite file ``engine`` would create, or ``None`` (it exists, or not SQLite on disk)."""
    import os

    u = engine.url
    if u.get_backend_name() != "sqlite":
        return None
    path = u.database or ""
    if path in ("", ":memory:") or path.startswith("file:"):
        return None
    return None if os.path.exists(path) else path


def _reason(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    return " ".join(str(orig if orig is not None else exc).split())[:300]


def _redact(url: str) -> str:
    try:
        return sa.engine.make_url(normalize_url(url)).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<malformed URL>"
