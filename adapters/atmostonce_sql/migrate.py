"""Run the Alembic migrations programmatically (``atmostonce db upgrade``)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.util.concurrency import await_, in_greenlet

__all__ = ["alembic_config", "check_known_revision", "current_revision", "upgrade"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


MIGRATION_LOCK_KEY = 0x61746D6F6D696772  # "atmomigr": the PostgreSQL advisory lock every migration takes
MIGRATION_LOCK = threading.Lock()
"""Held by whoever runs Alembic in this process: Alembic keeps the running migration's environment in module
globals (``alembic.context``), so two migrations at once in one process, in threads or in greenlets on one
event loop, would read each other's. Taken after the database's own lock (so a wait for one database holds up
no other), and made anew in a forked child (a fork while another thread held it would leave it held)."""


def _new_lock_in_child() -> None:
    global MIGRATION_LOCK
    MIGRATION_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_lock_in_child)


@contextlib.contextmanager
def _alembic_turn() -> Iterator[None]:
    """Hold :data:`MIGRATION_LOCK`: blocking in a thread; inside a greenlet on an event loop (the async stores),
    polled with the loop's sleep, so that another migration of this loop, which holds it, goes on meanwhile."""
    lock = MIGRATION_LOCK
    if in_greenlet():
        import asyncio

        while not lock.acquire(blocking=False):
            await_(asyncio.sleep(0.005))
    else:
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` on ``engine`` in one transaction. A database already at the newest
    revision is only read. Migrations of one database run one at a time across processes (on PostgreSQL, a
    transaction-level advisory lock; on SQLite, the store's ``BEGIN IMMEDIATE``), and one at a time in this
    process (:data:`MIGRATION_LOCK`, taken once the database's lock is held), so processes, threads and async
    tasks opening a new database together migrate it once, each waiting for the one ahead.

    Raises:
        SchemaNewer: the database is at a revision these migrations do not know (a newer atmostonce migrated it);
            nothing is changed.
    """
    if revision == "head":
        with engine.connect() as conn:
            found = MigrationContext.configure(conn).get_current_revision()
            _refuse_unknown(found)
            if found is not None and found == _known_revisions()[1]:
                return
    cfg = alembic_config()
    with engine.begin() as conn:
        if conn.dialect.name == "postgresql":
            conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
        check_known_revision(conn)
        with _alembic_turn():
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, revision)


def check_known_revision(conn: Connection) -> None:
    """Raise :class:`~atmostonce.errors.SchemaNewer` when the database on ``conn`` records a revision (Alembic's
    ``alembic_version``) that is none of these migrations'; a database with no revision yet passes."""
    _refuse_unknown(MigrationContext.configure(conn).get_current_revision())


def _refuse_unknown(found: str | None) -> None:
    if found is None:
        return
    known, head = _known_revisions()
    if found not in known:
        from atmostonce.errors import SchemaNewer

        raise SchemaNewer(found, head)


@functools.cache
def _known_revisions() -> tuple[frozenset[str], str | None]:
    """Every revision of these migrations, and the newest (read from the scripts once per process)."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    return frozenset(s.revision for s in scripts.walk_revisions()), scripts.get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
