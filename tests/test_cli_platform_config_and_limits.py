"""Bad input to the worker commands is a clean usage error (docs/operations.md): a malformed ``--platform-config``
(missing, unreadable, not JSON, not an object, unknown fields, wrong types) exits 2 with no traceback; a
negative ``--limit`` is refused alike on SQLite and PostgreSQL; ``reconcile --limit 0`` looks nothing up."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from atmostonce import IntakeError
from atmostonce.runtime import Reconciler
from atmostonce_cli.main import EXIT_OK, EXIT_USAGE, main
from atmostonce_http import HttpPlatformConfig, PlatformSink, sink_config
from atmostonce_sql import open_store
from tests.helpers import to_state


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'cfg.sqlite3'}"
    store = open_store(url)
    yield url, store
    store.close()


BASE = {"base_url": "http://127.0.0.1:9"}
BAD_CONFIGS = {
    "not-json": "{bad",
    "not-utf8": b"\xff\xfe{}",
    "array": [1, 2],
    "string": "posts",
    "null": None,
    "unknown-field": {**BASE, "bogus": 1},
    "no-base-url": {"create_path": "/posts"},
    "headers-number": {**BASE, "headers": 5},
    "statuses-number": {**BASE, "may_exist_statuses": 5},
    "pointer-number": {**BASE, "id_pointer": 5},
    "body-pointer-number": {**BASE, "body_pointer": 5},
    "key-field-number": {**BASE, "key_field": 5},
    "verify-string": {**BASE, "verify": "no"},
    "fenced-string": {**BASE, "lookup_fenced": "yes", "lookup_path": "/posts?key={key}"},
    "trust-env-string": {**BASE, "trust_env": "x"},
    "ca-file-number": {**BASE, "ca_file": 5},
    "timeout-string": {**BASE, "connect_timeout": "5"},
    "location-string": {**BASE, "id_from_location": "no", "id_pointer": None},
}


def _write(path, content):
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str) and content.startswith("{"):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return str(path)


@pytest.mark.parametrize("command", ["work", "reconcile"])
@pytest.mark.parametrize("name", sorted(BAD_CONFIGS))
def test_a_malformed_platform_config_is_a_usage_error(capsys, db, tmp_path, name, command):
    url, _ = db
    cfg = _write(tmp_path / "platform.json", BAD_CONFIGS[name])
    rc, out, err = run(capsys, "--json", command, "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_USAGE and set(json.loads(out)) == {"error", "field", "code", "limit", "profile"}
    assert cfg in json.loads(out)["error"]  # the message names the file for the person who wrote it
    assert json.loads(out)["profile"]["path"] == cfg  # and the profile's fault, for a script


@pytest.mark.parametrize("where", ["missing", "directory"])
def test_a_platform_config_that_cannot_be_read_is_a_usage_error(capsys, db, tmp_path, where):
    url, _ = db
    cfg = str(tmp_path / "nope.json") if where == "missing" else str(tmp_path)
    rc, out, _ = run(capsys, "--json", "work", "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_USAGE and cfg in json.loads(out)["error"]


def test_a_malformed_platform_config_prints_no_traceback(db, tmp_path):
    url, _ = db
    cfg = _write(tmp_path / "platform.json", {**BASE, "headers": 5})
    cmd = [sys.executable, "-m", "atmostonce_cli.main", "work", "--platform-config", cfg, "--database-url", url]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_USAGE and "Traceback" not in proc.stderr and proc.stderr.startswith("error:")


def test_wrong_json_types_are_refused_by_the_config_itself():
    for name, bad in BAD_CONFIGS.items():
        if name in ("not-json", "not-utf8"):  # not parsed data: the CLI's JSON reading refuses those
            continue
        with pytest.raises(ValueError):
            HttpPlatformConfig.from_mapping(bad)
    good = sink_config("http://127.0.0.1:9")
    assert HttpPlatformConfig.from_mapping(json.loads(json.dumps(good.as_mapping()))) == good
    assert HttpPlatformConfig.from_mapping({**BASE, "headers": {"X-A": "b"}, "projection": {"/text": "/body"}})


def test_reconcile_limit_zero_looks_nothing_up(capsys, db, tmp_path):
    url, store = db
    it, _ = to_state(store, "indeterminate")
    before = store.get(it.key).reconcile_count
    with PlatformSink() as sink:
        cfg = _write(tmp_path / "platform.json", sink_config(sink.url).as_mapping())
        rc, out, _ = run(capsys, "--json", "reconcile", "--limit", "0", "--platform-config", cfg, "--database-url", url)
        assert rc == EXIT_OK and json.loads(out) == {}
        assert store.get(it.key).reconcile_count == before and len(store.reconciliations(it.key)) == 1
        rc, out, _ = run(capsys, "--json", "reconcile", "--limit", "1", "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_OK and sum(json.loads(out).values()) == 1  # the same intent is looked up without the 0


def test_reconciler_run_refuses_a_negative_limit_and_does_nothing_at_zero(sqlite_store):
    with PlatformSink() as sink:
        from atmostonce_http import HttpTransport

        with HttpTransport(sink_config(sink.url)) as transport:
            r = Reconciler(sqlite_store, transport)
            assert r.run(limit=0) == {}
            with pytest.raises(IntakeError):
                r.run(limit=-1)


@pytest.mark.parametrize("argv", [("work",), ("reconcile",), ("intents", "list")], ids=lambda a: a[0])
def test_a_negative_limit_is_a_usage_error_on_either_database(capsys, sql_store, tmp_path, argv):
    url = sql_store.engine.url.render_as_string(hide_password=False)
    to_state(sql_store, "pending")
    cfg = _write(tmp_path / "platform.json", sink_config("http://127.0.0.1:9").as_mapping())
    extra = () if argv[0] == "intents" else ("--platform-config", cfg)
    with pytest.raises(SystemExit) as info:
        main([*argv, "--limit", "-1", *extra, "--database-url", url])
    assert info.value.code == EXIT_USAGE
    assert "limit" in capsys.readouterr().err


@pytest.mark.parametrize("method", ["claimable", "list_intents"])
def test_the_stores_refuse_a_negative_limit_alike(sql_store, method):
    with pytest.raises(IntakeError):
        getattr(sql_store, method)(limit=-1)


def test_a_reconcile_that_parks_an_unknown_send_names_it_and_exits_3_as_work_does(capsys, db, tmp_path, monkeypatch):
    from atmostonce.runtime import RuntimeConfig
    from atmostonce_cli.main import EXIT_STORE
    from tests.http.jsonserver import JsonServer, profile

    monkeypatch.setattr(RuntimeConfig, "reconcile_interval", 0.0)  # the passes look again at once, not 1 s later
    url, store = db
    lost, _ = to_state(store, "indeterminate", text="never landed", max_reconciles=1)
    looking, _ = to_state(store, "indeterminate", text="still looking", max_reconciles=3)
    (tmp_path / "js").mkdir()
    with JsonServer(tmp_path / "js") as server:  # a REST server nobody here wrote; it holds neither post
        cfg = _write(tmp_path / "platform.json", json.dumps(profile(server.url)))
        rc, out, _ = run(capsys, "--json", "reconcile", "--platform-config", cfg, "--database-url", url)
        assert (rc, json.loads(out)) == (EXIT_OK, {"lookup.not_found": 2})  # one lookup each: nothing parked yet
        rc, out, _ = run(capsys, "--json", "reconcile", "--platform-config", cfg, "--database-url", url)
        assert rc == EXIT_STORE
        assert json.loads(out)["parked"] == [{"key": lost.key, "state": "parked"}]
        assert store.get(looking.key).state == "indeterminate"  # a lookup left: looked at again, not named
        rc, out, _ = run(capsys, "--json", "reconcile", "--platform-config", cfg, "--database-url", url)
        assert rc == EXIT_OK and "parked" not in json.loads(out)  # parked before this pass: not this pass's news


def test_a_reconcile_whose_lookups_fail_names_them_and_exits_3(capsys, db, tmp_path):
    """A platform that gives no answer (nothing listens on its port): the pass learnt nothing, so a scheduled
    reconcile must not look done. Each send is named with its error; nothing is written, no lookup is spent."""
    import socket

    from atmostonce_cli.main import EXIT_STORE
    from tests.http.jsonserver import profile

    url, store = db
    a, _ = to_state(store, "indeterminate", text="unknown one")
    b, _ = to_state(store, "indeterminate", text="unknown two")
    history = {k: len(store.history(k)) for k in (a.key, b.key)}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = _write(tmp_path / "platform.json", json.dumps(profile(f"http://127.0.0.1:{port}")))
    rc, out, _ = run(capsys, "--json", "reconcile", "--platform-config", cfg, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_STORE
    assert doc["lookup.error"] == 2
    assert sorted((f["key"], f["state"]) for f in doc["lookup_failed"]) == sorted(
        [(a.key, "indeterminate"), (b.key, "indeterminate")]
    )
    assert all(f["error"] for f in doc["lookup_failed"])
    assert {k: len(store.history(k)) for k in history} == history
    assert [store.get(k).reconcile_count for k in (a.key, b.key)] == [0, 0]


def test_a_bad_platform_profile_is_reported_with_its_code_field_and_file_under_json(capsys, db, tmp_path):
    url, _ = db
    bad = tmp_path / "orders.toml"
    bad.write_text(
        'format = 1\nname = "orders"\ntransport = "http"\noutcomes = "http_outcomes.toml"\n'
        '[http]\nbase_url = "http://127.0.0.1:9"\nread_timeout = "soon"\n'
    )
    rc, out, _ = run(capsys, "--json", "work", "--platform-config", str(bad), "--database-url", url)
    assert rc == EXIT_USAGE
    assert json.loads(out)["profile"] == {"code": "wrong_type", "where": "http.read_timeout", "path": str(bad)}
