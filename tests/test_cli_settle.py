"""``atmostonce settle``: a dry run lists the selection and moves nothing; ``--yes`` settles each selected intent
by its own guarded store move under the operator, and reports every key (docs/console.md, bulk settle)."""

from __future__ import annotations

import json

from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from tests.helpers import run_cli, to_state


def test_settle_without_yes_lists_the_selection_and_moves_nothing(capsys, cli_db):
    url, store = cli_db
    a, _ = to_state(store, "parked", text="a", account="acct-a")
    to_state(store, "parked", text="b", account="acct-b")
    args = ["--state", "parked", "--account", "acct-a", "--as", "not-sent", "--operator", "alice", "--reason", "r"]
    rc, out, err = run_cli(capsys, "--json", "settle", *args, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["dry_run"] is True
    assert [(p["key"], p["event"], p["to"]) for p in doc["selected"]] == [(a.key, "resolve_not_sent", "failed")]
    assert store.get(a.key).state == "parked"
    rc, out, _ = run_cli(capsys, "settle", *args, "--database-url", url)
    assert "dry run" in out and a.key[:16] in out


def test_settle_yes_moves_each_key_under_the_operator(capsys, cli_db):
    url, store = cli_db
    keys = [to_state(store, "parked", text=t, account="acct-a")[0].key for t in ("a", "b", "c")]
    rc, out, _ = run_cli(
        capsys, "--json", "settle", "--state", "parked", "--as", "not-sent", "--operator", "alice",
        "--reason", "nothing on the platform", "--yes", "--database-url", url,
    )  # fmt: skip
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["dry_run"] is False
    assert {r["key"]: (r["result"], r["state_before"], r["state_after"]) for r in doc["results"]} == {
        k: ("moved", "parked", "failed") for k in keys
    }
    for k in keys:
        last = store.history(k)[-1]
        assert (last.event, last.detail["operator"], last.detail["reason"]) == (
            "resolve_not_sent", "alice", "nothing on the platform",
        )  # fmt: skip


def test_settle_reports_each_refusal_by_its_guard_and_exits_1(capsys, cli_db):
    url, store = cli_db
    failed, _ = to_state(store, "failed", text="f")
    rc, out, _ = run_cli(
        capsys, "--json", "settle", "--state", "failed", "--as", "not-sent", "--operator", "alice", "--reason", "r",
        "--yes", "--database-url", url,
    )  # fmt: skip
    [r] = json.loads(out)["results"]
    assert rc == EXIT_REFUSED
    assert (r["key"], r["result"]) == (failed.key, "refused")
    assert (r["refused"]["guard"], r["refused"]["state"], r["refused"]["event"]) == (
        "source_state",
        "failed",
        "resolve_not_sent",
    )
    assert r["refused"]["next"] == [{"event": "park", "from": "failed", "to": "parked"}]
    assert store.get(failed.key).state == "failed"


def test_settle_needs_an_operator_and_a_known_state(capsys, cli_db):
    url, _ = cli_db
    base = ["settle", "--as", "park", "--reason", "r", "--database-url", url]
    rc, _, err = run_cli(capsys, *base, "--state", "parked", "--operator", " ", "--yes")
    assert rc == EXIT_USAGE
    rc, _, err = run_cli(capsys, *base, "--state", "stuck", "--operator", "alice")
    assert rc == EXIT_USAGE and "unknown state" in err


def test_console_refuses_to_start_without_a_sign_in_token(capsys, cli_db, monkeypatch):
    url, _ = cli_db
    monkeypatch.delenv("ATMOSTONCE_CONSOLE_TOKEN", raising=False)
    rc, _, err = run_cli(capsys, "console", "--database-url", url)
    assert rc == EXIT_USAGE and "ATMOSTONCE_CONSOLE_TOKEN" in err


def test_console_listens_on_loopback_unless_told_otherwise():
    from atmostonce_cli.main import build_parser
    from atmostonce_console import is_loopback

    assert build_parser().parse_args(["console"]).host == "127.0.0.1"
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.10")
