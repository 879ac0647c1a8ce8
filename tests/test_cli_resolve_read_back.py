"""``resolve --published REMOTE_ID`` reads the remote id back before it is accepted (docs/operations.md): on a platform
with read-back (the local sink and json-server, a REST server nobody here wrote) an id the platform does
not have, or an object that does not hold what was approved, is refused (``NotVerified``, exit 1) and
nothing moves; ``--unverified`` accepts it and records it as asserted by the operator, not verified; without
a platform config the old behaviour stays, and the output and the history say it was not verified."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest

from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_STORE, EXIT_USAGE, main
from atmostonce_http import PlatformSink, sink_config
from atmostonce_sql import open_store
from tests.helpers import begin_authorize
from tests.http.jsonserver import JsonServer, profile

TEXT = "the post a person found"


def run(capsys, *argv):
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


class Platform:
    """A running platform: its CLI config file and a way to put an object on it as a create would."""

    def __init__(self, url: str, config: dict, post):
        self.url, self.config, self._post = url, config, post

    def create(self, body: dict) -> str:
        return self._post(body)

    def config_file(self, folder, **overrides) -> str:
        path = folder / f"platform-{len(list(folder.glob('platform-*')))}.json"
        path.write_text(json.dumps({**self.config, **overrides}))
        return str(path)


@pytest.fixture(params=["sink", "json-server"])
def platform(request, tmp_path) -> Iterator[Platform]:
    if request.param == "sink":
        with PlatformSink(read_lag_seconds=0.0) as sink:

            def post(body):
                r = httpx.post(sink.url + "/posts", json=body, headers={"Idempotency-Key": json.dumps(body)})
                return str(r.raise_for_status().json()["id"])

            yield Platform(sink.url, sink_config(sink.url).as_mapping(), post)
    else:
        (tmp_path / "js").mkdir()
        with JsonServer(tmp_path / "js") as server:

            def post(body):
                return str(httpx.post(server.url + "/posts", json=body, timeout=5).raise_for_status().json()["id"])

            yield Platform(server.url, profile(server.url), post)


@pytest.fixture
def parked(tmp_path):
    """A parked intent whose send's outcome was unknown: a person now says where the post is."""
    url = f"sqlite:///{tmp_path / 'resolve.sqlite3'}"
    store = open_store(url)
    it = store.submit("acct", "post", "room-r", {"text": TEXT})
    lease = begin_authorize(store, it.key)
    store.record_unknown(lease, reason="read timeout")
    store.park(it.key, operator="alice")
    yield url, store, store.get(it.key)
    store.close()


def _resolve(capsys, url, key, *extra):
    return run(capsys, "--json", "resolve", key, "--operator", "alice", "--database-url", url, *extra)


def test_resolve_published_reads_the_id_back_and_accepts_an_object_that_holds_what_was_approved(
    capsys, parked, platform, tmp_path
):
    url, store, it = parked
    remote = platform.create({"text": TEXT, "lang": "en"})  # the platform's own additions are not compared
    cfg = platform.config_file(tmp_path)
    rc, out, _ = _resolve(capsys, url, it.key, "--published", remote, "--platform-config", cfg)
    doc = json.loads(out)
    now = store.get(it.key)
    assert rc == EXIT_OK and doc["verified"] is True and doc["asserted_by"] is None
    assert store.table.outcomes[doc["read_back"]].state == now.state  # the read-back outcome of a confirmation
    assert now.remote_id == remote and store.table.states[now.state].terminal
    evidence = store.history(it.key)[-1].detail["evidence"]
    assert evidence == {"verified": True, "read_back": doc["read_back"], "remote_id": remote}
    rc, out, _ = run(capsys, "--json", "audit", "verify", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["intact"] is True


def test_resolve_published_refuses_an_id_the_platform_does_not_have(capsys, parked, platform, tmp_path):
    url, store, it = parked
    rows = len(store.history(it.key))
    cfg = platform.config_file(tmp_path)
    rc, out, err = _resolve(capsys, url, it.key, "--published", "99999", "--platform-config", cfg)
    doc = json.loads(out)
    assert rc == EXIT_REFUSED
    assert doc["not_verified"]["key"] == it.key and doc["not_verified"]["remote_id"] == "99999"
    outcome = store.table.outcomes[doc["not_verified"]["outcome"]]
    assert store.table.states[outcome.state].kind == "unknown"  # read back as the dispatcher does: not proof
    assert "--unverified" in doc["hint"] and "--unverified" in err
    assert store.get(it.key).state == it.state and store.get(it.key).remote_id is None
    assert len(store.history(it.key)) == rows  # nothing was written


def test_resolve_published_refuses_an_object_that_does_not_hold_what_was_approved(capsys, parked, platform, tmp_path):
    url, store, it = parked
    other = platform.create({"text": "someone else's post"})
    cfg = platform.config_file(tmp_path)
    rc, out, _ = _resolve(capsys, url, it.key, "--published", other, "--platform-config", cfg)
    doc = json.loads(out)["not_verified"]
    assert rc == EXIT_REFUSED and doc["remote_id"] == other
    assert store.table.states[store.table.outcomes[doc["outcome"]].state].kind == "unknown"
    assert doc["evidence"] == {"field": "/text", "sent": {"/text": TEXT}, "found": {"/text": "someone else's post"}}
    assert store.get(it.key).state == it.state


def test_unverified_accepts_an_id_and_records_it_as_asserted_by_the_operator(capsys, parked, platform, tmp_path):
    url, store, it = parked
    cfg = platform.config_file(tmp_path)
    rc, out, _ = _resolve(capsys, url, it.key, "--published", "99999", "--platform-config", cfg, "--unverified")
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["verified"] is False and doc["asserted_by"] == "alice" and doc["read_back"] is None
    assert store.get(it.key).remote_id == "99999"
    evidence = store.history(it.key)[-1].detail["evidence"]
    assert evidence["verified"] is False and evidence["asserted_by"] == "alice" and evidence["remote_id"] == "99999"
    assert "--unverified" in evidence["why"]


def test_resolve_published_without_a_platform_config_is_accepted_and_says_it_was_not_verified(capsys, parked):
    url, store, it = parked
    rc, out, _ = _resolve(capsys, url, it.key, "--published", "r-42")
    doc = json.loads(out)
    assert rc == EXIT_OK and doc["verified"] is False and doc["asserted_by"] == "alice"
    assert "--platform-config" in doc["why_unverified"]
    evidence = store.history(it.key)[-1].detail["evidence"]
    assert evidence["verified"] is False and evidence["asserted_by"] == "alice"
    with pytest.raises(SystemExit):
        main(["resolve", "--help"])
    assert "--unverified" in capsys.readouterr().out
    rc, out, _ = run(capsys, "intents", "show", it.key, "--database-url", url)
    assert rc == EXIT_OK and "verified" in out


def test_resolve_published_on_a_platform_without_read_back_is_refused_unless_unverified(capsys, parked, tmp_path):
    url, store, it = parked
    cfg = tmp_path / "no-read-back.json"
    cfg.write_text(json.dumps({"base_url": "http://127.0.0.1:9", "read_back_path": None}))
    rc, out, _ = _resolve(capsys, url, it.key, "--published", "r-1", "--platform-config", str(cfg))
    doc = json.loads(out)["not_verified"]
    assert rc == EXIT_REFUSED and doc["outcome"] in store.table.outcomes and doc["evidence"] is None
    assert store.get(it.key).state == it.state
    rc, out, _ = _resolve(capsys, url, it.key, "--published", "r-1", "--platform-config", str(cfg), "--unverified")
    assert rc == EXIT_OK and json.loads(out)["verified"] is False


def test_a_read_back_that_gets_no_answer_is_a_platform_error_and_moves_nothing(capsys, parked, tmp_path):
    url, store, it = parked
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "down.json"
    cfg.write_text(json.dumps(sink_config(f"http://127.0.0.1:{port}", connect_timeout=1.0).as_mapping()))
    rc, out, _ = _resolve(capsys, url, it.key, "--published", "r-1", "--platform-config", str(cfg))
    assert rc == EXIT_STORE and "read-back" in json.loads(out)["platform_error"]
    assert store.get(it.key).state == it.state


def test_unverified_without_published_is_a_usage_error(capsys, parked):
    url, store, it = parked
    rc, out, _ = _resolve(capsys, url, it.key, "--not-sent", "--unverified")
    assert rc == EXIT_USAGE and "--unverified" in json.loads(out)["error"]
    assert store.get(it.key).state == it.state


def test_resolve_published_on_an_intent_that_is_not_parked_is_refused_by_its_state_before_any_read_back(
    capsys, tmp_path
):
    url = f"sqlite:///{tmp_path / 'early.sqlite3'}"
    store = open_store(url)
    it = store.submit("acct", "post", "room-e", {"text": TEXT})
    store.record_unknown(begin_authorize(store, it.key), reason="read timeout")
    state = store.get(it.key).state
    with PlatformSink(read_lag_seconds=0.0) as sink:
        cfg = tmp_path / "sink.json"
        cfg.write_text(json.dumps(sink_config(sink.url).as_mapping()))
        rc, out, _ = _resolve(capsys, url, it.key, "--published", "99999", "--platform-config", str(cfg))
    doc = json.loads(out)
    assert rc == EXIT_REFUSED and doc["refused"]["guard"] == "source_state" and doc["refused"]["state"] == state
    assert [s["command"] for s in doc["next"]] == ["park"] and "not_verified" not in doc
    store.close()
