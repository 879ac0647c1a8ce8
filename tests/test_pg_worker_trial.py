"""A new user's production trial on PostgreSQL: ``atmostonce worker`` processes on a durable (fsync on) throwaway
cluster, publishing through a posts API written here with *no* idempotency of its own, while workers are
SIGKILLed, two run at once on one database, the platform answers late, trickles, drops the connection after
storing, or never stores, and PostgreSQL is restarted under them (README, docs/operations.md, docs/platforms.md).

The platform counts every create request per delivery key, so a resend would show as a second request whatever
it stored. The last tests pin what the worker's documentation says about its JSON logs, its report and its
config file.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import socket
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest

from atmostonce_cli.main import main
from atmostonce_sql import open_store
from tests.helpers import durable_cluster
from tests.posts_api import JsonHandler, PostsServer, run_cli
from tests.worker_proc import SINK_PROFILE, WorkerProcess, write_config

OPEN_STATES = ("pending", "authorized", "indeterminate", "failed")
FAULTS = ("drop", "late", "trickle", "e500", "lost")
TRICKLE_CHUNKS, TRICKLE_GAP = 12, 0.5  # 6 s of answer, each gap under the read timeout, the whole over the lease
LATE_SECONDS = 2.5  # over the read timeout


class PostsApi(PostsServer):
    """``POST /posts`` (no dedupe), ``GET /posts/{id}``, ``GET /posts?key=K`` (a JSON array), ``GET /posts``.

    The first create for a delivery key whose ``text`` ends with ``#<fault>`` meets that fault: ``drop`` (stored,
    connection closed unanswered), ``late`` (stored, answered after the read timeout), ``trickle`` (stored, answer
    dribbled out over longer than the send lease), ``e500`` (stored, answered 500), ``lost`` (not stored,
    connection closed unanswered)."""

    def __init__(self) -> None:
        super().__init__()
        self.trickled = threading.Event()
        api = self

        class Handler(JsonHandler):
            def _trickle(self, status: int, doc: Any) -> None:
                self._head(status, json.dumps(doc).encode())
                data = self._body
                step = -(-len(data) // TRICKLE_CHUNKS)
                for i in range(0, len(data), step):
                    self.wfile.write(data[i : i + step])
                    self.wfile.flush()
                    time.sleep(TRICKLE_GAP)  # the platform's own pace, not a test's timing assertion
                api.trickled.set()

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                with api.lock:
                    if url.path == "/posts":
                        found = [o for o in api.objects.values() if "key" not in query or o["key"] == query["key"][0]]
                        return self._json(200, found)
                    obj = api.objects.get(url.path.rsplit("/", 1)[-1]) if url.path.startswith("/posts/") else None
                self._json(200, obj) if obj is not None else self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                base = body["key"].split(".")[0]
                with api.lock:
                    api.create_requests[base] += 1
                    first = api.create_requests[base] == 1
                fault = str(body.get("text", "")).rpartition("#")[2] if first else ""
                fault = fault if fault in FAULTS else ""
                if fault == "lost":
                    self.close_connection = True
                    return
                with api.lock:
                    obj = {**body, "id": f"p{len(api.objects) + 1}"}
                    api.objects[obj["id"]] = obj
                try:
                    if fault == "drop":
                        self.close_connection = True
                        self.connection.shutdown(socket.SHUT_RDWR)
                        return
                    if fault == "late":
                        time.sleep(LATE_SECONDS)
                    status = 500 if fault == "e500" else 201
                    self._trickle(status, obj) if fault == "trickle" else self._json(status, obj)
                except OSError:  # the client gave up or died
                    self.close_connection = True

        self.serve(Handler)

    def objects_by_key(self) -> dict[str, list[str]]:
        with self.lock:
            out: dict[str, list[str]] = collections.defaultdict(list)
            for o in self.objects.values():
                out[o["key"].split(".")[0]].append(o["id"])
            return dict(out)


# ---------------------------------------------------------------- fixtures and helpers
@pytest.fixture(scope="module")
def cluster():
    """A durable throwaway cluster (fsync and synchronous_commit on), ours alone, so a test may restart it."""
    with durable_cluster("trial") as c:
        yield c


_DB_COUNTER = iter(range(1000))


@pytest.fixture
def db(cluster, capsys) -> str:
    url = cluster.create_database(f"trial_{os.getpid()}_{next(_DB_COUNTER)}")
    assert run(capsys, "db", "upgrade", "--database-url", url)[0] == 0
    return url


@pytest.fixture
def api():
    with PostsApi() as p:
        yield p


run = run_cli


def profile(tmp_path: Path, api: PostsApi) -> Path:
    """A platform profile (docs/platforms.md) for the posts API: key in the body, read back by id, looked up
    by key, not fenced (the API keeps no tombstone). Send timeouts add up to 2.5 s."""
    path = tmp_path / "posts.toml"
    path.write_text(
        "\n".join(
            [
                "format = 1",
                'name = "trial-posts"',
                'description = "a posts API with no idempotency"',
                'transport = "http"',
                'outcomes = "http_outcomes.toml"',
                "read_lag_seconds = 0.0",
                "[http]",
                f'base_url = "{api.url}"',
                'create_path = "/posts"',
                'id_pointer = "/id"',
                'read_back_path = "/posts/{id}"',
                'lookup_path = "/posts?key={key}"',
                'key_field = "/key"',
                "connect_timeout = 0.5",
                "write_timeout = 0.5",
                "read_timeout = 1.0",
            ]
        )
        + "\n"
    )
    return path


def worker_config(
    tmp_path: Path, db: str, api: PostsApi, *, name: str = "worker.toml", send_lease: float = 3.0, workers: int = 2
) -> Path:
    return write_config(
        tmp_path / name,
        db,
        None,
        platform=profile(tmp_path, api),
        workers=workers,
        drain_seconds=5,
        intervals={"poll_seconds": 0.2, "sweep_seconds": 0.1, "reconcile_seconds": 0.1},
        runtime={"lease_seconds": 10, "send_lease_seconds": send_lease, "reconcile_interval": 0.2},
    )


def until(cond, timeout: float = 60.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.1)


def counts(url: str) -> dict[str, int]:
    with open_store(url, migrate=False) as s:
        return s.count_by_state()


def settled(url: str) -> bool:
    try:
        c = counts(url)
    except Exception:  # the database is coming back
        return False
    return all(c.get(s, 0) == 0 for s in OPEN_STATES)


def published_count(worker: WorkerProcess) -> int:
    return sum(1 for r in list(worker.records) if r.get("state") == "published")


# ---------------------------------------------------------------- what held up
@pytest.mark.postgres
def test_two_workers_sigkilled_under_platform_faults_and_a_postgres_restart_never_send_twice_nor_lose_an_intent(
    tmp_path, capsys, cluster, db, api
):
    cfg = worker_config(tmp_path, db, api)
    plat = str(profile(tmp_path, api))
    texts = [f"trial post {i}" + (f" #{FAULTS[i % 10]}" if i % 10 < len(FAULTS) else "") for i in range(60)]
    keys: list[str] = []

    def submit(batch: range) -> None:
        with open_store(db, migrate=False) as s:
            keys.extend(s.submit(f"acct{i % 3}", "post", f"room-{i % 7}", {"text": texts[i]}).key for i in batch)

    submit(range(0, 20))
    a, b = WorkerProcess(cfg), WorkerProcess(cfg)  # two worker processes on one database
    procs = [a, b]
    kills = 0
    try:
        until(lambda: published_count(a) + published_count(b) >= 3, what="first publications")
        a.kill()  # SIGKILL, whatever it was doing
        kills += 1
        a = WorkerProcess(cfg)
        procs.append(a)
        submit(range(20, 40))
        until(lambda: published_count(a) + published_count(b) >= 6, what="publications after a kill")
        cluster.stop()  # pg_ctl stop -m immediate: a crash of the database under both workers
        cluster.start()
        submit(range(40, 60))
        until(lambda: published_count(a) + published_count(b) >= 3, what="publications after the restart")
        b.kill()
        kills += 1
        b = WorkerProcess(cfg)
        procs.append(b)
        until(lambda: published_count(b) >= 1, what="a publication by the restarted worker")
        a.kill()
        kills += 1
        a = WorkerProcess(cfg)
        procs.append(a)
        until(lambda: settled(db), timeout=75, what="every intent settled or parked")
        for w in (a, b):
            rc, _ = w.terminate()
            assert rc == 0
    finally:
        for w in procs:
            w.close()
    assert kills == 3

    objects = api.objects_by_key()
    assert [k for k, n in api.create_requests.items() if n > 1] == []  # never sent twice
    assert [k for k, ids in objects.items() if len(ids) > 1] == []
    with open_store(db, migrate=False) as store:
        intents = {k: store.get(k) for k in keys}
        assert len(intents) == 60 and store.count_by_state().get("pending", 0) == 0
        by_state = collections.Counter(it.state for it in intents.values())
        assert set(by_state) <= {"published", "parked"}  # nothing lost, nothing left open
        for k, it in intents.items():
            if it.state == "published":
                assert objects.get(k) == [it.remote_id]
            else:
                assert len(objects.get(k, [])) <= 1  # a person looks at the platform (intents show, resolve)
        lost = {k for k, t in zip(keys, texts, strict=True) if t.endswith("#lost")}
        assert {k for k in lost if intents[k].state == "parked"} == lost  # never stored: parked, not resent
        assert all(k not in objects for k in lost)
        parked = {k for k, it in intents.items() if it.state == "parked"}

    rc, out = run(capsys, "--json", "intents", "list", "--state", "parked", "--database-url", db)
    assert rc == 0 and {i["key"] for i in json.loads(out)["intents"]} == parked
    rc, out = run(capsys, "--json", "status", "--database-url", db)
    assert rc == 0 and json.loads(out)["states"]["parked"] == len(parked)
    sent_before = dict(api.create_requests)
    rc, out = run(capsys, "--json", "work", "--platform-config", plat, "--database-url", db)
    assert rc == 0, out  # parked from before are not this pass's unknowns
    assert dict(api.create_requests) == sent_before  # a pass over parked intents sends nothing
    rc, out = run(capsys, "--json", "audit", "verify", "--database-url", db)
    assert rc == 0, out


@pytest.mark.postgres
def test_an_answer_trickled_out_past_the_send_lease_is_settled_by_lookup_and_kept_as_late_evidence(
    tmp_path, capsys, db, api
):
    """Each read is bounded by ``read_timeout`` but the whole answer is not (send_timeout_seconds is a lower
    bound): a platform that dribbles its answer outlasts a send lease longer than every timeout. The lapsed
    lease is swept, the lookup finds the post, and the answer that comes later moves nothing."""
    cfg = worker_config(tmp_path, db, api, send_lease=3.0, workers=1)
    store = open_store(db, migrate=False)
    try:
        key = store.submit("shop", "post", "room-1", {"text": "slow answer #trickle"}).key
        w = WorkerProcess(cfg)
        try:
            w.wait_for(lambda r: r.get("key") == key and r.get("event") == "reconcile_found", what="lookup")
            assert api.trickled.wait(60)
            until(lambda: store.evidence(key) != [], what="the late answer kept as evidence")
            rc, _ = w.terminate()
        finally:
            w.close()
        assert rc == 0
        intent = store.get(key)
        assert intent.state == "published"
        assert api.create_requests == {key: 1}
        assert api.objects_by_key() == {key: [intent.remote_id]}
        assert [h.event for h in store.history(key)] == [
            "submit",
            "begin",
            "authorize_dispatch",
            "expire_lease",
            "reconcile_found",
        ]
        (late,) = store.evidence(key)
        assert (late.outcome, late.remote_id) == ("send.success", intent.remote_id)
        assert run(capsys, "audit", "verify", "--database-url", db)[0] == 0
    finally:
        store.close()


# ---------------------------------------------------------------- what the documentation says
@pytest.mark.postgres
def test_a_local_cluster_stopped_and_started_again_is_the_same_cluster_at_the_same_url():
    """With its own folder (``directory=None``) kept (``remove_on_stop=False``), ``stop()`` then ``start()`` on the
    same object restarts the same cluster: the same folder and URL, the databases made before still there. It
    made a new, empty cluster in a new folder before, and the workers' URL no longer answered."""
    from atmostonce_sql.pgserver import LocalCluster

    c = LocalCluster(remove_on_stop=False, stop_at_exit=False).start()
    folders = [c.directory]
    try:
        url = c.create_database("kept")
        with open_store(url) as store:
            key = store.submit("shop", "post", "room-1", {"text": "before the restart"}).key
        c.stop()
        c.start()
        folders.append(c.directory)
        assert (c.directory, c.url_for("kept")) == (folders[0], url)
        with open_store(url, migrate=False) as store:
            assert store.get(key).state == "pending"
    finally:
        c.remove_on_stop = True
        c.stop()
        for f in folders:
            if f is not None:
                shutil.rmtree(f, ignore_errors=True)


@pytest.mark.postgres
def test_the_send_lease_warning_in_the_json_log_carries_both_numbers_as_fields(tmp_path, db, api):
    """docs/operations.md, Logs: the warning of a send lease not longer than the transport's send timeouts carries
    both numbers as keys of the worker's JSON lines (they were only in the prose message)."""
    cfg = worker_config(tmp_path, db, api, send_lease=2.0, workers=1)  # under the 2.5 s of send timeouts
    with open_store(db, migrate=False) as store:
        key = store.submit("shop", "post", "room-1", {"text": "short lease"}).key
    w = WorkerProcess(cfg)
    try:
        w.wait_for(lambda r: r.get("key") == key and r.get("state") == "published", what="publish")
        rec = w.wait_for(
            lambda r: r.get("logger") == "atmostonce.runtime" and r.get("level") == "WARNING", what="lease warning"
        )
        w.terminate()
    finally:
        w.close()
    assert (rec.get("send_lease_seconds"), rec.get("send_timeout_seconds")) == (2.0, 2.5)


@pytest.mark.postgres
def test_a_worker_stopped_before_its_database_answered_prints_an_empty_report_and_exits_3(tmp_path):
    """docs/operations.md: stopped while PostgreSQL is still unreachable, the worker logs ``worker.stop`` with the
    outcome ``store_unreachable``, prints the report of a run that did nothing and exits 3 (it printed nothing and
    exited 0, so a supervisor could not tell the run never reached its database)."""
    sock_dir = Path(tempfile.mkdtemp(prefix="aom-nopg-"))  # no server listens here
    url = f"postgresql+psycopg://postgres@/postgres?host={sock_dir}&port=5999"
    cfg = write_config(
        tmp_path / "w.toml",
        url,
        "http://127.0.0.1:9",
        intervals={"poll_seconds": 0.2, "sweep_seconds": 0.2, "reconcile_seconds": 0.2},
    )
    w = WorkerProcess(cfg)
    try:
        w.wait_for(lambda r: r.get("event") == "worker.store_unreachable", what="store unreachable")
        rc, report = w.terminate()
        stop = w.wait_for(lambda r: r.get("event") == "worker.stop", what="stop record")
    finally:
        w.close()
        sock_dir.rmdir()
    assert (rc, stop.get("outcome")) == (3, "store_unreachable")
    assert report is not None
    assert (report["dispatched"], report["swept"], report["reconciled"], report["still_running"]) == ({}, {}, {}, 0)


def test_the_database_url_option_comes_before_the_config_files_database_url(tmp_path, capsys):
    """README and docs/operations.md: ``--database-url`` wins over the config file's ``database_url`` (the file's
    comment said the reverse). Given both, the worker opens the option's database: here a SQLite file that does
    not exist, which it refuses (exit 3) instead of running on the file's."""
    good = f"sqlite:///{tmp_path / 'good.sqlite3'}"
    assert run(capsys, "db", "upgrade", "--database-url", good)[0] == 0
    cfg = write_config(tmp_path / "w.toml", good, "http://127.0.0.1:9", intervals={"poll_seconds": 0.2})
    missing = tmp_path / "missing.sqlite3"
    w = WorkerProcess(cfg, "--database-url", f"sqlite:///{missing}")
    try:
        rc = w.proc.wait(60)
    finally:
        w.close()
    assert (rc, missing.exists()) == (3, False)
    assert not any(r.get("event") == "worker.start" for r in list(w.records))


def test_a_config_value_that_is_not_finite_is_refused_as_not_finite(tmp_path, capsys):
    """A number of the worker's config that is not finite (TOML ``inf``) is bad input (exit 2) naming the field, and
    the message says what is wrong with it (it said "must be positive, got inf")."""
    path = tmp_path / "w.toml"
    path.write_text(
        f'database_url = "sqlite:///x.sqlite3"\nplatform = "{SINK_PROFILE}"\n[intervals]\npoll_seconds = inf\n'
    )
    rc = main(["worker", "--config", str(path)])
    _, err = capsys.readouterr()
    assert rc == 2
    assert f"--config {path}: field intervals.poll_seconds: must be a finite number, got inf" in err
