"""Test support for SQL stores: fresh databases built from migration 1, and clock moves.

* :class:`PostgresDatabases`: from a server URL, builds one template database by
  running every migration, then clones a fresh database per test (or per
  Hypothesis example) with ``CREATE DATABASE ... TEMPLATE``.
* :class:`SqliteDatabases`: the same for SQLite files (a migrated template file is copied).
* :func:`age_leases`: moves a store's deadlines back by ``seconds``, which is
  what the database clock moving forward means to every lease judgement. The
  append-only tables are not touched. Real time still passes under it.
* :class:`SetClockStore`: a store whose database clock is a value the test sets, so nothing
  moves with real time: what a test that compares the store with a model on its own clock needs.
"""

from __future__ import annotations

import itertools
import os
import shutil
import tempfile
import uuid
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url

from atmostonce.names import EVENT

from . import make_engine, normalize_url
from .migrate import upgrade
from .pgserver import memory_folder
from .schema import approvals, claims, intents, rate_limits, text_claims
from .store import SqlStore

__all__ = ["PostgresDatabases", "SetClockStore", "SqliteDatabases", "age_leases"]


def age_leases(store: SqlStore, seconds: float) -> None:
    """Shift every lease deadline (intents, claims), approval deadline and text-window slot ``seconds`` into the past (the database clock
    advancing, as far as any guard can tell), and the time a failed intent failed (as far as the sweeper's retry
    wait can tell: ``Sweeper.retry_failed``). Append-only tables are not touched."""
    c = intents.c
    t = text_claims.c
    with store.engine.begin() as conn:
        conn.execute(
            sa.update(intents)
            .where(c.state.in_(store.table.event(EVENT.retry).sources))
            .values(updated_at=c.updated_at - float(seconds))
        )
        conn.execute(
            sa.update(intents)
            .where(c.lease_expires_at.is_not(None))
            .values(lease_expires_at=c.lease_expires_at - float(seconds))
        )
        conn.execute(
            sa.update(text_claims).values(start_at=t.start_at - float(seconds), end_at=t.end_at - float(seconds))
        )
        conn.execute(
            sa.update(claims)
            .where(claims.c.lease_expires_at.is_not(None))
            .values(lease_expires_at=claims.c.lease_expires_at - float(seconds))
        )
        conn.execute(sa.update(approvals).values(expires_at=approvals.c.expires_at - float(seconds)))
        conn.execute(
            sa.update(rate_limits)
            .where(rate_limits.c.window_start.is_not(None))
            .values(window_start=rate_limits.c.window_start - float(seconds))
        )


class PostgresDatabases:
    """Fresh PostgreSQL databases on one server, each a clone of a migrated template."""

    def __init__(self, base_url: str):
        self.base = make_url(normalize_url(base_url))
        self.prefix = f"aom_{os.getpid()}_{uuid.uuid4().hex[:6]}"
        self.admin = sa.create_engine(self.base, isolation_level="AUTOCOMMIT", poolclass=sa.pool.NullPool)
        self.template = f"{self.prefix}_tmpl"
        self._n = itertools.count(1)
        self._made: list[str] = []
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{self.template}"')
        engine = make_engine(self.url(self.template))
        try:
            upgrade(engine)
        finally:
            engine.dispose()

    def url(self, name: str) -> str:
        return self.base.set(database=name).render_as_string(hide_password=False)

    def fresh(self) -> str:
        """URL of a new database holding exactly the migrated schema."""
        name = f"{self.prefix}_{next(self._n)}"
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        self._made.append(name)
        return self.url(name)

    def drop(self, url: str) -> None:
        name = make_url(url).database
        with self.admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        if name in self._made:
            self._made.remove(name)

    def close(self) -> None:
        with self.admin.connect() as conn:
            for name in [*self._made, self.template]:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        self._made.clear()
        self.admin.dispose()


class SqliteDatabases:
    """Fresh SQLite files in a temporary folder, each a copy of a migrated template file.

    ``folder``: where the files go; ``None``: a new folder in memory where there is room
    (:func:`atmostonce_sql.pgserver.memory_folder`), else in the temporary folder. :meth:`close` removes it."""

    def __init__(self, folder: str | Path | None = None):
        self.folder = Path(folder or tempfile.mkdtemp(prefix="aom-sqlite-", dir=memory_folder()))
        self.template = self.folder / "template.sqlite3"
        self._n = itertools.count(1)
        engine = make_engine(f"sqlite:///{self.template}")
        try:
            upgrade(engine)
        finally:
            engine.dispose()  # the last connection to close checkpoints and removes the WAL

    def fresh(self) -> str:
        path = self.folder / f"db{next(self._n)}.sqlite3"
        shutil.copyfile(self.template, path)
        return f"sqlite:///{path}"

    def drop(self, url: str) -> None:
        path = Path(make_url(url).database)  # type: ignore[arg-type]  # a sqlite:/// URL names its file
        for suffix in ("", "-wal", "-shm"):
            Path(str(path) + suffix).unlink(missing_ok=True)

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)


class SetClockStore(SqlStore):
    """A :class:`SqlStore` whose database clock reads the one-row table ``aom_test_clock`` (created here, in
    the store's database), so every deadline, window and timestamp is judged against the time the test sets
    with :meth:`set_clock` (float seconds since the Unix epoch), never against the wall clock. For fresh
    test databases only. ``close()`` leaves ``engine`` to its owner."""

    def __init__(self, engine: sa.engine.Engine, start: float = 0.0):
        super().__init__(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE aom_test_clock (t double precision NOT NULL)")
            conn.execute(sa.text("INSERT INTO aom_test_clock VALUES (:t)"), {"t": float(start)})
        self._now = sa.select(sa.column("t", sa.Float(53))).select_from(sa.table("aom_test_clock")).scalar_subquery()

    def set_clock(self, t: float) -> None:
        """Set the database clock to ``t`` seconds since the Unix epoch."""
        with self.engine.begin() as conn:
            conn.execute(sa.text("UPDATE aom_test_clock SET t = :t"), {"t": float(t)})

    def close(self) -> None:
        if isinstance(self._autocommit, sa.engine.Engine) and self._autocommit is not self.engine:
            self._autocommit.dispose()
