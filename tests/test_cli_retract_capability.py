"""A retraction on a platform that cannot delete no longer waits in the queue for ever (docs/operations.md): with
``--platform-config`` ``retract`` refuses it before anything is queued (``RetractionUnsupported``, exit 1,
``--json`` ``unsupported`` with the table's outcome for it); without one the output says the capability was
not checked; and a ``work`` pass names each queued retraction its transport cannot carry."""

from __future__ import annotations

import json

import pytest

from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, main
from atmostonce_http import PlatformSink, sink_config
from atmostonce_sql import open_store


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def published(tmp_path, capsys):
    """A post published on the local sink through a ``work`` pass, the sink still running."""
    url = f"sqlite:///{tmp_path / 'retract.sqlite3'}"
    store = open_store(url)
    with PlatformSink(read_lag_seconds=0.0) as sink:
        can = tmp_path / "can-delete.json"
        can.write_text(json.dumps(sink_config(sink.url).as_mapping()))
        cannot = tmp_path / "cannot-delete.json"
        cannot.write_text(json.dumps(sink_config(sink.url, delete_path=None, update_path=None).as_mapping()))
        it = store.submit("acct", "post", "room-x", {"text": "to be taken back"})
        rc, _, _ = run(capsys, "work", "--platform-config", str(can), "--database-url", url)
        it = store.get(it.key)
        assert rc == EXIT_OK and it.remote_id in sink.objects
        yield url, store, it, sink, str(can), str(cannot)
    store.close()


@pytest.mark.parametrize("correct", [None, '{"text": "fixed"}'], ids=["delete", "correct"])
def test_retract_on_a_platform_that_cannot_retract_is_refused_before_anything_is_queued(capsys, published, correct):
    url, store, it, _, _, cannot = published
    before = len(store.list_intents(limit=100))
    extra = [] if correct is None else ["--correct", correct]
    rc, out, err = run(capsys, "--json", "retract", it.key, "--operator", "ops", "--platform-config", cannot,
                       *extra, "--database-url", url)  # fmt: skip
    doc = json.loads(out)
    assert rc == EXIT_REFUSED
    refused = doc["unsupported"]
    assert refused["key"] == it.key and refused["action"] == ("delete" if correct is None else "correct")
    # the table's outcome for it leaves the intent queued: what the refusal spares the operator
    outcome = store.table.outcomes[refused["outcome"]]
    assert store.table.states[outcome.state].kind == "initial"
    assert "delete_path" in doc["hint"] and "hint" in err
    assert len(store.list_intents(limit=100)) == before  # nothing queued


def test_retract_on_a_platform_that_can_delete_is_queued_and_a_work_pass_deletes_the_object(capsys, published):
    url, store, it, sink, can, _ = published
    rc, out, _ = run(capsys, "--json", "retract", it.key, "--operator", "ops", "--platform-config", can,
                     "--database-url", url)  # fmt: skip
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["capability_checked"] is True
    rc, out, _ = run(capsys, "--json", "work", "--platform-config", can, "--database-url", url)
    assert rc == EXIT_OK and "cannot_retract" not in json.loads(out)
    assert store.table.states[store.get(doc["key"]).state].terminal and it.remote_id not in sink.objects


def test_retract_without_a_platform_config_says_the_capability_was_not_checked(capsys, published):
    url, _, it, _, _, _ = published
    rc, out, _ = run(capsys, "--json", "retract", it.key, "--operator", "ops", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["capability_checked"] is False
    rc, out, _ = run(capsys, "retract", it.key, "--operator", "ops", "--database-url", url)
    assert rc == EXIT_OK and "not checked" in out


def test_work_names_a_queued_retraction_its_transport_cannot_carry(capsys, published):
    url, store, it, sink, _, cannot = published
    rc, out, _ = run(capsys, "--json", "retract", it.key, "--operator", "ops", "--database-url", url)
    key = json.loads(out)["key"]
    rc, out, _ = run(capsys, "--json", "work", "--platform-config", cannot, "--database-url", url)
    doc = json.loads(out)
    [named] = doc["cannot_retract"]
    assert rc == EXIT_OK and named["key"] == key
    assert store.table.states[store.table.outcomes[named["outcome"]].state].kind == "initial"
    assert store.table.states[store.get(key).state].kind == "initial" and it.remote_id in sink.objects
    rc, out, _ = run(capsys, "work", "--platform-config", cannot, "--database-url", url)
    assert f"park {key[:16]}" in out
    rc, _, _ = run(capsys, "park", key, "--operator", "ops", "--database-url", url)  # the way out it names
    assert rc == EXIT_OK and store.table.states[store.get(key).state].kind == "human_owned"
