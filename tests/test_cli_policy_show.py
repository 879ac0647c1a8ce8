"""Every policy in one place (docs/operations.md): ``policy show [--account A]`` prints the kill switches, rate limits,
credential and contract versions, signing policy and the duplicate-text window, in text and ``--json``;
a policy for an account (or a contract for a platform) the store has never seen is written but warned
(``--json``: ``warning`` naming it), so a misspelled name is not accepted silently."""

from __future__ import annotations

import json

import pytest

from atmostonce_cli.main import EXIT_OK, EXIT_STORE, main
from atmostonce_sql import open_store
from tests.helpers import to_state


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


@pytest.fixture
def db(tmp_path):
    url = f"sqlite:///{tmp_path / 'policy.sqlite3'}"
    store = open_store(url)
    it, _ = to_state(store, "pending")  # the store has seen account "acct"
    yield url, store, it.account
    store.close()


def _set_everything(capsys, url, account):
    for argv in (
        ["policy", "kill-switch", account, "on", "--operator", "ops"],
        ["policy", "rate-limit", account, "3", "--window", "30", "--operator", "ops"],
        ["policy", "credential", account, "cred-2", "--operator", "ops"],
        ["policy", "contract", "http", "c-7", "--operator", "ops"],
        ["policy", "signing", account, "on", "--operator", "ops"],
    ):
        rc, _, _ = run(capsys, *argv, "--database-url", url)
        assert rc == EXIT_OK


def test_policy_show_lists_every_policy_in_json(capsys, db):
    url, store, account = db
    rc, out, _ = run(capsys, "--json", "policy", "show", "--database-url", url)
    empty = json.loads(out)
    assert rc == EXIT_OK
    assert {k: empty[k] for k in ("kill_switches", "rate_limits", "credentials", "contracts", "signing")} == {
        "kill_switches": {},
        "rate_limits": {},
        "credentials": {},
        "contracts": {},
        "signing": {},
    }
    assert empty["text_window_seconds"] == store.text_window_seconds
    _set_everything(capsys, url, account)
    rc, out, _ = run(capsys, "--json", "policy", "show", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["account"] is None and "warning" not in doc
    assert doc["kill_switches"] == {f"account:{account}": True}
    assert doc["rate_limits"][account]["max_sends"] == 3 and doc["rate_limits"][account]["window_seconds"] == 30
    assert doc["rate_limits"][account]["used"] == 0
    assert doc["credentials"] == {account: "cred-2"}
    assert doc["contracts"] == {"http": "c-7"}
    assert doc["signing"] == {account: True}
    assert doc["text_window_seconds"] == store.text_window_seconds
    assert doc["database"] == url


def test_policy_show_for_one_account_keeps_global_and_platform_policies(capsys, db):
    url, store, account = db
    _set_everything(capsys, url, account)
    store.submit("other", "post", "room-o", {"text": "x"})
    for argv in (["kill-switch", "global", "on"], ["rate-limit", "other", "9"], ["credential", "other", "o-1"]):
        assert run(capsys, "policy", *argv, "--operator", "ops", "--database-url", url)[0] == EXIT_OK
    rc, out, _ = run(capsys, "--json", "policy", "show", "--account", account, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["account"] == account
    assert doc["kill_switches"] == {"global": True, f"account:{account}": True}
    assert list(doc["rate_limits"]) == [account] and doc["credentials"] == {account: "cred-2"}
    assert doc["contracts"] == {"http": "c-7"} and doc["signing"] == {account: True}


def test_policy_show_text_names_each_policy(capsys, db):
    url, _, account = db
    _set_everything(capsys, url, account)
    rc, out, _ = run(capsys, "policy", "show", "--database-url", url)
    assert rc == EXIT_OK
    for needle in (f"account:{account} on", "3 sends per 30 s", "cred-2", "http c-7", "duplicate-text window"):
        assert needle in out


def test_policy_show_refuses_a_missing_sqlite_file(capsys, tmp_path):
    missing = tmp_path / "nope.sqlite3"
    rc, _, _ = run(capsys, "policy", "show", "--database-url", f"sqlite:///{missing}")
    assert rc == EXIT_STORE and not missing.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["kill-switch", "acct-typo", "on", "--operator", "ops"],
        ["rate-limit", "acct-typo", "3", "--operator", "ops"],
        ["credential", "acct-typo", "v2", "--operator", "ops"],
        ["signing", "acct-typo", "on", "--operator", "ops"],
    ],
    ids=["kill-switch", "rate-limit", "credential", "signing"],
)
def test_a_policy_for_an_account_the_store_never_saw_is_written_but_warned(capsys, db, argv):
    url, store, account = db
    rc, out, err = run(capsys, "--json", "policy", *argv, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["warning"]["unknown_account"] == "acct-typo" and "acct-typo" in err
    kind = {"kill-switch": "kill_switches", "rate-limit": "rate_limits", "credential": "credentials"}
    kind["signing"] = "signing"
    pol = store.policies()[kind[argv[0]]]
    assert "acct-typo" in pol or "account:acct-typo" in pol  # written all the same
    rc, out, _ = run(capsys, "--json", "policy", *argv, "--database-url", url)
    assert rc == EXIT_OK and "warning" not in json.loads(out)  # a policy names it now: known
    rc, out, _ = run(capsys, "--json", "policy", argv[0], account, *argv[2:], "--database-url", url)
    assert rc == EXIT_OK and "warning" not in json.loads(out)


def test_a_contract_for_a_platform_no_transport_is_named_is_written_but_warned(capsys, db):
    url, store, _ = db
    rc, out, err = run(capsys, "--json", "policy", "contract", "htp", "c1", "--operator", "ops", "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["warning"]["unknown_platform"] == "htp" and "htp" in err
    assert store.policies()["contracts"] == {"htp": "c1"}
    rc, out, _ = run(capsys, "--json", "policy", "contract", "http", "c1", "--operator", "ops", "--database-url", url)
    assert rc == EXIT_OK and "warning" not in json.loads(out)


def test_policy_show_for_an_unknown_account_warns(capsys, db):
    url, _, _ = db
    rc, out, _ = run(capsys, "--json", "policy", "show", "--account", "nobody", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["warning"]["unknown_account"] == "nobody"


def test_every_store_reports_its_policies_alike(any_store):
    s = any_store.store
    assert not s.has_account("acct")
    s.submit("acct", "post", "room-p", {"text": "p"})
    s.set_kill_switch("account:acct", True, operator="ops")
    s.set_rate_limit("acct", 2, window_seconds=10)
    s.set_credential_version("acct", "v1")
    s.set_contract_version("http", "c1")
    s.set_signing_required("acct", True)
    s.set_signing_required("gone", True)
    s.set_signing_required("gone", False)
    assert s.has_account("acct") and not s.has_account("acct2")
    assert s.policies() == {
        "kill_switches": {"account:acct": True},
        "rate_limits": {"acct": {"max_sends": 2, "window_seconds": 10.0, "window_start": None, "used": 0}},
        "credentials": {"acct": "v1"},
        "contracts": {"http": "c1"},
        "signing": {"acct": True},
        "text_window_seconds": s.text_window_seconds,
    }


def test_a_policy_set_on_a_path_with_no_database_names_the_new_database_it_created(capsys, tmp_path):
    """A kill switch set on a mistyped path creates a new, empty database there (documented), which no worker
    reads: the command says so on stderr, naming the file, so the operator does not believe sends are stopped."""
    path = tmp_path / "mistyped.sqlite3"
    rc, _, err = run(
        capsys, "policy", "kill-switch", "global", "on", "--operator", "ops", "--database-url", f"sqlite:///{path}"
    )
    assert rc == EXIT_OK and path.exists()
    assert f"note: created a new, empty database at {path}" in err
    rc, _, err = run(
        capsys, "policy", "kill-switch", "global", "off", "--operator", "ops", "--database-url", f"sqlite:///{path}"
    )
    assert rc == EXIT_OK and "created a new" not in err


def test_db_upgrade_on_a_path_with_no_database_names_the_new_database_it_created(capsys, tmp_path):
    """As the README says of every command that creates one (a new user found ``db upgrade`` silent)."""
    path = tmp_path / "new.sqlite3"
    rc, _, err = run(capsys, "db", "upgrade", "--database-url", f"sqlite:///{path}")
    assert rc == EXIT_OK and path.exists()
    assert f"note: created a new, empty database at {path}" in err
    rc, _, err = run(capsys, "db", "upgrade", "--database-url", f"sqlite:///{path}")
    assert rc == EXIT_OK and "created a new" not in err
