"""The shipped claims machine (``atmostonce.testing.claims_stateful``) on the model alone and against
SQLite and PostgreSQL, step by step (docs/design.md#approvals-and-per-target-dispatch-claims)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from atmostonce.testing.claims_stateful import make_claims_machine
from tests.conformance.factories import sql_factory

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
    machine = make_claims_machine(sql_factory(dbs))
    machine.TestCase.settings = PROFILE
    machine.TestCase().runTest()


@pytest.mark.slow
def test_sqlite_agrees_with_the_model(sqlite_databases):
    _run(sqlite_databases)


@pytest.mark.postgres
def test_postgresql_agrees_with_the_model(pg_databases):
    _run(pg_databases)
