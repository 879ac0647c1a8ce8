"""From an adversarial review of a person's look-first (docs/design.md#a-lookup-must-answer-for-its-key):

* a platform whose lookup answers 200 with JSON nested too deeply for the parser (``RecursionError``) made the
  single ``resend`` and ``resolve --not-sent`` end in a traceback (exit 1, read as "refused") and the console's
  intent page answer 500, with nothing in its action log; bulk settle already took it as a failed lookup;
* a transport whose lookup returns something that is no lookup answer (a plugin's ``None``) made the console's
  intent page answer 500 (its ``TypeError`` escaped);
* ``--despite-object X`` with ``--platform-config`` could never go through while the platform still held X: the
  look found X and refused the very copy the person had decided to send.

The platforms are a raw socket server and json-server (a REST server nobody here wrote)."""

from __future__ import annotations

import http.server
import json

import pytest

from atmostonce.identity import platform_idempotency_key
from atmostonce.names import STATE
from atmostonce.runtime import wire_request
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_STORE
from atmostonce_http import HttpTransport
from tests.helpers import answer_json, begin_authorize, http_platform, run_cli, submit, to_state
from tests.http.jsonserver import profile

DEEP = b"[" * 100_000 + b"]" * 100_000


class _Deep(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        answer_json(self, 200, DEEP)

    def log_message(self, *a):
        pass


@pytest.fixture
def deep_platform(tmp_path):
    with http_platform(_Deep) as srv:
        url = f"http://127.0.0.1:{srv.server_address[1]}"
        cfg = tmp_path / "deep.json"
        cfg.write_text(json.dumps(profile(url)))
        yield url, str(cfg)


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "not-sent"])
def test_a_lookup_answer_nested_too_deeply_to_parse_is_a_platform_error_exit_3(capsys, cli_db, deep_platform, command):
    url, store = cli_db
    it, _ = to_state(store, STATE.parked, text=f"deep answer {command[0]}")
    rc, out, _ = run_cli(
        capsys, "--json", *command, it.key, "--operator", "alice", "--platform-config", deep_platform[1],
        "--database-url", url,
    )  # fmt: skip
    assert rc == EXIT_STORE
    assert "platform_error" in json.loads(out)
    assert store.get(it.key).state == STATE.parked


def _resend_in_the_console(store, key, tmp_path, platform):
    """A person's resend of ``key`` on the console's intent page: (status code, the action log's resend rows)."""
    from tests.console.conftest import make_client, sign_in

    with make_client(store, tmp_path, platform=platform) as c:
        csrf = sign_in(c)
        r = c.post(f"/intents/{key}/resend", data={"csrf": csrf, "reason": "looked"}, follow_redirects=False)
        return r.status_code, [e for e in c.log.rows() if e.get("action") == "resend"]


def test_the_console_shows_a_lookup_answer_it_cannot_parse_as_an_error_and_logs_it(sql_store, tmp_path, deep_platform):
    it, _ = to_state(sql_store, STATE.parked, text="deep answer in the console")
    status, logged = _resend_in_the_console(
        sql_store, it.key, tmp_path, lambda: HttpTransport(profile(deep_platform[0]))
    )
    assert status == 303 and len(logged) == 1
    assert sql_store.get(it.key).state == STATE.parked


def test_the_console_takes_a_lookup_that_answers_none_as_a_failed_lookup(sql_store, tmp_path):
    class NoneLookup(HttpTransport):
        def lookup(self, *a, **kw):
            return None

    it, _ = to_state(sql_store, STATE.parked, text="a plugin's None")
    status, logged = _resend_in_the_console(
        sql_store, it.key, tmp_path, lambda: NoneLookup(profile("http://127.0.0.1:9"))
    )
    assert status == 303 and len(logged) == 1
    assert sql_store.get(it.key).state == STATE.parked


def test_despite_object_goes_ahead_past_the_object_it_names_and_no_other(capsys, cli_on_json_server):
    store, url, server, cfg = cli_on_json_server
    it = submit(store, text="a wrong post")
    lease = begin_authorize(store, it.key)
    with HttpTransport(profile(server.url)) as t:
        remote_id = t.send(wire_request(store.get(it.key))).remote_id  # on the platform under the intent's key
    store.record_success(lease, remote_id=remote_id)
    store.read_back_failed(lease, reason="read back timed out")
    store.park(it.key, operator="bob")
    base = ["--json", "resend", it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url]
    rc, out, _ = run_cli(capsys, *base, "--despite-object", "another-id")
    assert rc == EXIT_REFUSED and json.loads(out)["on_record"]["remote_id"] == remote_id
    # from a new user's trial: the hint said which id they named wrongly, and its resolve reads the object back
    hint = json.loads(out)["hint"]
    assert hint.startswith("another-id is not the object on record")
    assert f"--published {remote_id} --platform-config FILE" in hint
    rc, out, _ = run_cli(capsys, *base, "--despite-object", remote_id)
    assert rc == EXIT_OK, out
    assert json.loads(out)["lookup"]["despite_found"] == {
        "remote_id": remote_id,
        "platform_key": platform_idempotency_key(it.key, 0, 0),
    }
    assert store.get(it.key).state == STATE.pending
    assert len(server.posts()) == 1  # the person's copy is sent by the worker, not by the command


def test_an_interrupt_after_a_keys_move_committed_reports_where_that_key_is(capsys, cli_db, monkeypatch):
    """A Ctrl-C landing after a key's move committed, before the store call returned: the interrupted settle's
    report said "the rest were not settled" while that intent had been sent again. It now reads the key it
    stopped at again and reports it (``--json``: ``stopped_at``)."""
    from atmostonce_sql.store import SqlStore

    url, store = cli_db
    it, _ = to_state(store, STATE.parked, text="interrupted after its commit")
    real = SqlStore.resend

    def resend_then_interrupt(self, *a, **kw):
        real(self, *a, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(SqlStore, "resend", resend_then_interrupt)
    argv = ["--json", "settle", "--state", "parked", "--as", "resend", "--operator", "alice", "--reason", "r", "--yes"]
    with pytest.raises(KeyboardInterrupt):
        run_cli(capsys, *argv, "--database-url", url)
    doc = json.loads(capsys.readouterr().out)
    assert (doc["interrupted"], doc["results"]) == (True, [])
    assert doc["stopped_at"] == {"key": it.key, "state_before": STATE.parked, "state_now": STATE.pending}


def test_a_bulk_settle_whose_store_gives_no_answer_exits_3_as_a_single_resend_does(capsys, cli_db, monkeypatch):
    from atmostonce import StoreError
    from atmostonce_sql.store import SqlStore

    url, store = cli_db
    it, _ = to_state(store, STATE.parked, text="the store went away")

    def no_answer(self, *a, **kw):
        raise StoreError("the database is not answering")

    monkeypatch.setattr(SqlStore, "resend", no_answer)
    rc, out, _ = run_cli(
        capsys, "--json", "settle", "--state", "parked", "--as", "resend", "--operator", "alice", "--reason", "r",
        "--yes", "--database-url", url,
    )  # fmt: skip
    assert rc == EXIT_STORE
    (result,) = json.loads(out)["results"]
    assert (result["key"], result["result"], result["store_failed"], result["lookup_failed"]) == (
        it.key, "error", True, False,
    )  # fmt: skip
    monkeypatch.undo()
    rc, out, _ = run_cli(capsys, "--json", "resend", it.key, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_OK  # nothing was written: it is still parked for the next run


def test_the_settle_dry_run_counts_what_would_move_and_what_would_be_refused(capsys, cli_db):
    """From a new user's trial: ``settle --state parked --as park`` listed every row as "no park from parked" and
    ended "2 intent(s) selected; ... add --yes to settle them", which then refused them all."""
    url, store = cli_db
    for i in range(2):
        to_state(store, STATE.parked, text=f"parked {i}")
    base = ["settle", "--state", "parked", "--operator", "alice", "--reason", "r", "--database-url", url]
    rc, out, _ = run_cli(capsys, *base, "--as", "park")
    assert rc == EXIT_OK
    assert out.splitlines()[-1].startswith("2 intent(s) selected: 0 would move, 2 would be refused (no park from")
    rc, out, _ = run_cli(capsys, *base, "--as", "resend")
    assert out.splitlines()[-1].startswith("2 intent(s) selected: 2 would move; nothing settled")
    assert {store.get(k.key).state for k in store.list_intents(state=STATE.parked)} == {STATE.parked}
