"""The differential stateful suite (docs/design.md#the-gate-is-the-conditional-write): the model and a real database, step by step.

Runs the shipped machine (``atmostonce.testing.stateful``) against SQLite and
PostgreSQL. Profile ``ci`` (default) keeps it bounded; ``make soak`` runs the
``soak`` profile (``HYPOTHESIS_PROFILE=soak``).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from atmostonce.testing.stateful import StoreUnderTest, make_machine

settings.register_profile(
    "ci", max_examples=60, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "soak", max_examples=1500, stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
PROFILE = settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def _run(dbs):
    from atmostonce_sql import make_engine
    from atmostonce_sql.testing import SetClockStore

    def factory():
        # the machine sets this store's database clock to the model's: nothing is judged on real time
        url = dbs.fresh()
        engine = make_engine(url, pool_size=2)
        store = SetClockStore(engine)

        def close():
            store.close()
            engine.dispose()
            dbs.drop(url)

        return StoreUnderTest(store, close=close, set_clock=store.set_clock)

    machine = make_machine(factory)
    machine.TestCase.settings = PROFILE
    machine.TestCase().runTest()


def test_sqlite_agrees_with_model(sqlite_databases):
    _run(sqlite_databases)


@pytest.mark.postgres
def test_postgresql_agrees_with_model(pg_databases):
    _run(pg_databases)
