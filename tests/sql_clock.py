"""Test-only: the set-clock SQL store (``atmostonce_sql.testing.SetClockStore``) under its old import path,
used by tests/conftest.py's ``set_clock_store``."""

from atmostonce_sql.testing import SetClockStore

__all__ = ["SetClockStore"]
