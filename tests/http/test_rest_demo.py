"""``atmostonce demo --platform json-server`` (docs/platforms.md): the main job against json-server behind the fault proxy,
duplicates counted from json-server's own collection (never from atmostonce's counters)."""

from __future__ import annotations

import json

import pytest

from atmostonce.table import table
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_STORE, main
from atmostonce_http import jsonserver
from tests.http.jsonserver import installed

pytestmark = pytest.mark.slow  # a whole demo run against node: `make test`, not `make quick`


def _demo(capsys, *extra):
    rc = main(["--json", "demo", "--platform", "json-server", "-n", "20", "--workers", "2", *extra])
    return rc, json.loads(capsys.readouterr().out)


def test_the_json_server_demo_reports_zero_duplicates_counted_on_the_server(capsys):
    installed()
    rc, doc = _demo(capsys)
    assert rc == EXIT_OK and doc["ok"] and doc["finished"]
    assert doc["duplicates"] == 0 and doc["duplicate_keys"] == []
    assert doc["intents"] == 20 and sum(doc["by_state"].values()) == 20
    assert doc["published_without_object"] == 0
    published = sum(doc["by_state"][s] for s in table().states_of_kind("terminal"))
    assert published <= doc["creates"] == doc["posts_on_server"] <= doc["create_requests"]
    assert "json_server.toml" in doc["platform"]


def test_the_json_server_demo_counts_a_post_the_server_holds_twice_as_a_duplicate(capsys, monkeypatch):
    installed()
    real = jsonserver.JsonServer.posts
    monkeypatch.setattr(jsonserver.JsonServer, "posts", lambda self: [p for p in real(self) for _ in (0, 1)])
    rc, doc = _demo(capsys, "--crash-rate", "0")
    assert rc == EXIT_REFUSED and not doc["ok"]
    assert doc["duplicates"] == doc["creates"] // 2 == doc["posts_on_server"] // 2 > 0
    assert len(doc["duplicate_keys"]) == doc["duplicates"]


def test_the_json_server_demo_without_node_says_how_to_install_it(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("ATMOSTONCE_NPM_PREFIX", str(tmp_path))
    monkeypatch.setattr(jsonserver.shutil, "which", lambda name: None)
    rc, doc = _demo(capsys)
    assert rc == EXIT_STORE and "npm install --prefix" in doc["platform_error"]
