"""Which argument an operation reports as refused (IntakeError.field / .code), and the outcome field of the
move log record, on the model, SQLite and PostgreSQL."""

from __future__ import annotations

import logging

import pytest

from atmostonce import IntakeError
from atmostonce.errors import IntakeCode
from tests.helpers import to_state


@pytest.fixture
def store(any_store):
    return any_store.store


def test_read_back_failed_reports_bad_evidence_as_the_evidence_argument(store):
    it, lease = to_state(store, "authorized")
    store.record_success(lease, remote_id="r-1")
    with pytest.raises(IntakeError) as e:
        store.read_back_failed(lease, reason="read_back.differs", evidence=["not", "an", "object"])
    assert (e.value.field, e.value.code) == ("evidence", IntakeCode.NOT_OBJECT)
    assert store.get(it.key).state == "authorized"


def test_resolve_published_reports_bad_evidence_as_the_evidence_argument(store):
    it, _ = to_state(store, "parked")
    with pytest.raises(IntakeError) as e:
        store.resolve_published(it.key, operator="alice", remote_id="r-1", evidence="seen it")
    assert (e.value.field, e.value.code) == ("evidence", IntakeCode.NOT_OBJECT)
    assert store.get(it.key).state == "parked"


def test_the_move_log_record_names_the_outcome_the_table_maps_to_a_move_without_a_reason(store, caplog):
    caplog.set_level(logging.INFO, logger="atmostonce.moves")
    it, lease = to_state(store, "authorized")
    store.record_success(lease, remote_id="r-1")
    caplog.clear()
    store.confirm_read_back(lease)
    recs = [r for r in caplog.records if r.name == "atmostonce.moves"]
    assert [(r.event, r.state, r.outcome) for r in recs] == [("confirm_read_back", "published", "read_back.match")]


def test_a_source_that_is_not_a_pair_is_refused_and_nothing_is_stored(store):
    with pytest.raises(IntakeError) as info:
        store.submit("acct", "post", "room-1", {"text": "about one"}, source="https://example.org/a")
    assert (info.value.field, info.value.code) == ("source", IntakeCode.WRONG_TYPE)
    assert store.list_intents() == []
