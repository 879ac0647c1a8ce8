"""A real backup and restore on PostgreSQL (issue 6): pg_dump while a worker holds a lease, the
worker sends, the database is restored (sequences back to the dump's values, as a restore does),
the restore is declared; the old worker is refused before any byte and nothing is resent."""

from __future__ import annotations

import subprocess

import pytest
import sqlalchemy as sa

from atmostonce import Rejected
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper, wire_request
from atmostonce_cli.main import main as cli
from atmostonce_http import HttpTransport, PlatformSink, sink_config
from atmostonce_sql import open_store
from atmostonce_sql.pgserver import find_pg_bin

pytestmark = pytest.mark.postgres

CONFIG = RuntimeConfig(lease_seconds=30, send_lease_seconds=30, reconcile_interval=0)


def _pg(tool: str, *args: str) -> None:
    subprocess.run([str(find_pg_bin() / tool), *args], check=True, capture_output=True, timeout=120)


def test_restore_fences_pre_restore_workers_and_resends_nothing(pg_databases, tmp_path):
    url = pg_databases.fresh()
    dsn = sa.engine.make_url(url)
    conn_args = ["-h", dsn.query["host"], "-p", str(dsn.query["port"]), "-U", dsn.username or "postgres"]
    store = open_store(url, migrate=False)
    dump = tmp_path / "backup.dump"
    try:
        with PlatformSink(dedupe=False, fenced_lookup=True) as sink:
            cfg = sink_config(sink.url, key_field="/delivery_key", lookup_fenced=True)
            with HttpTransport(cfg) as transport:
                queued = store.submit("acct", "post", "room", {"text": "queued before the backup"})
                inflight = store.submit("acct", "post", "room", {"text": "in flight at the backup"})
                lease = store.begin(inflight.key, lease_seconds=30)
                _pg("pg_dump", *conn_args, "-Fc", "-f", str(dump), dsn.database)

                # after the backup: the worker sends and the other intent is published too
                store.authorize_dispatch(lease, request_digest=inflight.request_digest)
                sent = transport.send(wire_request(store.get(inflight.key)))
                store.record_success(lease, remote_id=sent.remote_id)
                store.confirm_read_back(lease)
                Dispatcher(store, transport, CONFIG).dispatch(queued.key)
                assert sink.creates == 2
                store.close()

                # the disaster: restore the backup over the database (sequences come back as dumped)
                _pg("pg_restore", *conn_args, "--clean", "--if-exists", "-d", dsn.database, str(dump))
                store = open_store(url, migrate=False)
                assert store.get(inflight.key).state == "pending"  # the restored row still shows the old lease
                assert store.get(queued.key).state == "pending"

                # the restore protocol: declare it before any worker reconnects
                assert cli(["db", "declare-restore", "--operator", "ops", "--database-url", url]) == 0
                with pytest.raises(Rejected):  # the worker from before the restore: refused before any byte
                    store.authorize_dispatch(lease, request_digest=inflight.request_digest)
                assert sink.requests == 2

                # settle: the platform is looked at, never resent blindly
                Reconciler(store, transport, CONFIG).run()
                Sweeper(store, CONFIG).retry_failed()
                for key in store.claimable():
                    Dispatcher(store, transport, CONFIG).dispatch(key)
                assert {store.get(k).state for k in (queued.key, inflight.key)} == {"published"}
                assert sink.creates == 2 and sink.creates_by_key == {queued.key: 1, inflight.key: 1}
                assert store.current_epoch() == 2
    finally:
        store.close()
        pg_databases.drop(url)
