"""A person's resend (and "not sent") looks the intent up on the platform first (README's resend row;
docs/design.md#a-lookup-must-answer-for-its-key). On json-server, a REST server nobody here wrote that does not
deduplicate: a post that landed late under the intent's key refuses the resend, and nothing is written; a post
that is not there lets it through, and the next worker pass posts one copy."""

from __future__ import annotations

import json

import pytest

from atmostonce.identity import platform_idempotency_key
from atmostonce.runtime import wire_request
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED
from atmostonce_http import HttpTransport
from tests.helpers import run_cli, to_state
from tests.http.jsonserver import profile


@pytest.fixture
def setup(cli_on_json_server):
    return cli_on_json_server


def _landed_late(server, store, key):
    """The intent's request as its send carried it, created on the server after the lookups gave up."""
    with HttpTransport(profile(server.url)) as t:
        return t.send(wire_request(store.get(key))).remote_id


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
def test_a_post_that_landed_late_refuses_sending_it_again_and_nothing_is_written(capsys, setup, command):
    store, url, server, cfg = setup
    it, _ = to_state(store, "parked", text="landed after the lookups")
    remote_id = _landed_late(server, store, it.key)
    before = [h.event for h in store.history(it.key)]
    argv = [*command[:1], it.key, *command[1:], "--operator", "alice", "--platform-config", cfg, "--database-url", url]
    rc, out, _ = run_cli(capsys, "--json", *argv)
    assert rc == EXIT_REFUSED
    assert json.loads(out)["found"] == {
        "key": it.key,
        "remote_id": remote_id,
        "platform_key": platform_idempotency_key(it.key, 0, 0),
    }
    assert [h.event for h in store.history(it.key)] == before and store.get(it.key).state == "parked"
    rc, out, _ = run_cli(
        capsys, "--json", "resolve", it.key, "--operator", "alice", "--published", remote_id,
        "--platform-config", cfg, "--database-url", url,
    )  # fmt: skip
    assert rc == EXIT_OK and json.loads(out)["state"] == "published"
    assert len(server.posts()) == 1


def test_a_resend_the_lookup_finds_nothing_for_goes_ahead_and_the_worker_posts_one_copy(capsys, setup):
    store, url, server, cfg = setup
    it, _ = to_state(store, "parked", text="never landed")
    rc, out, _ = run_cli(
        capsys, "--json", "resend", it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url
    )
    assert rc == EXIT_OK
    done = json.loads(out)
    assert done["state"] == "pending"
    assert done["lookup"] == {"looked_up": [platform_idempotency_key(it.key, 0, 0)], "why": None}
    rc, _, _ = run_cli(capsys, "--json", "work", "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_OK and store.get(it.key).state == "published"
    assert [p["key"] for p in server.posts()] == [platform_idempotency_key(it.key, 1, 0)]


def test_a_second_resend_looks_under_every_key_sent_and_finds_the_first_send_landed_late(capsys, setup):
    store, url, server, cfg = setup
    it, _ = to_state(store, "parked", text="first send landed late")
    first = wire_request(store.get(it.key))  # what the first attempt carried, under the original key
    rc, _, _ = run_cli(capsys, "resend", it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_OK
    lease = store.begin(it.key)  # the resend's attempt, unknown as well, then parked again
    store.authorize_dispatch(lease, request_digest=store.get(it.key).request_digest)
    store.record_unknown(lease, reason="read timeout")
    store.park(it.key, operator="alice")
    with HttpTransport(profile(server.url)) as t:
        remote_id = t.send(first).remote_id  # the first attempt's request lands now
    rc, out, _ = run_cli(
        capsys, "--json", "resend", it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url
    )
    assert rc == EXIT_REFUSED
    assert json.loads(out)["found"]["platform_key"] == platform_idempotency_key(it.key, 0, 0)
    assert json.loads(out)["found"]["remote_id"] == remote_id


def test_without_a_platform_config_the_resend_says_it_was_not_looked_up(capsys, setup):
    store, url, _, _ = setup
    it, _ = to_state(store, "parked", text="no config")
    rc, out, _ = run_cli(capsys, "--json", "resend", it.key, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["lookup"] == {"looked_up": [], "why": "no --platform-config to look it up"}
