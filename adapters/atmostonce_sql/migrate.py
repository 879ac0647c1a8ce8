"""Run the Alembic migrations programmatically (``atmostonce db upgrade``)."""

from __future__ import annotations

import functools
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Connection, Engine

__all__ = ["alembic_config", "check_known_revision", "current_revision", "upgrade"]

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Apply migrations up to ``revision`` on ``engine`` in one transaction.

    Raises:
        SchemaNewer: the database is at a revision these migrations do not know (a newer atmostonce migrated it);
            nothing is changed.
    """
    cfg = alembic_config()
    with engine.begin() as conn:
        check_known_revision(conn)
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def check_known_revision(conn: Connection) -> None:
    """Raise :class:`~atmostonce.errors.SchemaNewer` when the database on ``conn`` records a revision (Alembic's
    ``alembic_version``) that is none of these migrations'; a database with no revision yet passes."""
    from alembic.runtime.migration import MigrationContext

    found = MigrationContext.configure(conn).get_current_revision()
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
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
