"""Run the Alembic migrations programmatically (``atmostonce db upgrade``)."""

from __future__ import annotations

import contextlib
import functools
import threading
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Connection, Engine

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
event loop, would read each other's. Taken before the database's own lock, always in that order."""


def upgrade(engine: Engine, revision: str = "head", *, lock_held: bool = False) -> None:
    """Apply migrations up to ``revision`` on ``engine`` in one transaction. A database already at the newest
    revision is only read. Migrations of one database run one at a time across processes (on PostgreSQL, a
    transaction-level advisory lock; on SQLite, the store's ``BEGIN IMMEDIATE``), and one at a time in this
    process (:data:`MIGRATION_LOCK`; ``lock_held``: the caller holds it already), so processes and async tasks
    opening a new database together migrate it once, each waiting for the one ahead.

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
    with contextlib.nullcontext() if lock_held else MIGRATION_LOCK:
        cfg = alembic_config()
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                conn.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
            check_known_revision(conn)
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
