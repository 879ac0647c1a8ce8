"""The CLI passes the operator of every policy command into the store's policy log, edits the
duplicate-text window (``policy text-window``), prints the log (``policy log``), and names the operator
of a ``retry`` in its history row (docs/design.md#policy-changes-are-on-the-record)."""

from __future__ import annotations

import json

import pytest

from atmostonce_cli.main import EXIT_OK, EXIT_USAGE, main
from tests.helpers import run_cli, to_state


def test_every_policy_command_logs_its_operator(capsys, cli_db):
    url, store = cli_db
    for argv in (
        ["kill-switch", "acct", "on", "--operator", "ann"],
        ["rate-limit", "acct", "3", "--window", "30", "--operator", "bob"],
        ["credential", "acct", "cred-2", "--operator", "cy"],
        ["contract", "http", "--clear", "--operator", "di"],
        ["signing", "acct", "on", "--operator", "ed"],
        ["text-window", "600", "--operator", "flo"],
    ):
        rc, _, _ = run_cli(capsys, "policy", *argv, "--database-url", url)
        assert rc == EXIT_OK, argv
    assert [(c.kind, c.name, c.value, c.operator) for c in reversed(store.policy_changes())] == [
        ("kill_switches", "account:acct", True, "ann"),
        ("rate_limits", "acct", {"max_sends": 3, "window_seconds": 30.0}, "bob"),
        ("credentials", "acct", "cred-2", "cy"),
        ("contracts", "http", None, "di"),
        ("signing", "acct", True, "ed"),
        ("text_window_seconds", "global", 600, "flo"),
    ]
    assert store.policies()["text_window_seconds"] == 600
    rc, out, _ = run_cli(capsys, "--json", "policy", "log", "--limit", "2", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK
    assert [(c["kind"], c["operator"]) for c in doc["changes"]] == [("text_window_seconds", "flo"), ("signing", "ed")]
    rc, out, _ = run_cli(capsys, "policy", "log", "--database-url", url)
    assert rc == EXIT_OK and len(out.strip().splitlines()) == 6


@pytest.mark.parametrize("argv", [["policy", "text-window", "600"], ["policy", "signing", "acct", "on"]])
def test_a_policy_command_without_an_operator_is_refused_by_the_parser(capsys, cli_db, argv):
    url, store = cli_db
    with pytest.raises(SystemExit) as e:
        main([*argv, "--database-url", url])
    assert e.value.code == EXIT_USAGE and store.policy_changes() == []


@pytest.mark.parametrize(
    "argv",
    [["text-window", "600", "--operator", " "], ["text-window", "0", "--operator", "ann"]],
    ids=["blank", "zero"],
)
def test_a_blank_operator_or_a_window_that_is_not_positive_is_bad_input(capsys, cli_db, argv):
    url, store = cli_db
    rc, out, _ = run_cli(capsys, "--json", "policy", *argv, "--database-url", url)
    assert rc == EXIT_USAGE and "error" in json.loads(out)
    assert store.policy_changes() == [] and store.policies()["text_window_seconds"] == 86_400


def test_retry_names_the_operator_in_the_history_row(capsys, cli_db):
    url, store = cli_db
    it, _ = to_state(store, "failed")
    rc, out, _ = run_cli(capsys, "retry", it.key, "--operator", "ann", "--database-url", url)
    assert rc == EXIT_OK and "pending" in out
    last = store.history(it.key)[-1]
    assert (last.event, last.actor, last.detail["operator"]) == ("retry", "operator:ann", "ann")
