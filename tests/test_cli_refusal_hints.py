"""A refused operator move says what to do first (docs/operations.md): ``resolve`` on an intent that is not parked
names the guard and the state, and the operator moves (from the loaded table) that lead to a state it
starts from; following the hint makes the move succeed."""

from __future__ import annotations

import json

import pytest

import atmostonce
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, main
from atmostonce_sql import open_store
from tests.helpers import to_state


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'hints.sqlite3'}"
    store = open_store(url)
    yield url, store
    store.close()


@pytest.mark.parametrize("how", [("--published", "r-1"), ("--not-sent",)], ids=["published", "not-sent"])
def test_resolve_on_an_indeterminate_intent_names_the_state_and_hints_to_park_first(capsys, db, how):
    url, store = db
    it, _ = to_state(store, "indeterminate")
    state = store.get(it.key).state
    rc, out, err = run(capsys, "--json", "resolve", it.key, "--operator", "alice", *how, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_REFUSED
    assert doc["refused"]["guard"] == "source_state" and doc["refused"]["state"] == state
    assert doc["refused"]["key"] == it.key
    table = atmostonce.table()
    [step] = doc["next"]
    assert step["command"] == "park" and step["from"] == state
    assert step["to"] in table.sources(doc["refused"]["event"])
    assert doc["hint"] and "park" in err
    assert store.get(it.key).state == state  # the refusal moved nothing
    rc, _, _ = run(capsys, step["command"], it.key, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_OK
    rc, out, _ = run(capsys, "--json", "resolve", it.key, "--operator", "alice", *how, "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["key"] == it.key


def test_a_refusal_with_no_operator_move_to_offer_has_no_hint(capsys, db):
    url, store = db
    it, _ = to_state(store, "published")
    rc, out, _ = run(capsys, "--json", "resolve", it.key, "--operator", "alice", "--not-sent", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_REFUSED and doc["refused"]["state"] == store.get(it.key).state
    assert "next" not in doc and "hint" not in doc


def test_resend_on_an_indeterminate_intent_also_hints_to_park(capsys, db):
    url, store = db
    it, _ = to_state(store, "indeterminate")
    rc, out, _ = run(capsys, "--json", "resend", it.key, "--operator", "bob", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_REFUSED and doc["refused"]["guard"] == "source_state"
    assert [s["command"] for s in doc["next"]] == ["park"]


def test_parking_a_send_in_flight_hints_to_wait_for_it_not_to_fence_a_restore(capsys, db):
    """A new user's trial: ``park`` on an authorized intent (its send on the wire) hinted "first restore_fence";
    the user declared a restore on a live database to get there, parked, resent, and the send in flight landed
    beside the second. A restore's fence is not a way around a live send: the hint says to wait for the send's
    outcome or its lease."""
    url, store = db
    it, _ = to_state(store, "authorized")
    rc, out, err = run(capsys, "--json", "park", it.key, "--operator", "alice", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_REFUSED and doc["refused"]["state"] == "authorized"
    assert "next" not in doc
    assert "lease" in doc["hint"] and "restore" not in doc["hint"]
