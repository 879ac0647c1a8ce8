"""The worker process on PostgreSQL (docs/operations.md): a submit wakes an idle worker through
LISTEN/NOTIFY (migration 0009) long before its poll interval, and the worker outlives a restart of the
database under it, sending nothing twice."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest

from atmostonce_http import PlatformSink
from atmostonce_sql import open_store
from tests.worker_proc import WorkerProcess, write_config

pytestmark = pytest.mark.postgres

IDLE = {"poll_seconds": 60.0, "sweep_seconds": 60.0, "reconcile_seconds": 60.0}


def _until(cond, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.05)


def test_a_submit_wakes_an_idle_worker_through_notify(tmp_path, pg_databases):
    url = pg_databases.fresh()
    store = open_store(url, migrate=False)
    try:
        with PlatformSink(dedupe=False) as sink:
            w = WorkerProcess(write_config(tmp_path / "w.toml", url, sink.url, intervals=IDLE))
            try:
                w.wait_for(lambda r: r.get("event") == "worker.listen", what="LISTEN record")
                w.wait_for(lambda r: r.get("event") == "worker.start", what="start record")
                it = store.submit("acct", "post", "room", {"text": "wake up"})
                # the worker polls every 60 s: only the notification can bring it here within the wait
                w.wait_for(
                    lambda r: r.get("key") == it.key and r.get("state") == "published", timeout=40, what="publish"
                )
                rc, report = w.terminate()
            finally:
                w.close()
        assert rc == 0
        assert report["notified_wakes"] >= 1
        assert report["dispatched"] == {"read_back.match": 1}
        assert store.get(it.key).state == "published"
    finally:
        store.close()
        pg_databases.drop(url)


def test_only_moves_into_the_claimable_state_notify_and_the_payload_names_it(pg_databases):
    """A NOTIFY serializes the commits of every notifying transaction on the queue's lock: only a row that
    became claimable (submitted, or moved back to the initial state) notifies; a park does not."""
    import psycopg

    from atmostonce_sql.notify import CHANNEL, conninfo, is_due

    url = pg_databases.fresh()
    store = open_store(url, migrate=False)
    try:
        with psycopg.connect(conninfo(store), autocommit=True) as conn:
            conn.execute(f"LISTEN {CHANNEL}")
            it = store.submit("acct", "post", "room", {"text": "n"})
            store.park(it.key, operator="alice")
            store.resend(it.key, operator="alice")
            payloads = [n.payload for n in conn.notifies(timeout=2, stop_after=3)]
        assert payloads == [f"intent:{store.table.initial}"] * 2
        assert [is_due(store, p) for p in payloads] == [True, True]
        assert not is_due(store, "intent:parked")
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.slow
def test_a_worker_process_outlives_a_postgresql_restart_and_sends_nothing_twice(tmp_path):
    from atmostonce_sql.pgserver import LocalCluster

    parent = tempfile.mkdtemp(prefix="atmostonce-wrestart-", dir="/tmp")
    os.chmod(parent, 0o755)
    cluster = LocalCluster(os.path.join(parent, "pg"), remove_on_stop=False, fsync=True).start()
    store = w = None
    try:
        url = cluster.create_database("wrestart")
        store = open_store(url)
        with PlatformSink(dedupe=False) as sink:
            cfg = write_config(
                tmp_path / "w.toml",
                url,
                sink.url,
                workers=2,
                intervals={"poll_seconds": 0.2, "sweep_seconds": 0.5, "reconcile_seconds": 0.5},
                runtime={"lease_seconds": 3, "send_lease_seconds": 3, "reconcile_interval": 0},
            )
            w = WorkerProcess(cfg)
            before = [store.submit("acct", "post", "room", {"text": f"before {i}"}).key for i in range(3)]
            for k in before:
                w.wait_for(lambda r, k=k: r.get("key") == k and r.get("state") == "published", what="publish")
            store.close()
            cluster.stop()
            w.wait_for(lambda r: r.get("event") == "worker.backoff", what="a backoff during the outage")
            w.wait_for(lambda r: r.get("event") == "worker.listen_lost", what="the lost LISTEN connection")
            assert w.proc.poll() is None  # alive through the outage
            cluster.start()
            store = open_store(url, migrate=False)
            after = [store.submit("acct", "post", "room", {"text": f"after {i}"}).key for i in range(3)]
            # an outcome committed just before the crash may be lost (outcomes do not wait for the disk,
            # docs/design.md#two-durable-points-per-send): that intent is back in flight, and its lease's
            # expiry and the lookup publish it again, without a second send
            everything = before + after
            _until(lambda: all(store.get(k).state == "published" for k in everything), what="publish after the restart")
            rc, report = w.terminate()
            assert rc == 0 and report["errors"]
            assert sink.creates == 6 and sink.creates_by_key == dict.fromkeys(everything, 1)
    finally:
        if w is not None:
            w.close()
        if store is not None:
            store.close()
        cluster.remove_on_stop = True
        cluster.stop()
        shutil.rmtree(parent, ignore_errors=True)
