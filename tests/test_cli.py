"""The command line: the demo main job, operator commands, exit codes and --json (docs/design.md#the-runtime)."""

from __future__ import annotations

import json

import pytest

from atmostonce_cli.main import main
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
    yield url, store
    store.close()


@pytest.mark.slow
def test_demo_publishes_without_duplicates_on_sqlite(capsys):
    rc, out, err = run(capsys, "--json", "demo", "--intents", "30", "--workers", "3", "--timeout", "90")
    result = json.loads(out)
    assert rc == 0 and result["ok"] is True
    assert result["duplicates"] == 0
    assert result["intents"] == 30 and sum(result["by_state"].values()) == 30
    assert result["by_state"]["published"] + result["by_state"]["parked"] == 30
    assert result["creates"] >= result["by_state"]["published"]


@pytest.mark.postgres
def test_demo_runs_on_postgresql(capsys, pg_databases):
    url = pg_databases.fresh()
    try:
        rc, out, _ = run(capsys, "--json", "demo", "-n", "20", "--database-url", url, "--timeout", "90")
        result = json.loads(out)
        assert rc == 0 and result["duplicates"] == 0 and result["intents"] == 20
    finally:
        pg_databases.drop(url)


def test_demo_refuses_a_database_that_already_holds_intents(capsys, db):
    url, store = db
    to_state(store, "pending")
    rc, _, err = run(capsys, "demo", "-n", "5", "--database-url", url)
    assert rc == 2 and "empty database" in err


def test_intents_list_and_show(capsys, db):
    url, store = db
    it, _ = to_state(store, "indeterminate")
    rc, out, _ = run(capsys, "intents", "list", "--state", "indeterminate", "--database-url", url)
    assert rc == 0 and it.key[:16] in out and "indeterminate" in out
    rc, out, _ = run(capsys, "--json", "intents", "show", it.key[:12], "--database-url", url)
    data = json.loads(out)
    assert rc == 0 and data["intent"]["key"] == it.key
    assert [h["event"] for h in data["history"]] == ["submit", "begin", "authorize_dispatch", "record_unknown"]
    assert [h["seq"] for h in data["history"]] == sorted(h["seq"] for h in data["history"])
    [rec] = data["reconciliations"]
    assert (rec["result"], rec["send_seq"], rec["event"]) == ("unknown", data["history"][-1]["seq"], "record_unknown")
    rc, out, _ = run(capsys, "intents", "show", it.key, "--database-url", url)
    assert "SEQ" in out and "record_unknown" in out
    assert "reconciliation of unknown sends" in out and "unknown" in out.split("reconciliation of")[1]


def test_audit_verify_and_grant_app_role_on_sqlite(capsys, db):
    url, store = db
    to_state(store, "published")
    rc, out, _ = run(capsys, "audit", "verify", "--database-url", url)
    assert rc == 0 and "every chain intact" in out
    rc, _, err = run(capsys, "db", "grant-app-role", "app", "--database-url", url)
    assert rc == 2 and "PostgreSQL" in err  # SQLite has no roles: bad input, not a store failure


def test_retry_is_refused_except_from_failed(capsys, db):
    url, store = db
    it, _ = to_state(store, "indeterminate")
    rc, _, err = run(capsys, "retry", it.key, "--operator", "alice", "--database-url", url)
    assert rc == 1 and "source_state" in err
    failed, _ = to_state(store, "failed", text="other")
    rc, out, _ = run(capsys, "retry", failed.key, "--operator", "alice", "--database-url", url)
    assert rc == 0 and "pending" in out


def test_park_resolve_and_resend(capsys, db):
    url, store = db
    it, _ = to_state(store, "indeterminate")
    assert run(capsys, "park", it.key, "--operator", "alice", "--database-url", url)[0] == 0
    rc, out, _ = run(
        capsys, "--json", "resolve", it.key, "--operator", "alice", "--published", "r-77", "--database-url", url
    )
    assert rc == 0 and json.loads(out)["state"] == "published" and json.loads(out)["remote_id"] == "r-77"
    other, _ = to_state(store, "parked", text="again")
    rc, out, _ = run(capsys, "--json", "resend", other.key, "--operator", "bob", "--database-url", url)
    assert rc == 0 and json.loads(out)["resend_epoch"] == 1


def test_bad_input_gives_clean_errors(capsys, db):
    url, _ = db
    rc, _, err = run(capsys, "intents", "list", "--state", "sort_of", "--database-url", url)
    assert rc == 2 and "unknown state" in err
    rc, _, err = run(capsys, "intents", "show", "nope", "--database-url", url)
    assert rc == 2 and "at least 8 characters" in err
    rc, _, err = run(capsys, "intents", "show", "0123456789abcdef", "--database-url", url)
    assert rc == 2 and "no intent has a key starting with" in err
    rc, _, err = run(capsys, "intents", "list", "--database-url", "mysql://x/y")
    assert rc == 2
    rc, out, err = run(capsys, "--json", "intents", "list", "--database-url", "sqlite:////nonexistent/dir/x.db")
    assert rc == 3 and "cannot open the database" in err and "store_error" in json.loads(out)
    rc, _, err = run(capsys, "db", "upgrade", "--database-url", "sqlite://x.sqlite3")
    assert rc == 2 and "malformed" in err
    rc, _, err = run(capsys, "intents", "list", "--database-url", "")
    assert rc == 2 and "empty" in err
    rc, _, err = run(capsys, "demo", "--crash-rate", "2")
    assert rc == 2 and "probability" in err
    with pytest.raises(SystemExit) as e:
        main(["resolve", "k"])
    assert e.value.code == 2


def test_db_upgrade_and_spec_check(capsys, tmp_path):
    rc, out, _ = run(capsys, "db", "upgrade", "--database-url", f"sqlite:///{tmp_path / 'new.sqlite3'}")
    assert rc == 0 and "0017" in out  # the newest migration
    rc, out, _ = run(capsys, "spec", "check")
    assert rc == 0 and "all checks pass" in out


def test_piping_into_a_closed_reader_exits_quietly(tmp_path):
    import subprocess
    import sys

    url = f"sqlite:///{tmp_path / 'p.sqlite3'}"
    store = open_store(url)
    for i in range(300):
        store.submit("acct", "post", "t", {"text": f"p{i}"})
    store.close()
    cmd = f"{sys.executable} -m atmostonce_cli.main intents list --limit 300 --database-url {url} | head -1"
    proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=60)
    assert "Traceback" not in proc.stderr and proc.stdout.startswith("KEY")


def test_work_command_dispatches_through_a_platform_config(capsys, db, tmp_path):
    from atmostonce_http import PlatformSink, sink_config

    url, store = db
    it, _ = to_state(store, "pending")
    with PlatformSink() as sink:
        cfg = tmp_path / "platform.json"
        cfg.write_text(json.dumps(sink_config(sink.url).as_mapping()))
        rc, out, _ = run(capsys, "--json", "work", "--platform-config", str(cfg), "--database-url", url)
        assert rc == 0 and json.loads(out) == {"read_back.match": 1}
        assert sink.creates == 1
    assert store.get(it.key).state == "published"


def test_sweep_command(capsys, db):
    url, store = db
    to_state(store, "authorized")
    rc, out, _ = run(capsys, "--json", "sweep", "--database-url", url)
    assert rc == 0 and json.loads(out) == {"expired": 0, "abandoned": 0, "skipped": 0}


def test_approve_list_withdraw_and_show_the_claim(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'c.sqlite3'}"
    store = open_store(url)
    it = store.submit("acct", "post", "room-c", {"text": "gated"}, requires_approval=True)
    store.close()
    rc, out, _ = run(
        capsys, "approve", it.key[:12], "--approver", "alice", "--expires-in", "600", "--database-url", url
    )
    assert rc == 0 and "by alice" in out
    approval_id = out.split()[0]
    rc, out, _ = run(capsys, "approvals", it.key, "--database-url", url, "--json")
    assert rc == 0 and json.loads(out)[0]["approval_id"] == approval_id and json.loads(out)[0]["state"] == "approved"
    rc, out, _ = run(capsys, "approve", it.key, "--approver", " ", "--expires-in", "600", "--database-url", url)
    assert rc == 1  # refused by approver_identified
    rc, out, _ = run(capsys, "claim", "show", "room-c", "--database-url", url)
    assert rc == 0 and "claim free" in out and "approve" in out
    rc, out, _ = run(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == 0 and f"{approval_id} approved by alice" in out and "target claim: free" in out
    rc, out, _ = run(capsys, "withdraw", approval_id, "--operator", "ops", "--database-url", url)
    assert rc == 1  # refused by withdrawal_attributable: ops is not the approver and gives no reason
    rc, out, _ = run(capsys, "withdraw", approval_id, "--operator", "ops", "--reason", "stale", "--database-url", url)
    assert rc == 0 and "withdrawn" in out
    rc, out, _ = run(capsys, "withdraw", approval_id, "--operator", "ops", "--database-url", url)
    assert rc == 1


def test_retract_queues_a_retraction_of_a_published_intent(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'r.sqlite3'}"
    store = open_store(url)
    it, _ = to_state(store, "published")
    pending = store.submit("acct", "post", "room-r", {"text": "not sent"})
    store.close()
    rc, out, _ = run(capsys, "retract", it.key, "--operator", "ops", "--database-url", url)
    assert rc == 0 and "retract.delete" in out and "queued (pending)" in out
    rc, out, _ = run(
        capsys,
        "retract",
        it.key,
        "--correct",
        '{"text": "fixed"}',
        "--operator",
        "ops",
        "--database-url",
        url,
        "--json",
    )
    assert rc == 0 and json.loads(out)["request"]["correction"] == {"text": "fixed"}
    rc, _, err = run(capsys, "retract", pending.key, "--operator", "ops", "--database-url", url)
    assert rc == 2 and "only a published intent" in err
    rc, _, err = run(capsys, "retract", it.key, "--correct", "not json", "--operator", "ops", "--database-url", url)
    assert rc == 2


def test_policy_rate_limit_sets_and_clears(capsys, tmp_path):
    url = f"sqlite:///{tmp_path / 'rl.sqlite3'}"
    rc, out, _ = run(
        capsys, "policy", "rate-limit", "acct", "3", "--window", "30", "--operator", "ops", "--database-url", url
    )
    assert rc == 0 and "3 sends per 30 s" in out
    store = open_store(url)
    try:
        a, b, c, d = (store.submit("acct", "post", f"r{i}", {"text": f"t{i}"}) for i in range(4))
        for it in (a, b, c):
            store.authorize_dispatch(store.begin(it.key), request_digest=it.request_digest)
        assert store.rate_limited("acct")
    finally:
        store.close()
    rc, out, _ = run(
        capsys, "--json", "policy", "rate-limit", "acct", "--clear", "--operator", "ops", "--database-url", url
    )
    assert rc == 0 and json.loads(out)["cleared"] is True and json.loads(out)["max_sends"] is None
    store = open_store(url)
    try:
        assert not store.rate_limited("acct")
    finally:
        store.close()
    rc, _, _ = run(capsys, "policy", "rate-limit", "acct", "0", "--operator", "ops", "--database-url", url)
    assert rc == 2


def test_intents_show_lists_a_late_outcome_kept_as_evidence(capsys, db):
    from atmostonce import IllegalMove

    url, store = db
    it, lease = to_state(store, "indeterminate")
    with pytest.raises(IllegalMove) as late:
        store.record_success(lease, remote_id="obj-late-7")
    store.record_late_outcome(lease, outcome="send.success", refused=late.value, remote_id="obj-late-7")
    rc, out, _ = run(capsys, "--json", "intents", "show", it.key, "--database-url", url)
    [ev] = json.loads(out)["late_outcomes"]
    assert rc == 0 and (ev["outcome"], ev["remote_id"], ev["refused_by"]) == (
        "send.success",
        "obj-late-7",
        "source_state",
    )
    rc, out, _ = run(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == 0 and "obj-late-7" in out and "record_success:source_state" in out
