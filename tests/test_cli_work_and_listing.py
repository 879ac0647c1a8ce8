"""What the worker pass and the listings tell a person (docs/operations.md): ``work`` exits non-zero and names the key
when a send's outcome stays unknown; ``intents list`` says when it cut the list at ``--limit``; ``intents
show`` prints the platform idempotency key and the request body, what is needed to find the post."""

from __future__ import annotations

import json

from atmostonce.identity import platform_idempotency_key
from atmostonce_cli.main import EXIT_OK, EXIT_STORE
from atmostonce_http import PlatformSink, sink_config
from tests.helpers import run_cli, to_state


def _config(tmp_path, sink):
    cfg = tmp_path / "platform.json"
    cfg.write_text(json.dumps(sink_config(sink.url).as_mapping()))
    return str(cfg)


def test_work_exits_non_zero_and_names_the_key_after_an_unknown_send(capsys, cli_db, tmp_path):
    url, store = cli_db
    it = store.submit("acct", "post", "room-w", {"text": "lost in the network"})
    with PlatformSink() as sink:
        sink.plan("drop_before_write")  # the connection dies: the outcome is unknown (nothing was written)
        rc, out, err = run_cli(
            capsys, "--json", "work", "--platform-config", _config(tmp_path, sink), "--database-url", url
        )
        assert sink.creates == 0
    doc = json.loads(out)
    state = store.get(it.key).state
    assert rc == EXIT_STORE
    assert doc["send.unknown"] == 1
    assert doc["unsettled"] == [{"key": it.key, "outcome": "send.unknown", "state": state}]
    assert state == "indeterminate"  # never resent: left for reconciliation or a person
    with PlatformSink() as sink:
        sink.plan("drop_before_write")
        other = store.submit("acct", "post", "room-w2", {"text": "again"})
        rc, out, _ = run_cli(capsys, "work", "--platform-config", _config(tmp_path, sink), "--database-url", url)
    assert rc == EXIT_STORE and other.key in out


def test_work_exits_zero_when_every_send_settles(capsys, cli_db, tmp_path):
    url, store = cli_db
    it = store.submit("acct", "post", "room-ok", {"text": "fine"})
    with PlatformSink() as sink:
        rc, out, _ = run_cli(
            capsys, "--json", "work", "--platform-config", _config(tmp_path, sink), "--database-url", url
        )
    assert rc == EXIT_OK and "unsettled" not in json.loads(out)
    assert store.table.states[store.get(it.key).state].terminal


def test_intents_list_says_when_it_cut_the_list_at_its_limit(capsys, cli_db):
    url, store = cli_db
    keys = [store.submit("acct", "post", f"room-{i}", {"text": f"t{i}"}).key for i in range(3)]
    rc, out, _ = run_cli(capsys, "--json", "intents", "list", "--limit", "2", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["truncated"] is True and doc["limit"] == 2
    assert [d["key"] for d in doc["intents"]] == keys[:2]
    rc, out, _ = run_cli(capsys, "--json", "intents", "list", "--limit", "3", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["truncated"] is False and len(doc["intents"]) == 3
    rc, out, err = run_cli(capsys, "intents", "list", "--limit", "2", "--database-url", url)
    assert rc == EXIT_OK and "--limit" in err and keys[2][:16] not in out
    rc, _, err = run_cli(capsys, "intents", "list", "--limit", "3", "--database-url", url)
    assert rc == EXIT_OK and err == ""


def test_intents_list_default_limit_is_reported(capsys, cli_db):
    url, store = cli_db
    rc, out, _ = run_cli(capsys, "--json", "intents", "list", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc == {"intents": [], "limit": 100, "truncated": False}


def test_intents_show_text_includes_the_idempotency_key_and_the_request_body(capsys, cli_db):
    url, store = cli_db
    it, _ = to_state(store, "indeterminate")
    fresh = store.get(it.key)
    idem = platform_idempotency_key(fresh.key, fresh.resend_epoch, fresh.fence_epoch)
    body = json.dumps(dict(fresh.request), sort_keys=True, ensure_ascii=False)
    rc, out, _ = run_cli(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == EXIT_OK and idem in out and body in out
    rc, out, _ = run_cli(capsys, "--json", "intents", "show", it.key, "--database-url", url)
    doc = json.loads(out)
    assert doc["idempotency_key"] == idem and doc["request_body"] == dict(fresh.request)
    assert doc["sent_under"] == [a.idempotency_key for a in store.attempts(it.key)]


def test_intents_show_names_the_key_a_resend_goes_out_under(capsys, cli_db):
    url, store = cli_db
    it, _ = to_state(store, "parked")
    store.resend(it.key, operator="bob")
    after = store.get(it.key)
    rc, out, _ = run_cli(capsys, "--json", "intents", "show", it.key, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and after.resend_epoch == 1
    assert doc["idempotency_key"] == platform_idempotency_key(after.key, 1, after.fence_epoch)
    assert doc["idempotency_key"] != after.key


def test_intents_show_says_nothing_was_sent_for_an_intent_with_no_attempt(capsys, cli_db):
    url, store = cli_db
    it = store.submit("acct", "post", "room-n", {"text": "still queued"})
    rc, out, _ = run_cli(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == EXIT_OK and store.get(it.key).attempt_count == 0
    assert "  not sent yet: no attempt has been opened" in out.splitlines()
    assert "sent under" not in out
    rc, out, _ = run_cli(capsys, "--json", "intents", "show", it.key, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["sent_under"] == [] and doc["attempts"] == []
    assert doc["idempotency_key"] == platform_idempotency_key(it.key, 0, 0)  # the key its first send will use


def test_intents_show_says_sent_under_once_an_attempt_was_opened(capsys, cli_db):
    url, store = cli_db
    it, _ = to_state(store, "indeterminate")
    [attempt] = store.attempts(it.key)
    rc, out, _ = run_cli(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == EXIT_OK and f"  sent under {attempt.idempotency_key}" in out.splitlines()
    assert "not sent yet" not in out


def test_work_exits_non_zero_while_an_earlier_runs_unknown_send_stays_unknown(capsys, cli_db, tmp_path):
    url, store = cli_db
    earlier, _ = to_state(store, "indeterminate")  # left unknown by an earlier run
    fresh = store.submit("acct", "post", "room-fresh", {"text": "sends fine"})
    with PlatformSink() as sink:  # its lookup is not fenced: a not-found proves nothing, the send stays unknown
        rc, out, _ = run_cli(
            capsys, "--json", "work", "--platform-config", _config(tmp_path, sink), "--database-url", url
        )
    doc = json.loads(out)
    assert store.get(earlier.key).state == "indeterminate" and store.get(fresh.key).state == "published"
    assert rc == EXIT_STORE
    assert doc["unsettled"] == [{"key": earlier.key, "outcome": None, "state": "indeterminate"}]
    with PlatformSink() as sink:
        rc, out, _ = run_cli(capsys, "work", "--platform-config", _config(tmp_path, sink), "--database-url", url)
    assert rc == EXIT_STORE and earlier.key in out and "sent before this pass, outcome still unknown" in out


def test_work_exits_non_zero_when_its_sweep_finds_a_lapsed_send_lease(capsys, cli_db, tmp_path):
    from atmostonce_sql.testing import age_leases

    url, store = cli_db
    it, _ = to_state(store, "authorized")  # a worker authorized the send and vanished: bytes may have left
    age_leases(store, 3600)
    with PlatformSink() as sink:
        rc, out, _ = run_cli(
            capsys, "--json", "work", "--platform-config", _config(tmp_path, sink), "--database-url", url
        )
        assert sink.creates == 0  # never resent
    doc = json.loads(out)
    assert store.get(it.key).state == "indeterminate"
    assert rc == EXIT_STORE and doc["unsettled"] == [{"key": it.key, "outcome": None, "state": "indeterminate"}]


def test_work_exit_code_ignores_published_and_parked_intents_of_earlier_runs(capsys, cli_db, tmp_path):
    url, store = cli_db
    published, _ = to_state(store, "published")
    parked, _ = to_state(store, "parked", text="a person has it")  # a person's now: not this pass's to report
    pending = store.submit("acct", "post", "room-p", {"text": "queued"})
    with PlatformSink() as sink:
        rc, out, _ = run_cli(
            capsys, "--json", "work", "--platform-config", _config(tmp_path, sink), "--database-url", url
        )
    assert rc == EXIT_OK and json.loads(out) == {"read_back.match": 1}
    assert [store.get(k).state for k in (published.key, parked.key, pending.key)] == [
        "published",
        "parked",
        "published",
    ]


def test_work_names_an_earlier_unknown_send_its_reconciliation_parks(capsys, cli_db, tmp_path):
    """A send left unknown by an earlier run, with one lookup allowed: the first pass spends it (not found, by an
    unfenced lookup: no proof), the next one parks the send for a person. Each pass names it, the second as now
    parked, and exits non-zero: a parked send needs a person as much as an unknown one."""
    url, store = cli_db
    earlier, _ = to_state(store, "indeterminate", max_reconciles=1)
    states = []
    with PlatformSink() as sink:
        for _ in range(2):
            with store.engine.begin() as conn:  # the reconciler's wait between two lookups of one send, passed
                conn.exec_driver_sql("UPDATE aom_intents SET updated_at = updated_at - 3600")
            rc, out, _ = run_cli(
                capsys, "--json", "work", "--platform-config", _config(tmp_path, sink), "--database-url", url
            )
            states.append((rc, json.loads(out)["unsettled"]))
        assert sink.creates == 0  # never resent
    assert store.get(earlier.key).state == "parked"
    assert states == [
        (EXIT_STORE, [{"key": earlier.key, "outcome": None, "state": "indeterminate"}]),
        (EXIT_STORE, [{"key": earlier.key, "outcome": None, "state": "parked"}]),
    ]


def test_intents_show_does_not_call_a_fenced_intent_with_no_attempt_unsent(capsys, cli_db):
    """After a restore, an intent the backup held queued may have been sent by the old store: it is fenced with
    no attempt here, and once the lookup finds it, it is published with no attempt. Neither is "not sent yet"."""
    url, store = cli_db
    it = store.submit("acct", "post", "room-f", {"text": "sent after the backup"})
    store.declare_restore(operator="alice")
    rc, out, _ = run_cli(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == EXIT_OK and store.get(it.key).state == "indeterminate"
    assert "not sent yet" not in out and "restored from a backup" in out
    plan = store.get(it.key).plan
    store.reconcile_found(plan, remote_id="p-9")
    rc, out, _ = run_cli(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == EXIT_OK and store.get(it.key).state == "published"
    assert "  no attempt recorded in this store; the platform holds it as p-9" in out.splitlines()
