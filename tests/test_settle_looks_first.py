"""Bulk settle looks first (docs/design.md#a-lookup-must-answer-for-its-key): ``atmostonce settle --as
resend|not-sent`` and the console's settle page, given a platform, look each selected intent up under every key
its attempts were sent under before moving it. One the platform holds is not moved (result ``found``, nothing
written); the others move and the worker posts one copy each. On json-server, a REST server nobody here wrote
that does not deduplicate."""

from __future__ import annotations

import json
import re
import socket

import pytest

from atmostonce.identity import platform_idempotency_key
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_STORE
from tests.helpers import landed_late, run_cli, settle_parked, to_state

AS_ = {"resend": "pending", "not-sent": "failed"}


@pytest.mark.parametrize("as_", sorted(AS_))
def test_a_post_that_landed_late_is_not_settled_and_the_others_are_sent_once(capsys, cli_on_json_server, as_):
    store, url, server, cfg = cli_on_json_server
    late, _ = to_state(store, "parked", text="landed after the lookups")
    lost, _ = to_state(store, "parked", text="never landed")
    remote_id = landed_late(server, store, late.key)
    before = [h.event for h in store.history(late.key)]
    rc, results = settle_parked(capsys, url, "--as", as_, "--platform-config", cfg)
    assert rc == EXIT_REFUSED
    assert results[late.key]["result"] == "found"
    assert results[late.key]["found"] == {
        "key": late.key,
        "remote_id": remote_id,
        "platform_key": platform_idempotency_key(late.key, 0, 0),
    }
    assert [h.event for h in store.history(late.key)] == before and store.get(late.key).state == "parked"
    assert results[lost.key]["result"] == "moved" and results[lost.key]["state_after"] == AS_[as_]
    assert results[lost.key]["lookup"] == {"looked_up": [platform_idempotency_key(lost.key, 0, 0)], "why": None}
    rc, _, _ = run_cli(capsys, "--json", "work", "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_OK and store.get(lost.key).state == "published"
    assert sorted(p["text"] for p in server.posts()) == ["landed after the lookups", "never landed"]


def test_without_a_platform_config_each_resent_intent_says_it_was_not_looked_up(capsys, cli_on_json_server):
    store, url, _, _ = cli_on_json_server
    a, _ = to_state(store, "parked", text="no config", account="acct-a")
    b, _ = to_state(store, "parked", text="no config either", account="acct-b")
    rc, results = settle_parked(capsys, url, "--as", "resend", "--account", "acct-a")
    assert rc == EXIT_OK
    assert results[a.key]["lookup"] == {"looked_up": [], "why": "no platform to look it up"}
    rc, out, _ = run_cli(
        capsys, "settle", "--state", "parked", "--account", "acct-b", "--as", "resend", "--operator", "alice",
        "--reason", "r", "--yes", "--database-url", url,
    )  # fmt: skip
    assert rc == EXIT_OK and store.get(b.key).state == "pending"
    assert out.splitlines()[-1] == "1 to be sent again NOT looked up on the platform first: no --platform-config"


def test_parking_looks_nothing_up(capsys, cli_on_json_server):
    store, url, _, cfg = cli_on_json_server
    it, _ = to_state(store, "indeterminate", text="unknown")
    argv = ["--json", "settle", "--state", "indeterminate", "--as", "park", "--operator", "alice", "--reason", "r"]
    rc, out, _ = run_cli(capsys, *argv, "--yes", "--platform-config", cfg, "--database-url", url)
    (result,) = json.loads(out)["results"]
    assert rc == EXIT_OK and result["result"] == "moved" and result["lookup"] is None
    assert store.get(it.key).state == "parked"


def test_a_platform_that_does_not_answer_settles_nothing(capsys, cli_on_json_server, tmp_path):
    store, url, _, cfg = cli_on_json_server
    a, _ = to_state(store, "parked", text="one")
    b, _ = to_state(store, "parked", text="two")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = tmp_path / "down.json"
    with open(cfg) as f:
        down.write_text(json.dumps(json.load(f) | {"base_url": f"http://127.0.0.1:{port}"}))
    rc, results = settle_parked(capsys, url, "--as", "resend", "--platform-config", str(down))
    assert rc == EXIT_STORE  # as a single resend's: no answer from the platform
    assert {k: (r["result"], r["lookup_failed"]) for k, r in results.items()} == {
        a.key: ("error", True),
        b.key: ("error", True),
    }
    assert [store.get(k).state for k in (a.key, b.key)] == ["parked", "parked"]


def test_the_console_settle_page_looks_first_when_it_has_a_platform(sql_store, tmp_path):
    from tests.console.conftest import console_on_json_server, sign_in

    store = sql_store
    late, _ = to_state(store, "parked", text="landed late")
    lost, _ = to_state(store, "parked", text="never landed")
    with console_on_json_server(store, tmp_path) as (server, c):
        remote_id = landed_late(server, store, late.key)
        csrf = sign_in(c)
        keys = f"{late.key} {lost.key}"
        r = c.post("/settle", data={"csrf": csrf, "as": "resend", "keys": keys, "reason": "looked", "confirm": "yes"})
        logged = {row["subject"]: row["result"] for row in c.log.rows() if row["action"] == "settle:resend"}
    results = dict(re.findall(r'class="settle-result" data-key="([0-9a-f]+)" data-result="(\w+)"', r.text))
    assert results == {late.key: "found", lost.key: "moved"}
    assert f'data-remote-id="{remote_id}"' in r.text
    assert [store.get(k).state for k in (late.key, lost.key)] == ["parked", "pending"]
    assert logged[late.key] == {
        "found": {"key": late.key, "remote_id": remote_id, "platform_key": platform_idempotency_key(late.key, 0, 0)}
    }
    assert logged[lost.key] == {"done": {"state": "pending", "looked_up": [platform_idempotency_key(lost.key, 0, 0)]}}
