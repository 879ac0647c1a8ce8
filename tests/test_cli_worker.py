"""``atmostonce worker``, ``submit`` and ``status`` (docs/operations.md): a config file checked field by field
(a bad one is a usage error, exit 2, naming the field), a worker process that publishes what is queued and
drains on SIGTERM, a submit that is idempotent from an argument or stdin, and status figures."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atmostonce_cli.main import main
from atmostonce_http import PlatformSink
from tests.worker_proc import SINK_PROFILE, WorkerProcess, write_config


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def sqlite_url(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'w.sqlite3'}"
    assert run(capsys, "db", "upgrade", "--database-url", url)[0] == 0
    return url


BAD_CONFIGS = [
    ("platform = 3\n", "platform"),
    ("workers = 0\n", "workers"),
    ("workers = true\n", "workers"),
    ("wrokers = 2\n", "wrokers"),
    ("[intervals]\npoll_seconds = -1\n", "intervals.poll_seconds"),
    ("[intervals]\npol_seconds = 1\n", "intervals.pol_seconds"),
    ("[runtime]\nlease_seconds = 0\n", "runtime.lease_seconds"),
    ("[runtime]\nretries_per_tick = 1.5\n", "runtime.retries_per_tick"),
    ("[credentials]\nacct = 2\n", "credentials.acct"),
    ('[logging]\nlevel = "LOUD"\n', "logging.level"),
    ('drain_seconds = "soon"\n', "drain_seconds"),
    ("[platform_overrides]\nbase_url = 5\n", "platform"),
]


@pytest.mark.parametrize(("body", "field"), BAD_CONFIGS)
def test_a_bad_worker_config_is_a_usage_error_naming_the_field(capsys, tmp_path, body, field):
    cfg = tmp_path / "w.toml"
    head = "" if body.startswith("platform =") else f"platform = {json.dumps(str(SINK_PROFILE))}\n"
    cfg.write_text(head + body)
    rc, _, err = run(capsys, "--json", "worker", "--config", str(cfg))
    assert rc == 2
    assert f"field {field}:" in err


@pytest.mark.parametrize(
    ("body", "why"),
    [(None, "No such file"), ("platform = [", "not TOML"), ("workers = 2\n", "field platform: required")],
)
def test_an_unreadable_or_incomplete_worker_config_is_a_usage_error(capsys, tmp_path, body, why):
    cfg = tmp_path / "w.toml"
    if body is not None:
        cfg.write_text(body)
    rc, _, err = run(capsys, "worker", "--config", str(cfg))
    assert rc == 2 and why in err


def test_a_worker_config_with_a_non_http_profile_is_refused(capsys, tmp_path):
    cfg = tmp_path / "w.toml"
    cfg.write_text('platform = "matrix"\n')
    rc, _, err = run(capsys, "worker", "--config", str(cfg))
    assert rc == 2 and "field platform:" in err and "matrix profile" in err


def test_submit_is_idempotent_from_an_argument_or_stdin(capsys, sqlite_url):
    rc, out, _ = run(capsys, "submit", "--database-url", sqlite_url, "acct", "post", "room", '{"text": "hi"}')
    assert rc == 0
    key = out.strip()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "atmostonce_cli.main",
            "submit",
            "--database-url",
            sqlite_url,
            "--json",
            "acct",
            "post",
            "room",
            "-",
        ],
        input='{"text": "hi"}',
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["key"] == key and doc["state"] == "pending" and doc["request"] == {"text": "hi"}
    rc, out, _ = run(capsys, "--json", "intents", "list", "--database-url", sqlite_url)
    assert [it["key"] for it in json.loads(out)["intents"]] == [key]


@pytest.mark.parametrize(("payload", "why"), [("{not json", "not JSON"), ("[1, 2]", "JSON object")])
def test_submit_refuses_a_payload_that_is_not_a_json_object(capsys, sqlite_url, payload, why):
    rc, _, err = run(capsys, "submit", "--database-url", sqlite_url, "acct", "post", "room", payload)
    assert rc == 2 and why in err


def test_status_prints_counts_and_the_age_of_the_oldest_parked_intent(capsys, sqlite_url):
    from atmostonce_sql import open_store

    store = open_store(sqlite_url)
    try:
        a = store.submit("acct", "post", "room", {"text": "one"})
        store.submit("acct", "post", "room", {"text": "two"})
        store.park(a.key, operator="alice")
    finally:
        store.close()
    rc, out, _ = run(capsys, "--json", "status", "--database-url", sqlite_url)
    assert rc == 0
    fig = json.loads(out)
    assert fig["states"]["pending"] == 1 and fig["states"]["parked"] == 1
    assert fig["oldest_age_seconds"]["parked"] >= 0 and fig["oldest_age_seconds"]["indeterminate"] is None
    rc, out, _ = run(capsys, "status", "--database-url", sqlite_url)
    assert rc == 0 and "parked" in out and "oldest waiting" in out


def test_a_worker_process_holding_the_credential_version_publishes_the_queue_and_drains_on_sigterm(
    tmp_path, sqlite_url
):
    from atmostonce_sql import open_store

    with PlatformSink(dedupe=False) as sink:
        store = open_store(sqlite_url)
        keys = [store.submit("acct", "post", "room", {"text": f"zq-body {i}"}).key for i in range(5)]
        store.set_credential_version("acct", "v2")  # the before-byte gate compares what the worker holds
        cfg = write_config(
            tmp_path / "w.toml",
            sqlite_url,
            sink.url,
            workers=2,
            intervals={"poll_seconds": 0.1},
            credentials={"acct": "v2"},
        )
        w = WorkerProcess(cfg)
        try:
            w.wait_for(lambda r: r.get("event") == "worker.start", what="start record")
            for k in keys:  # one structured record per move, with the fields a person searches by
                rec = w.wait_for(
                    lambda r, k=k: r.get("key") == k and r.get("event") == "confirm_read_back", what=f"publish of {k}"
                )
                assert rec["state"] == "published" and rec["outcome"] == "read_back.match"
                assert rec["attempt"] == 1 and isinstance(rec["generation"], int)
            rc, report = w.terminate()
        finally:
            w.close()
        assert rc == 0
        assert report["dispatched"] == {"read_back.match": 5} and report["still_running"] == 0
        assert w.events("worker.drain") and w.events("worker.stop")[0]["outcome"] == "drained"
        assert all(store.get(k).state == "published" for k in keys)
        assert sink.creates == 5
        # nothing secret in the log: no request text, no attempt token
        tokens = {a.attempt_token for k in keys for a in store.attempts(k)}
        text = json.dumps(w.records)
        assert "zq-body" not in text and not any(t in text for t in tokens)
        store.close()


def test_a_worker_on_a_sqlite_file_that_does_not_exist_exits_with_a_store_error_at_once(tmp_path):
    """A mistyped path is not an outage: waiting does not make the file appear, so the worker refuses it (exit 3,
    naming the path) instead of retrying for ever, and leaves no empty database behind."""
    missing = tmp_path / "no-such-folder-typo.sqlite3"
    cfg = write_config(tmp_path / "w.toml", f"sqlite:///{missing}", "http://127.0.0.1:9/")
    proc = subprocess.run(
        [sys.executable, "-m", "atmostonce_cli.main", "worker", "--config", str(cfg)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3
    assert str(missing) in proc.stderr
    assert not missing.exists()


def test_submit_takes_the_lookup_budget_of_an_unknown_send(capsys, sqlite_url):
    rc, out, _ = run(
        capsys, "--json", "submit", "--database-url", sqlite_url, "--max-reconciles", "7", "--max-attempts", "2",
        "acct", "post", "room", '{"text": "slow platform"}',
    )  # fmt: skip
    assert rc == 0
    it = json.loads(out)
    assert (it["max_reconciles"], it["max_attempts"]) == (7, 2)
