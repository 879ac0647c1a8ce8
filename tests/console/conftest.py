"""Console fixtures: a store with intents in the human-owned states, and a signed-in TestClient."""

from __future__ import annotations

import contextlib
import re

import pytest

from tests.helpers import to_state

TOKEN = "s3cret-token"


def seed_queue(store) -> dict[str, str]:
    """One intent parked by an operator, one parked at the gate, one failed, one published: their keys."""
    parked, _ = to_state(store, "parked", text="parked one", account="acct-a")
    published, _ = to_state(store, "published", text="published one", account="acct-a", target="room-2")
    failed, _ = to_state(store, "failed", text="failed one", account="acct-b")
    return {"parked": parked.key, "published": published.key, "failed": failed.key}


def make_client(store, tmp_path, **kw):
    from starlette.testclient import TestClient

    from atmostonce_console import create_app
    from atmostonce_console.app import Credentials
    from atmostonce_console.audit import ActionLog

    log = ActionLog(tmp_path / "audit.jsonl")
    creds = Credentials([f"alice:{TOKEN}", "shared-token"])
    app = create_app(store, credentials=creds, action_log=log, session_secret="k", **kw)
    client = TestClient(app, base_url="http://127.0.0.1")
    client.store, client.log = store, log
    return client


@pytest.fixture
def console(sql_store, tmp_path):
    """A console over a fresh SQLite database, and over PostgreSQL in `make test`."""
    with make_client(sql_store, tmp_path) as client:
        yield client


def csrf_of(html: str) -> str:
    return re.search(r'name="csrf" value="([^"]+)"', html).group(1)


def sign_in(client, token: str = TOKEN, operator: str = "") -> str:
    page = client.get("/login")
    r = client.post(
        "/login", data={"csrf": csrf_of(page.text), "token": token, "operator": operator}, follow_redirects=False
    )
    assert r.status_code == 303, r.text
    return csrf_of(client.get("/").text)


@contextlib.contextmanager
def console_on_json_server(store, tmp_path, transport=None):
    """``(server, client)``: json-server (a REST server nobody here wrote) in ``tmp_path / "js"``, and a signed-out
    console over ``store`` whose platform is that server through ``transport`` (``HttpTransport`` or a subclass
    of it; the default ``HttpTransport``)."""
    from atmostonce_http import HttpTransport
    from tests.http.jsonserver import JsonServer, profile

    kind = HttpTransport if transport is None else transport
    (tmp_path / "js").mkdir()
    with (
        JsonServer(tmp_path / "js") as server,
        make_client(store, tmp_path, platform=lambda: kind(profile(server.url))) as c,
    ):
        yield server, c
