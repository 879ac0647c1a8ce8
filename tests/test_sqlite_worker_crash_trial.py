"""The embedded SQLite default run as a deployment runs it: an ``atmostonce worker`` process on one SQLite file,
intents submitted from another process, the worker SIGKILLed while the platform holds its request, and a copy of
the live file taken with SQLite's backup API, opened, verified and restored (docs/operations.md, docs/design.md
"The restore protocol").

The platform is a small posts API written here, on 127.0.0.1, with *no* idempotency-key dedupe: it counts every
create request that arrives, so a resend would show as a second request for the key whatever it stored.
"""

from __future__ import annotations

import collections
import json
import sqlite3
import threading
import urllib.parse
from pathlib import Path

import pytest

from atmostonce_sql import open_store
from atmostonce_sql.testing import age_leases
from tests.posts_api import JsonHandler, PostsServer, run_cli
from tests.worker_proc import WorkerProcess, write_config

HOLD_SECONDS = 60  # an upper bound on how long the platform holds a request; the test releases it long before


class PostsPlatform(PostsServer):
    """``POST /posts`` (no dedupe), ``GET /posts/{id}``, ``GET /posts?key=K`` (a JSON array). ``hold`` applies to
    the next create only: ``before_store`` (held, then stored once released), ``after_store`` (stored, the answer
    held) or ``discard`` (held, then dropped unstored and unanswered)."""

    def __init__(self) -> None:
        super().__init__()
        self.hold: str | None = None
        self.arrived = threading.Event()
        self.stored = threading.Event()
        self.release = threading.Event()
        self.finished = threading.Event()
        platform = self

        class Handler(JsonHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                with platform.lock:
                    if url.path == "/posts" and "key" in query:
                        return self._json(200, [o for o in platform.objects.values() if o["key"] == query["key"][0]])
                    obj = platform.objects.get(url.path.rsplit("/", 1)[-1]) if url.path.startswith("/posts/") else None
                self._json(200, obj) if obj is not None else self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                key = self.headers["Idempotency-Key"]
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with platform.lock:
                    platform.create_requests[key.split(".")[0]] += 1
                    hold, platform.hold = platform.hold, None
                try:
                    if hold is not None:
                        platform.arrived.set()
                    if hold in ("before_store", "discard"):
                        platform.release.wait(HOLD_SECONDS)
                    if hold == "discard":
                        self.close_connection = True
                        return
                    with platform.lock:
                        obj = {"id": f"p{len(platform.objects) + 1}", "key": key, "body": body}
                        platform.objects[obj["id"]] = obj
                    if hold is not None:
                        platform.stored.set()
                    if hold == "after_store":
                        platform.release.wait(HOLD_SECONDS)
                    try:
                        self._json(201, obj)
                    except OSError:  # the client died while the request was held
                        self.close_connection = True
                finally:
                    if hold is not None:
                        platform.finished.set()

        self.serve(Handler)

    def objects_by_key(self) -> collections.Counter[str]:
        with self.lock:
            return collections.Counter(o["key"].split(".")[0] for o in self.objects.values())

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        super().__exit__(*exc)


run = run_cli


@pytest.fixture
def db(tmp_path, capsys) -> str:
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    assert run(capsys, "db", "upgrade", "--database-url", url)[0] == 0
    return url


@pytest.fixture
def platform():
    with PostsPlatform() as p:
        yield p


def platform_file(tmp_path: Path, platform: PostsPlatform) -> Path:
    path = tmp_path / "posts.json"
    path.write_text(
        json.dumps(
            {
                "base_url": platform.url,
                "create_path": "/posts",
                "id_pointer": "/id",
                "read_back_path": "/posts/{id}",
                "body_pointer": "/body",
                "lookup_path": "/posts?key={key}",
                "connect_timeout": 1.0,
                "write_timeout": 1.0,
                "read_timeout": 30.0,
            }
        )
    )
    return path


def worker_config(tmp_path: Path, db: str, platform: PostsPlatform, *, workers: int = 1) -> Path:
    return write_config(
        tmp_path / "worker.toml",
        db,
        None,
        platform=platform_file(tmp_path, platform),
        workers=workers,
        drain_seconds=5,
        intervals={"poll_seconds": 0.1, "sweep_seconds": 0.1, "reconcile_seconds": 0.1},
        runtime={"lease_seconds": 30, "send_lease_seconds": 60, "reconcile_interval": 0},
    )


def events(store, key: str) -> list[str]:
    return [h.event for h in store.history(key)]


def backup(url: str, dest: Path) -> str:
    """Copy a live SQLite store the safe way (SQLite's online backup API), as a person taking a backup would."""
    src = sqlite3.connect(f"file:{url.removeprefix('sqlite:///')}?mode=ro", uri=True)
    dst = sqlite3.connect(dest)
    try:
        src.backup(dst)
    finally:
        dst.close()
        src.close()
    return f"sqlite:///{dest}"


@pytest.mark.parametrize("hold", ["before_store", "after_store"])
def test_a_worker_killed_while_the_platform_holds_its_send_publishes_once_by_lookup_after_restart(
    tmp_path, capsys, db, platform, hold
):
    cfg = worker_config(tmp_path, db, platform, workers=2)
    store = open_store(db, migrate=False)
    try:
        platform.hold = hold
        worker = WorkerProcess(cfg)
        try:
            key = store.submit("shop", "post", "room-1", {"text": "held while the worker dies"}).key
            assert (platform.stored if hold == "after_store" else platform.arrived).wait(HOLD_SECONDS)
            worker.kill()  # SIGKILL while the platform holds the request
        finally:
            worker.close()
        platform.release.set()
        assert platform.finished.wait(HOLD_SECONDS)
        # the authorization was durable before the bytes; the outcome never came back
        assert store.get(key).state == "authorized"
        assert platform.objects_by_key() == {key: 1}

        age_leases(store, 3600)  # the dead worker's send lease runs out
        worker = WorkerProcess(cfg)
        try:
            worker.wait_for(lambda r: r.get("key") == key and r.get("event") == "reconcile_found", what="lookup")
            rc, _ = worker.terminate()
        finally:
            worker.close()
        assert rc == 0

        intent = store.get(key)
        assert intent.state == "published"
        assert platform.create_requests == {key: 1}  # never sent again
        assert platform.objects_by_key() == {key: 1}
        assert intent.remote_id == next(iter(platform.objects))
        assert events(store, key) == ["submit", "begin", "authorize_dispatch", "expire_lease", "reconcile_found"]
        assert run(capsys, "audit", "verify", "--database-url", db)[0] == 0
    finally:
        store.close()


def test_a_send_lost_with_its_killed_worker_is_parked_not_resent_until_a_person_says_not_sent(
    tmp_path, capsys, db, platform
):
    cfg = worker_config(tmp_path, db, platform)
    store = open_store(db, migrate=False)
    try:
        platform.hold = "discard"
        worker = WorkerProcess(cfg)
        try:
            key = store.submit("shop", "post", "room-1", {"text": "lost with the worker"}).key
            assert platform.arrived.wait(HOLD_SECONDS)
            worker.kill()
        finally:
            worker.close()
        platform.release.set()
        assert platform.finished.wait(HOLD_SECONDS)
        age_leases(store, 3600)

        worker = WorkerProcess(cfg)
        try:
            worker.wait_for(lambda r: r.get("key") == key and r.get("event") == "park_unreconcilable", what="park")
            parked = store.get(key)
            assert parked.state == "parked"
            assert platform.create_requests == {key: 1}  # an unfenced "not found" proves nothing: no resend
            assert platform.objects_by_key() == {}

            rc, _ = run(capsys, "resolve", key, "--operator", "trial", "--not-sent", "--database-url", db)
            assert rc == 0
            worker.wait_for(lambda r: r.get("key") == key and r.get("event") == "confirm_read_back", what="publish")
            rc, _ = worker.terminate()
        finally:
            worker.close()
        assert rc == 0

        intent = store.get(key)
        assert (intent.state, intent.attempt_count) == ("published", 2)
        assert platform.create_requests == {key: 2}  # the lost one, and the one a person allowed
        assert platform.objects_by_key() == {key: 1}
        assert run(capsys, "audit", "verify", "--database-url", db)[0] == 0
    finally:
        store.close()


def test_a_backup_of_the_live_sqlite_file_opens_verifies_and_once_declared_restored_resends_nothing(
    tmp_path, capsys, db, platform
):
    cfg = worker_config(tmp_path, db, platform)
    store = open_store(db, migrate=False)
    try:
        keys = [store.submit("shop", "post", f"room-{i % 3}", {"text": f"backed up {i}"}).key for i in range(12)]
        platform.hold = "before_store"
        worker = WorkerProcess(cfg)
        try:
            assert platform.arrived.wait(HOLD_SECONDS)
            copy_url = backup(db, tmp_path / "copy.sqlite3")  # the worker is mid-send
            platform.release.set()
            for k in keys:
                worker.wait_for(lambda r, k=k: r.get("key") == k and r.get("event") == "confirm_read_back", what=k)
            rc, _ = worker.terminate()
        finally:
            worker.close()
        assert rc == 0
        originals = {k: store.get(k).remote_id for k in keys}
    finally:
        store.close()
    assert platform.objects_by_key() == dict.fromkeys(keys, 1)

    # the copy opens as a store, is consistent, and shows the send in flight and the queue behind it
    with open_store(copy_url, migrate=False) as copy:
        assert copy.count_by_state()["authorized"] == 1 and copy.count_by_state()["pending"] == len(keys) - 1
        assert set(copy.claimable(100)) <= set(keys) and len(copy.claimable(100)) == len(keys) - 1
    assert run(capsys, "audit", "verify", "--database-url", copy_url)[0] == 0

    # restored: every open intent becomes unknown and is settled by looking, never by sending
    assert run(capsys, "db", "declare-restore", "--operator", "trial", "--database-url", copy_url)[0] == 0
    with open_store(copy_url, migrate=False) as copy:
        assert copy.count_by_state()["indeterminate"] == len(keys) and copy.claimable(100) == []
    plat = str(platform_file(tmp_path, platform))
    rc, out = run(capsys, "--json", "work", "--platform-config", plat, "--database-url", copy_url)
    assert rc == 0, out
    with open_store(copy_url, migrate=False) as copy:
        assert {k: (copy.get(k).state, copy.get(k).remote_id) for k in keys} == {
            k: ("published", originals[k]) for k in keys
        }
    assert platform.create_requests == dict.fromkeys(keys, 1)
    assert platform.objects_by_key() == dict.fromkeys(keys, 1)
    assert run(capsys, "audit", "verify", "--database-url", copy_url)[0] == 0
