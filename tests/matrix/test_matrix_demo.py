"""``run_matrix_demo``: the main job against Synapse through the fault proxy, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from atmostonce_matrix.demo import format_matrix_result, run_matrix_demo

# a stronger mix than the CLI's, so that sixteen intents surely meet faults
MIX = {"drop_before_forward": 0.08, "drop_after_forward": 0.1, "delay": 0.06, "reset": 0.08, "gateway_error": 0.08}


def _check(r) -> None:
    assert r.finished, r.by_state
    assert r.ok and r.duplicates == 0 and r.duplicate_keys == []
    assert r.published_without_object == 0
    assert r.intents == sum(r.by_state.values())
    assert set(k for k, v in r.by_state.items() if v) <= {"published", "parked"}
    # every event in the room belongs to exactly one intent, published or (for a person) parked
    assert r.events_in_room == r.creates == r.by_state["published"] + r.parked_with_object
    assert r.create_requests >= r.creates
    assert sum(r.faults.values()) > 0
    text = format_matrix_result(r)
    assert "events in the Matrix room" in text and "OK: at most once" in text


def test_the_demo_starts_its_own_synapse_on_sqlite():
    r = run_matrix_demo(n=16, workers=3, seed=5, fault_mix=MIX, progress=None, timeout=120)
    _check(r)
    assert r.database.startswith("sqlite:///")


@pytest.mark.postgres
def test_the_demo_on_postgresql(pg_databases, synapse):
    url = pg_databases.fresh()
    try:
        r = run_matrix_demo(
            n=16, workers=3, database_url=url, seed=7, fault_mix=MIX, progress=None, timeout=120, homeserver=synapse
        )
        _check(r)
    finally:
        pg_databases.drop(url)
    with pytest.raises(ValueError, match="at least one"):
        run_matrix_demo(n=0, homeserver=synapse)
