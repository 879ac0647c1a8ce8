"""Test-only: a SQL store whose database clock is a one-row table the test sets (tests/conftest.py,
``set_clock_store``)."""

from __future__ import annotations

import sqlalchemy as sa

from atmostonce_sql import SqlStore


class SetClockStore(SqlStore):
    """The database clock reads ``aom_test_clock``; ``set_clock(t)`` sets it (seconds since the epoch)."""

    def __init__(self, engine):
        super().__init__(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE TABLE aom_test_clock (t double precision NOT NULL)")
            conn.exec_driver_sql("INSERT INTO aom_test_clock VALUES (0)")
        self._now = sa.select(sa.column("t", sa.Float(53))).select_from(sa.table("aom_test_clock")).scalar_subquery()

    def set_clock(self, t: float) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text("UPDATE aom_test_clock SET t = :t"), {"t": t})

    def close(self) -> None:  # the fixture owns the engine
        if isinstance(self._autocommit, sa.engine.Engine) and self._autocommit is not self.engine:
            self._autocommit.dispose()
