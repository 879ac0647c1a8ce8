"""SQL stores for atmostonce: PostgreSQL (production) and SQLite (embedded default).

``open_store(url)`` builds a :class:`SqlStore` for ``sqlite:///path`` or
``postgresql://...`` URLs and applies migrations unless ``migrate=False``.
"""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from atmostonce.errors import StoreError

from .migrate import upgrade
from .roles import grant_app_role
from .store import SqlStore, register_sqlite_functions

__all__ = ["SqlStore", "grant_app_role", "make_engine", "open_store", "upgrade"]


def normalize_url(url: str) -> str:
    """Map ``postgres://`` and ``postgresql://`` to the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix) :]
    return url


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

        @sa.event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn, _record):
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()
            register_sqlite_functions(dbapi_conn)

        @sa.event.listens_for(engine, "begin")
        def _on_begin(conn):
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql"):
        return sa.create_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False)
    raise ValueError(f"unsupported database URL {url!r}: use sqlite:///path or postgresql://...")


def open_store(url: str, *, migrate: bool = True, pool_size: int = 8, **kw: Any) -> SqlStore:
    """Open a store at ``url``; raises ``ValueError`` for an unsupported or malformed URL,
    ``StoreError`` when the database cannot be reached or opened."""
    engine = make_engine(url, pool_size=pool_size)
    try:
        if migrate:
            upgrade(engine)
        else:
            with engine.connect():
                pass
    except sa.exc.SQLAlchemyError as exc:
        engine.dispose()
        raise StoreError(f"cannot open the database at {_redact(url)}: {_reason(exc)}") from exc
    return SqlStore(engine, **kw)


def _reason(exc: Exception) -> str:
    orig = getattr(exc, "orig", None)
    return " ".join(str(orig if orig is not None else exc).split())[:300]


def _redact(url: str) -> str:
    try:
        return sa.engine.make_url(normalize_url(url)).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "<malformed URL>"
