"""Implementation factories for the SQL stores (test code: the core imports no adapter).

* :func:`sql_factory`: a fresh database per case, cloned from the migrated template
  (``tests/conftest.py``'s ``sqlite_databases`` / ``pg_databases``).
* :class:`ResettingPostgres`: one database, put back to exactly its freshly migrated content
  (rows and sequence positions) before every case. Cloning a PostgreSQL database costs about
  half a second; this reset costs a few milliseconds. It needs a superuser (to bypass the
  append-only triggers on its own connection); without one it clones a database per case.
* :func:`sqlite`: for the command line, ``--impl tests.conformance.factories:sqlite``.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable
from typing import Any

import sqlalchemy as sa

from atmostonce.conformance import Implementation

__all__ = ["ResettingPostgres", "sql_factory", "sqlite"]


def _implementation(url: str, on_close: Callable[[], None]) -> Implementation:
    from atmostonce_sql import open_store
    from atmostonce_sql.testing import age_leases

    store = open_store(url, migrate=False, pool_size=2)

    def close() -> None:
        store.close()
        on_close()

    return Implementation(store, lambda seconds: age_leases(store, seconds), close)


def sql_factory(dbs: Any) -> Callable[[], Implementation]:
    """A factory giving each call its own database from ``dbs`` (dropped on close)."""

    def factory() -> Implementation:
        url = dbs.fresh()
        return _implementation(url, lambda: dbs.drop(url))

    factory.__qualname__ = f"{type(dbs).__name__}.fresh"
    return factory


class ResettingPostgres:
    """Callable factory over one PostgreSQL database, reset to its migrated content per call."""

    def __init__(self, dbs: Any):
        self.dbs = dbs
        self.url = dbs.fresh()
        self.engine = sa.create_engine(self.url, poolclass=sa.pool.NullPool)
        self.__qualname__ = "postgresql (one database, reset per case)"
        with self.engine.connect() as conn:
            self.can_reset = bool(
                conn.exec_driver_sql("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").scalar()
            )
            meta = sa.MetaData()
            meta.reflect(conn)
            self.tables = list(meta.sorted_tables)
            self.rows = {t.name: [dict(r) for r in conn.execute(sa.select(t)).mappings()] for t in self.tables}
            self.sequences = conn.execute(
                sa.text(
                    "SELECT quote_ident(schemaname) || '.' || quote_ident(sequencename), start_value, last_value"
                    " FROM pg_sequences WHERE schemaname = current_schema()"
                )
            ).all()

    def reset(self) -> None:
        with self.engine.begin() as conn:
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # no triggers on this connection
            for t in reversed(self.tables):
                conn.execute(sa.delete(t))
            for t in self.tables:
                if self.rows[t.name]:
                    conn.execute(sa.insert(t), self.rows[t.name])
            for name, start, last in self.sequences:
                conn.execute(
                    sa.text("SELECT setval(:n, :v, :called)"),
                    {"n": name, "v": start if last is None else last, "called": last is not None},
                )

    def __call__(self) -> Implementation:
        if not self.can_reset:
            return sql_factory(self.dbs)()
        self.reset()
        return _implementation(self.url, lambda: None)

    def close(self) -> None:
        self.engine.dispose()
        self.dbs.drop(self.url)


_sqlite_dbs: Any = None


def sqlite() -> Implementation:
    """A fresh SQLite database per call, in a temporary folder removed at exit."""
    global _sqlite_dbs
    if _sqlite_dbs is None:
        from atmostonce_sql.testing import SqliteDatabases

        _sqlite_dbs = SqliteDatabases()
        atexit.register(_sqlite_dbs.close)
    return sql_factory(_sqlite_dbs)()
