"""The shipped claims machine (``atmostonce.testing.claims_stateful``) on the model alone and against
SQLite and PostgreSQL, step by step (issue 5)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from atmostonce.testing.claims_stateful import make_claims_machine
from atmostonce.testing.stateful import StoreUnderTest

PROFILES = {
    "ci": settings(
        max_examples=40, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    ),
    "soak": settings(
        max_examples=800, stateful_step_count=80, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    ),
}
PROFILE = PROFILES.get(os.environ.get("HYPOTHESIS_PROFILE", "ci"), PROFILES["ci"])


def test_model_alone_keeps_the_claim_invariants():
    machine = make_claims_machine()
    machine.TestCase.settings = settings(PROFILE, max_examples=PROFILE.max_examples * 3)
    machine.TestCase().runTest()


def _run(dbs):
    from atmostonce_sql import open_store
    from atmostonce_sql.testing import age_leases

    def factory():
        url = dbs.fresh()
        store = open_store(url, migrate=False, pool_size=2)

        def close():
            store.close()
            dbs.drop(url)

        return StoreUnderTest(store, lambda s: age_leases(store, s), close)

    machine = make_claims_machine(factory)
    machine.TestCase.settings = PROFILE
    machine.TestCase().runTest()


@pytest.mark.slow
def test_sqlite_agrees_with_the_model(sqlite_databases):
    _run(sqlite_databases)


@pytest.mark.postgres
def test_postgresql_agrees_with_the_model(pg_databases):
    _run(pg_databases)
