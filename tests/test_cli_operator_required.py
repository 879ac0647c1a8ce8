"""Every operator command names its person (docs/operations.md): ``retract``, ``policy rate-limit``, ``policy
credential`` and ``policy contract`` require a non-blank ``--operator`` like park and resolve, and write
nothing without one; ``rate-limit --clear`` reports that the limit was cleared."""

from __future__ import annotations

import json

import pytest

from atmostonce import IntakeCode
from atmostonce.records import MAX_TEXT_CHARS
from atmostonce_cli.main import EXIT_OK, EXIT_USAGE, main
from atmostonce_sql import open_store
from tests.helpers import to_state


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'ops.sqlite3'}"
    store = open_store(url)
    published, _ = to_state(store, "published")
    yield url, store, published
    store.close()


def _commands(key):
    return {
        "retract": ["retract", key],
        "rate-limit": ["policy", "rate-limit", "acct", "3"],
        "rate-limit-clear": ["policy", "rate-limit", "acct", "--clear"],
        "credential": ["policy", "credential", "acct", "v2"],
        "credential-clear": ["policy", "credential", "acct", "--clear"],
        "contract": ["policy", "contract", "sink", "c1"],
        "contract-clear": ["policy", "contract", "sink", "--clear"],
    }


NAMES = sorted(_commands("k"))


@pytest.mark.parametrize("name", NAMES)
def test_an_operator_command_without_operator_is_a_usage_error(capsys, db, name):
    url, store, published = db
    argv = _commands(published.key)[name]
    with pytest.raises(SystemExit) as info:
        main([*argv, "--database-url", url])
    assert info.value.code == EXIT_USAGE and "--operator" in capsys.readouterr().err
    assert len(store.list_intents(limit=1000)) == 1  # nothing was queued


@pytest.mark.parametrize("blank", ["", "   "])
@pytest.mark.parametrize("name", NAMES)
def test_a_blank_operator_is_refused_and_writes_nothing(capsys, db, name, blank):
    url, store, published = db
    argv = _commands(published.key)[name]
    rc, out, _ = run(capsys, "--json", *argv, "--operator", blank, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_USAGE and (doc["field"], doc["code"], doc["limit"]) == ("operator", IntakeCode.EMPTY, None)
    assert len(store.list_intents(limit=1000)) == 1
    with store.engine.connect() as conn:  # no policy row was written either
        for table in ("aom_rate_limits", "aom_credentials", "aom_contracts"):
            if conn.dialect.has_table(conn, table):
                assert conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar_one() == 0


@pytest.mark.parametrize("name", NAMES)
def test_a_named_operator_is_accepted_and_reported(capsys, db, name):
    url, _, published = db
    argv = _commands(published.key)[name]
    rc, out, _ = run(capsys, "--json", *argv, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["operator"] == "alice"


def test_rate_limit_clear_reports_the_limit_cleared(capsys, db):
    url, store, _ = db
    rc, out, _ = run(
        capsys, "--json", "policy", "rate-limit", "acct", "1", "--operator", "alice", "--database-url", url
    )
    assert rc == EXIT_OK and json.loads(out)["cleared"] is False and json.loads(out)["max_sends"] == 1
    rc, out, _ = run(
        capsys, "--json", "policy", "rate-limit", "acct", "--clear", "--operator", "alice", "--database-url", url
    )
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["cleared"] is True and doc["max_sends"] is None
    rc, out, _ = run(capsys, "policy", "rate-limit", "acct", "--clear", "--operator", "alice", "--database-url", url)
    assert rc == EXIT_OK and "cleared" in out and "version set" not in out
    it = store.submit("acct", "post", "room-x", {"text": "after clear"})
    store.authorize_dispatch(store.begin(it.key), request_digest=it.request_digest)
    assert not store.rate_limited("acct")


def test_an_operator_name_over_the_limit_is_refused_with_the_limit_in_the_json_error(capsys, db):
    url, store, published = db
    rc, out, _ = run(
        capsys, "--json", "policy", "rate-limit", "acct", "3", "--operator", "o" * 100_000, "--database-url", url
    )
    doc = json.loads(out)
    assert rc == EXIT_USAGE and (doc["field"], doc["code"]) == ("operator", IntakeCode.TOO_LONG)
    assert doc["limit"] == MAX_TEXT_CHARS
