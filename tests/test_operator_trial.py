"""An operator's trial, from README.md, docs/operations.md and docs/console.md alone: a posts API written here
(no idempotency; it drops the connection after storing, answers 500, hangs past the read timeout on demand), the
CLI and the worker configured for it per the docs, on SQLite and on PostgreSQL, intents taken to indeterminate and
parked and settled with the documented operator tools (CLI and web console), the kill switch, and the documented
backup and restore of both databases with posts made on the platform after the backup.

Duplicates are always counted from this file's own server (its stored posts grouped by the delivery key the
profile embeds at ``key_field``, whatever the epochs), never from atmostonce's counters."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import pytest

from atmostonce_cli.main import main


# ---------------------------------------------------------------- the posts API
class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _send(self, status: int, doc: Any) -> None:
        data = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        api: PostsApi = self.server.api  # type: ignore[attr-defined]
        if urlparse(self.path).path != "/posts":
            return self._send(404, {})
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
        with api.lock:
            mode = api.faults.popleft() if api.faults else None
            api.create_requests += 1
            pid = None
            if mode not in ("500_before_store", "429"):
                pid = str(api.next_id)
                api.next_id += 1
                api.posts[pid] = dict(body, id=pid)
        if mode in ("500_before_store", "500_after_store"):
            return self._send(500, {"error": "boom"})
        if mode == "429":
            return self._send(429, {"error": "slow down"})
        if mode == "drop_after_store":
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            return None
        if mode == "hang_after_store":
            time.sleep(api.hang_seconds)
        return self._send(201, api.posts[pid])

    def do_GET(self) -> None:
        api: PostsApi = self.server.api  # type: ignore[attr-defined]
        u = urlparse(self.path)
        if u.path.startswith("/posts/"):
            with api.lock:
                post = api.posts.get(u.path.rsplit("/", 1)[1])
            return self._send(200, post) if post else self._send(404, {"error": "not found"})
        if u.path == "/posts":
            key = parse_qs(u.query).get("key", [None])[0]
            with api.lock:
                found = [] if api.hide_lookup else [p for p in api.posts.values() if p.get("key") == key]
            return self._send(200, found)
        return self._send(404, {})


class PostsApi:
    """Posts by id; ``faults`` are consumed one per create request."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.posts: dict[str, dict[str, Any]] = {}
        self.next_id = 1
        self.faults: collections.deque[str] = collections.deque()
        self.create_requests = 0
        self.hang_seconds = 2.5
        self.hide_lookup = False
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.server.api = self  # type: ignore[attr-defined]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def fault(self, mode: str, n: int = 1) -> None:
        with self.lock:
            self.faults.extend([mode] * n)

    def by_delivery_key(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = collections.defaultdict(list)
        with self.lock:
            for p in self.posts.values():
                out[p["key"].split(".")[0]].append(p["id"])
        return dict(out)

    def duplicates(self) -> dict[str, list[str]]:
        return {k: ids for k, ids in self.by_delivery_key().items() if len(ids) > 1}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


PROFILE = """format = 1
name = "trial-posts"
description = "the operator trial's posts API"
transport = "http"
outcomes = "http_outcomes.toml"
read_lag_seconds = 0.0

[http]
base_url = "{url}"
create_path = "/posts"
id_pointer = "/id"
read_back_path = "/posts/{{id}}"
lookup_path = "/posts?key={{key}}"
key_field = "/key"
connect_timeout = 1.0
write_timeout = 1.0
read_timeout = 1.0
"""


# ---------------------------------------------------------------- fixtures
@pytest.fixture
def api():
    a = PostsApi()
    try:
        yield a
    finally:
        a.close()


@pytest.fixture
def profile(tmp_path: Path, api: PostsApi) -> Path:
    p = tmp_path / "posts.toml"
    p.write_text(PROFILE.format(url=api.url))
    return p


@pytest.fixture
def sqlite_url(tmp_path: Path, capsys) -> str:
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    assert cli(capsys, "db", "upgrade", "--database-url", url)[0] == 0
    return url


@pytest.fixture(scope="module")
def pg_cluster():
    import shutil
    import tempfile

    from atmostonce_sql.pgserver import LocalCluster

    parent = tempfile.mkdtemp(prefix="atmostonce-optrial-", dir="/tmp")  # the postgres OS user must reach it
    os.chmod(parent, 0o755)
    cluster = LocalCluster(os.path.join(parent, "data")).start()
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(parent, ignore_errors=True)


_DBN = iter(range(1000))


@pytest.fixture
def pg_url(pg_cluster, capsys) -> str:
    url = pg_cluster.create_database(f"optrial_{os.getpid()}_{next(_DBN)}")
    assert cli(capsys, "db", "upgrade", "--database-url", url)[0] == 0
    return url


# ---------------------------------------------------------------- helpers
def cli(capsys, *argv: str) -> tuple[int, Any]:
    """``atmostonce --json ARGV`` in this process: exit code and the parsed JSON (or the raw text)."""
    rc = main(["--json", *argv])
    out, _ = capsys.readouterr()
    try:
        return rc, json.loads(out)
    except ValueError:
        return rc, out


def submit(capsys, url: str, text: str, account: str = "shop") -> str:
    rc, doc = cli(capsys, "submit", "--database-url", url, account, "post", f"room-{text}", json.dumps({"text": text}))
    assert rc == 0, doc
    return doc["key"]


def work(capsys, url: str, profile: Path) -> tuple[int, Any]:
    return cli(capsys, "work", "--database-url", url, "--platform-config", str(profile))


def state(capsys, url: str, key: str) -> str:
    rc, doc = cli(capsys, "intents", "show", "--database-url", url, key)
    assert rc == 0, doc
    return doc["intent"]["state"]


def states(capsys, url: str) -> dict[str, str]:
    rc, doc = cli(capsys, "intents", "list", "--database-url", url)
    assert rc == 0, doc
    return {i["key"]: i["state"] for i in doc["intents"]}


def sqlite_backup(src: Path, dst: Path) -> None:
    """SQLite's own backup (docs/operations.md, "Backing up and copying a SQLite store")."""
    s, d = sqlite3.connect(src), sqlite3.connect(dst)
    try:
        s.backup(d)
    finally:
        d.close()
        s.close()


def to_parked_by_operator(capsys, url: str, profile: Path, api: PostsApi, text: str) -> str:
    """An intent whose send answered 500 (nothing stored), left indeterminate, parked by a person."""
    api.fault("500_before_store")
    key = submit(capsys, url, text)
    api.hide_lookup = True  # keep reconciliation from deciding anything during the pass
    try:
        rc, _ = work(capsys, url, profile)
    finally:
        api.hide_lookup = False
    assert rc == 3
    assert state(capsys, url, key) == "indeterminate"
    assert cli(capsys, "park", "--database-url", url, key, "--operator", "alice", "--reason", "looking")[0] == 0
    return key


# ================================================================ a defect the trial found (fixed)
def test_a_backup_copied_back_over_the_store_after_a_work_pass_is_the_backup(
    tmp_path, capsys, sqlite_url, profile, api
):
    """Steps: back up (SQLite's backup); submit and publish one intent with a `work` pass; every command has
    returned and no worker runs; put the backup in service by writing it back over the original file (`cp`), the
    "backup written back over the original file" operations.md names; `intents list`.

    A `work` pass that sent left `outbox.sqlite3-wal` (and `-shm`) behind after it returned (the command never
    closed its store), so SQLite replayed that newer log onto the copied-back file: the store listed the intent
    submitted after the backup as `published`, i.e. the restore silently did not happen. Every command now
    closes the stores it opened, and docs/operations.md says how to put a backup in service."""
    db = tmp_path / "outbox.sqlite3"
    sqlite_backup(db, tmp_path / "backup.sqlite3")
    key = submit(capsys, sqlite_url, "sent after the copy")
    assert work(capsys, sqlite_url, profile)[0] == 0

    (tmp_path / "backup.sqlite3").replace(db)  # no process has the store open any more

    assert key not in states(capsys, sqlite_url)


# ================================================================ what held up
def test_faults_on_sqlite_end_published_or_parked_and_each_post_exists_once(capsys, sqlite_url, profile, api):
    """A dropped connection after storing, a 500 after storing and a hang past the read timeout end `published`
    by lookup; a 500 before storing ends `parked` once the lookups are spent; `work` exits 3 while a send is
    unknown; `resolve --not-sent` and a bulk `settle --as not-sent --yes` let them go out once more, once."""
    api.fault("drop_after_store")
    api.fault("500_after_store")
    api.fault("hang_after_store")
    api.fault("500_before_store", 2)
    keys = [submit(capsys, sqlite_url, f"post {i}") for i in range(5)]
    codes = []
    for _ in range(6):
        rc, doc = work(capsys, sqlite_url, profile)
        codes.append(rc)
        time.sleep(1.05)  # reconcile_interval: one lookup per intent per second
    assert codes[0] == 3
    assert codes[-1] == 0
    st = states(capsys, sqlite_url)
    assert [st[k] for k in keys[:3]] == ["published"] * 3
    assert [st[k] for k in keys[3:]] == ["parked"] * 2

    assert cli(capsys, "resolve", "--database-url", sqlite_url, keys[3], "--operator", "alice", "--not-sent")[0] == 0
    settle = ("settle", "--database-url", sqlite_url, "--state", "parked", "--as", "not-sent")
    reason = ("--operator", "alice", "--reason", "checked: not there")
    rc, dry = cli(capsys, *settle, *reason)
    assert rc == 0 and dry["dry_run"] is True
    rc, done = cli(capsys, *settle, *reason, "--yes")
    assert rc == 0 and [r["result"] for r in done["results"]] == ["moved"]
    assert work(capsys, sqlite_url, profile)[0] == 0

    assert set(states(capsys, sqlite_url).values()) == {"published"}
    assert api.duplicates() == {}
    assert sorted(api.by_delivery_key()) == sorted(keys)
    assert cli(capsys, "audit", "verify", "--database-url", sqlite_url)[0] == 0


def test_resolve_published_reads_the_id_back_and_refuses_another_posts_id(capsys, sqlite_url, profile, api):
    """`resolve --published ID --platform-config` on a parked intent: the id of another post is refused (exit 1,
    `not_verified` with `read_back.differs`), the right one is accepted as verified."""
    other = submit(capsys, sqlite_url, "someone else")
    assert work(capsys, sqlite_url, profile)[0] == 0
    api.fault("500_after_store")  # stored, but the answer says 500
    api.hide_lookup = True  # and the lookup cannot find it
    key = submit(capsys, sqlite_url, "hidden")
    work(capsys, sqlite_url, profile)
    assert cli(capsys, "park", "--database-url", sqlite_url, key, "--operator", "alice")[0] == 0
    [real] = api.by_delivery_key()[key]
    [wrong] = api.by_delivery_key()[other]

    def resolve_as(remote_id):
        return cli(
            capsys,
            "resolve",
            "--database-url",
            sqlite_url,
            key,
            "--operator",
            "alice",
            "--published",
            remote_id,
            "--platform-config",
            str(profile),
        )

    rc, doc = resolve_as(wrong)
    assert rc == 1 and doc["not_verified"]["outcome"] == "read_back.differs"
    rc, doc = resolve_as(real)
    assert rc == 0 and doc["verified"] is True and doc["state"] == "published"
    assert api.duplicates() == {}


def test_the_kill_switch_pauses_sends_and_releasing_it_sends_once(capsys, sqlite_url, profile, api):
    assert (
        cli(capsys, "policy", "kill-switch", "global", "on", "--operator", "alice", "--database-url", sqlite_url)[0]
        == 0
    )
    key = submit(capsys, sqlite_url, "held")
    rc, doc = work(capsys, sqlite_url, profile)
    assert rc == 0 and doc.get("gate.paused") == 1
    assert state(capsys, sqlite_url, key) == "pending" and api.create_requests == 0
    assert (
        cli(capsys, "policy", "kill-switch", "global", "off", "--operator", "alice", "--database-url", sqlite_url)[0]
        == 0
    )
    assert work(capsys, sqlite_url, profile)[0] == 0
    assert state(capsys, sqlite_url, key) == "published"
    assert api.create_requests == 1
    rc, log = cli(capsys, "policy", "log", "--database-url", sqlite_url)
    assert [c["operator"] for c in log["changes"]] == ["alice", "alice"]


def test_the_worker_on_sqlite_settles_faulty_sends_by_lookup_and_drains_on_sigterm(
    tmp_path, capsys, sqlite_url, profile, api
):
    """`atmostonce worker --config FILE` with the documented TOML, against the faulty API."""
    config = tmp_path / "worker.toml"
    config.write_text(
        f'database_url = "{sqlite_url}"\nplatform = "{profile.name}"\nworkers = 2\ndrain_seconds = 5\n'
        "[intervals]\npoll_seconds = 0.2\nsweep_seconds = 0.2\nreconcile_seconds = 0.2\n"
        '[runtime]\nsend_lease_seconds = 10\nreconcile_interval = 0.3\n[logging]\nformat = "json"\n'
    )
    api.fault("drop_after_store")
    api.fault("hang_after_store")
    keys = [submit(capsys, sqlite_url, f"w{i}") for i in range(4)]
    proc = subprocess.Popen(
        [sys.executable, "-m", "atmostonce_cli.main", "--json", "worker", "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and set(states(capsys, sqlite_url).values()) != {"published"}:
            time.sleep(0.3)
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    report = json.loads(out)
    assert report["dispatched"]["send.unknown"] == 2 and report["reconciled"] == {"lookup.found": 2}, report
    assert [states(capsys, sqlite_url)[k] for k in keys] == ["published"] * 4
    assert api.duplicates() == {}


@pytest.mark.postgres
def test_postgres_restore_of_an_older_dump_settles_by_lookup_and_work_goes_on(
    tmp_path, capsys, pg_cluster, pg_url, profile, api
):
    """pg_dump while two intents are pending; they are posted after the dump; drop, recreate and pg_restore the
    database, `declare-restore`: both are fenced, found by lookup and published, a new intent is posted, and
    nothing is posted twice."""
    pending = [submit(capsys, pg_url, f"pg pre {i}") for i in range(2)]
    dump = tmp_path / "outbox.dump"
    dbname = urlparse(pg_url).path.lstrip("/")
    dsn = pg_cluster.dsn_for(dbname)
    subprocess.run(["pg_dump", "-Fc", "-f", str(dump), dsn], check=True)
    assert work(capsys, pg_url, profile)[0] == 0
    assert len(api.by_delivery_key()) == 2
    pg_cluster.drop_database(dbname)
    restored = pg_cluster.create_database(dbname)
    subprocess.run(["pg_restore", "-d", dsn, str(dump)], check=True)
    assert [states(capsys, restored)[k] for k in pending] == ["pending", "pending"]

    rc, declared = cli(capsys, "db", "declare-restore", "--database-url", restored, "--operator", "alice")
    assert rc == 0 and declared["fenced"] == 2
    rc, doc = work(capsys, restored, profile)
    assert rc == 0 and doc["reconcile:lookup.found"] == 2
    fresh = submit(capsys, restored, "pg after the restore")
    assert work(capsys, restored, profile)[0] == 0
    assert [states(capsys, restored)[k] for k in [*pending, fresh]] == ["published"] * 3
    assert api.duplicates() == {}


def _console(tmp_path: Path, url: str, profile: Path) -> tuple[subprocess.Popen, str]:
    tokens = tmp_path / "tokens"
    tokens.write_text("alice:trial-token-0123456789\n")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "atmostonce_cli.main",
            "console",
            "--database-url",
            url,
            "--token-file",
            str(tokens),
            "--platform-config",
            str(profile),
            "--audit-log",
            str(tmp_path / "audit.jsonl"),
            "--port",
            str(port),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    return proc, f"http://127.0.0.1:{port}"


def test_the_console_refuses_an_unconfirmed_id_and_settles_a_parked_intent_with_an_audit_row(
    tmp_path, capsys, sqlite_url, profile, api
):
    import re

    import httpx

    other = submit(capsys, sqlite_url, "another post")
    assert work(capsys, sqlite_url, profile)[0] == 0
    key = to_parked_by_operator(capsys, sqlite_url, profile, api, "console")
    proc, base = _console(tmp_path, sqlite_url, profile)
    try:
        with httpx.Client(base_url=base, follow_redirects=False) as c:
            for _ in range(100):
                try:
                    page = c.get("/login")
                    break
                except httpx.TransportError:
                    time.sleep(0.1)
            csrf = re.search(r'name="csrf" value="([^"]+)"', page.text).group(1)
            assert (
                c.post(
                    "/login", data={"csrf": csrf, "next": "/", "operator": "alice", "token": "trial-token-0123456789"}
                ).status_code
                == 303
            )
            csrf = re.search(r'name="csrf" value="([^"]+)"', c.get(f"/intents/{key}").text).group(1)
            assert c.post(f"/intents/{key}/park", data={"reason": "x"}).status_code == 403  # no CSRF token
            [wrong] = api.by_delivery_key()[other]
            c.post(
                f"/intents/{key}/resolve_published",
                data={"csrf": csrf, "remote_id": wrong, "unverified": "no", "reason": "saw it"},
            )
            assert state(capsys, sqlite_url, key) == "parked"
            c.post(f"/intents/{key}/resolve_not_sent", data={"csrf": csrf, "reason": "checked: not there"})
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    audit = [json.loads(line) for line in (tmp_path / "audit.jsonl").read_text().splitlines()]
    acts = [(a["action"], a["operator"], next(iter(a["result"]))) for a in audit if a["action"] != "sign-in"]
    assert acts == [("resolve_published", "alice", "not_verified"), ("resolve_not_sent", "alice", "done")]
    assert state(capsys, sqlite_url, key) == "failed"
    assert work(capsys, sqlite_url, profile)[0] == 0
    assert state(capsys, sqlite_url, key) == "published"
    assert api.duplicates() == {}
