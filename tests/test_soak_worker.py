"""A bounded worker soak (the hour-long one is ``make soak-worker``, docs/soak.md): worker processes on
PostgreSQL, the database restarted under them and workers SIGKILLed, faults on the platform; no duplicate,
every intent in a declared state and settled, the audit intact."""

from __future__ import annotations

import pytest

from tests.soak_worker import run_soak


@pytest.mark.postgres
@pytest.mark.slow
def test_a_short_worker_soak_with_restarts_and_sigkills_sends_nothing_twice():
    r = run_soak(12, workers=2, rate=3.0, restart_every=5.0, kill_every=4.0, settle_seconds=150, seed=1, progress=None)
    assert r["db_restarts"] >= 1 and r["worker_kills"] >= 1  # the chaos happened
    assert r["submitted"] > 0 and r["faults"]
    assert r["duplicates"] == 0 and r["published_without_object"] == 0
    assert r["undeclared_states"] == [] and r["settled"] and r["audit_intact"]
    assert r["worker_exits"]["clean"] == 2 and r["ok"]
