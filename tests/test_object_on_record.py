"""An object the store already records for an intent is not sent again by a person's move, and is read back by
the reconciler before it asks a person (docs/design.md#late-outcomes-are-evidence). Found by a new user's trial
against their own orders server: a send answered after its lease (the answer kept as a late outcome, with the
order's id) was parked once its lookups were spent, and ``resend``, ``resolve --not-sent`` and bulk ``settle``
each posted a second order; an intent whose read-back differed (its ``remote_id`` recorded) was resent the
same way. On json-server, a REST server nobody here wrote that does not deduplicate."""

from __future__ import annotations

import json

import pytest

from atmostonce import IllegalMove
from atmostonce.runtime import Reconciler, RuntimeConfig, Sweeper
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED
from atmostonce_http import HttpTransport
from tests.helpers import begin_authorize, landed_late, run_cli, settle_parked, submit
from tests.http.jsonserver import JsonServer, profile


def _answered_after_its_lease(store, server, text, max_reconciles=3):
    """A send whose lease lapsed (the sweeper made it unknown) and whose post landed; the worker's late answer,
    refused by the store, is kept as a late outcome with the post's id. Returns (key, remote id)."""
    from atmostonce_sql.testing import age_leases

    it = submit(store, text=text, max_reconciles=max_reconciles)
    lease = begin_authorize(store, it.key)
    age_leases(store, 60)
    assert Sweeper(store).sweep_leases()["expired"] == 1
    remote_id = landed_late(server, store, it.key)
    with pytest.raises(IllegalMove) as refused:
        store.record_success(lease, remote_id=remote_id, response_digest="d" * 64)
    store.record_late_outcome(lease, outcome="send.success", refused=refused.value, remote_id=remote_id)
    return it.key, remote_id


def test_the_reconciler_reads_back_a_late_success_after_its_lookups_are_spent(sql_store, tmp_path):
    store = sql_store
    it = submit(store, text="answered after the last lookup", max_reconciles=1)
    (tmp_path / "js").mkdir()
    with JsonServer(tmp_path / "js") as server, HttpTransport(profile(server.url)) as t:
        from atmostonce_sql.testing import age_leases

        lease = begin_authorize(store, it.key)
        age_leases(store, 60)
        Sweeper(store).sweep_leases()
        reconciler = Reconciler(store, t, RuntimeConfig(reconcile_interval=0))
        assert reconciler.run() == {"lookup.not_found": 1}  # the only lookup: the post has not landed yet
        remote_id = landed_late(server, store, it.key)
        with pytest.raises(IllegalMove) as refused:
            store.record_success(lease, remote_id=remote_id, response_digest="d" * 64)
        store.record_late_outcome(lease, outcome="send.success", refused=refused.value, remote_id=remote_id)
        assert reconciler.run() == {"lookup.found": 1}
        assert len(server.posts()) == 1
    after = store.get(it.key)
    assert (after.state, after.remote_id) == ("published", remote_id)


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
def test_a_late_success_on_record_refuses_sending_again_even_without_a_platform(capsys, cli_on_json_server, command):
    store, url, server, _ = cli_on_json_server
    key, remote_id = _answered_after_its_lease(store, server, "landed after its lease")
    store.park(key, operator="alice")
    before = [h.event for h in store.history(key)]
    argv = [command[0], key, *command[1:], "--operator", "alice", "--database-url", url]
    rc, out, _ = run_cli(capsys, "--json", *argv)
    assert rc == EXIT_REFUSED
    assert json.loads(out)["on_record"] == {"key": key, "remote_id": remote_id, "recorded_as": "late_outcome"}
    assert [h.event for h in store.history(key)] == before and store.get(key).state == "parked"
    rc, _, _ = run_cli(capsys, "--json", *argv, "--despite-object", remote_id)  # the person names it: their call
    assert rc == EXIT_OK and store.get(key).state in ("pending", "failed")


def test_a_remote_id_on_record_refuses_a_resend(capsys, cli_on_json_server):
    store, url, server, _ = cli_on_json_server
    it = submit(store, text="its read-back differed")
    lease = begin_authorize(store, it.key)
    remote_id = landed_late(server, store, it.key)
    store.record_success(lease, remote_id=remote_id, response_digest="d" * 64)
    store.read_back_failed(lease, reason="read_back.differs")
    store.park(it.key, operator="alice")
    rc, out, _ = run_cli(capsys, "--json", "resend", it.key, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_REFUSED
    assert json.loads(out)["on_record"] == {"key": it.key, "remote_id": remote_id, "recorded_as": "remote_id"}
    rc, _, _ = run_cli(
        capsys, "resend", it.key, "--operator", "alice", "--despite-object", "another-id", "--database-url", url
    )
    assert rc == EXIT_REFUSED and store.get(it.key).state == "parked"  # naming another object is no consent


@pytest.mark.parametrize("as_", ["resend", "not-sent", "park"])
def test_the_settle_dry_run_names_the_object_on_record_of_a_move_that_sends_again(capsys, cli_on_json_server, as_):
    store, url, server, _ = cli_on_json_server
    key, remote_id = _answered_after_its_lease(store, server, "landed after its lease")
    store.park(key, operator="alice")
    other = submit(store, text="never sent")
    store.park(other.key, operator="alice")
    rc, out, _ = run_cli(
        capsys, "--json", "settle", "--state", "parked", "--as", as_, "--operator", "alice", "--reason", "r",
        "--database-url", url,
    )  # fmt: skip
    assert rc == EXIT_OK
    selected = {p["key"]: p["on_record"] for p in json.loads(out)["selected"]}
    sends_again = as_ != "park"
    assert selected == {key: [remote_id] if sends_again else [], other.key: []}
    rc, out, _ = run_cli(
        capsys,
        "settle",
        "--state",
        "parked",
        "--as",
        as_,
        "--operator",
        "alice",
        "--reason",
        "r",
        "--database-url",
        url,
    )
    assert (f"object {remote_id} on record" in out) == sends_again
    assert {store.get(k).state for k in (key, other.key)} == {"parked"}  # a dry run writes nothing


def test_bulk_settle_leaves_an_intent_with_an_object_on_record(capsys, cli_on_json_server):
    store, url, server, _ = cli_on_json_server
    key, remote_id = _answered_after_its_lease(store, server, "landed after its lease")
    store.park(key, operator="alice")
    other = submit(store, text="never sent")
    store.park(other.key, operator="alice")
    rc, results = settle_parked(capsys, url, "--as", "resend")
    assert rc == EXIT_REFUSED
    assert results[key]["result"] == "found"
    assert results[key]["found"] == {"key": key, "remote_id": remote_id, "recorded_as": "late_outcome"}
    assert results[other.key]["result"] == "moved"
    assert store.get(key).state == "parked"


def test_the_console_refuses_sending_again_an_intent_with_an_object_on_record(sql_store, tmp_path):
    import re

    from tests.console.conftest import console_on_json_server, sign_in

    with console_on_json_server(sql_store, tmp_path) as (server, c):
        key, remote_id = _answered_after_its_lease(sql_store, server, "landed after its lease")
        sql_store.park(key, operator="alice")
        csrf = sign_in(c)
        r = c.post(f"/intents/{key}/resend", data={"csrf": csrf, "reason": "looked"})
        posts = len(server.posts())
    flash = dict(re.findall(r'data-([a-z]+)="([^"]*)"', re.search(r'id="flash"([^>]*)>', r.text).group(1)))
    assert flash == {"result": "on_record", "remote": remote_id}
    assert sql_store.get(key).state == "parked" and posts == 1
