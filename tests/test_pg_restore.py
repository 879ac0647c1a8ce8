"""A real backup and restore on PostgreSQL (docs/design.md#fencing-that-survives-a-restore): pg_dump while a worker holds a lease, the
worker sends, the database is restored (sequences back to the dump's values, as a restore does),
the restore is declared; the old worker is refused before any byte, a straggler past its send and a
reconciler's plan from before the restore are refused, and nothing is resent (docs/formal.md)."""

from __future__ import annotations

import json
import subprocess

import pytest
import sqlalchemy as sa

from atmostonce import GuardRefused, Rejected
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
                # a straggler: authorized before the backup, it sends before the restore and records after
                late = store.submit("acct", "post", "room", {"text": "a straggler past its send"})
                late_lease = store.begin(late.key, lease_seconds=30)
                store.authorize_dispatch(late_lease, request_digest=late.request_digest, send_lease_seconds=30)
                # an unknown outcome the reconciler plans on before the restore
                lost = store.submit("acct", "post", "room", {"text": "timed out before the backup"})
                lost_lease = store.begin(lost.key, lease_seconds=30)
                store.authorize_dispatch(lost_lease, request_digest=lost.request_digest)
                transport.send(wire_request(store.get(lost.key)))  # it lands; the worker never hears
                store.record_unknown(lost_lease, reason="read timeout")
                _pg("pg_dump", *conn_args, "-Fc", "-f", str(dump), dsn.database)

                # after the backup: the worker sends and the other intent is published too
                store.authorize_dispatch(lease, request_digest=inflight.request_digest)
                sent = transport.send(wire_request(store.get(inflight.key)))
                store.record_success(lease, remote_id=sent.remote_id)
                store.confirm_read_back(lease)
                Dispatcher(store, transport, CONFIG).dispatch(queued.key)
                late_sent = transport.send(wire_request(store.get(late.key)))  # bytes out; not recorded yet
                stale_plan = store.get(lost.key).plan  # planned before the restore
                assert stale_plan.epoch == 1
                assert sink.creates == 4
                store.close()

                # the disaster: restore the backup over the database (sequences come back as dumped)
                _pg("pg_restore", *conn_args, "--clean", "--if-exists", "-d", dsn.database, str(dump))
                store = open_store(url, migrate=False)
                assert store.get(inflight.key).state == "pending"  # the restored row still shows the old lease
                assert store.get(queued.key).state == "pending"
                restored_late = store.get(late.key)
                assert (restored_late.state, restored_late.attempt_token) == ("authorized", late_lease.attempt_token)
                assert restored_late.generation == late_lease.generation  # (token, generation) alone would pass

                # the restore protocol: declare it before any worker reconnects. Its first step advances
                # the restore epoch; a straggler writing before its row is fenced meets the epoch fence
                store._bump_epoch()
                with pytest.raises(GuardRefused) as refused:
                    store.record_success(late_lease, remote_id=late_sent.remote_id)
                assert refused.value.guard == "restore_epoch_current"
                assert store.get(late.key).remote_id is None
                assert cli(["db", "declare-restore", "--operator", "ops", "--database-url", url]) == 0
                with pytest.raises(Rejected):  # the worker from before the restore: refused before any byte
                    store.authorize_dispatch(lease, request_digest=inflight.request_digest)
                with pytest.raises(Rejected):  # the straggler again, after the fence
                    store.record_success(late_lease, remote_id=late_sent.remote_id)
                # the plan from before the restore is refused whatever it claims; a fresh plan cannot
                # prove absence for an attempt begun before the restore
                with pytest.raises(GuardRefused) as refused:
                    store.reconcile_absent(stale_plan, fenced=True)
                assert refused.value.guard == "plan_unchanged"
                with pytest.raises(GuardRefused) as refused:
                    store.reconcile_absent(store.get(lost.key).plan, fenced=True)
                assert refused.value.guard == "absence_provable"
                assert store.get(lost.key).state == "indeterminate"
                assert sink.requests == 4

                # settle: the platform is looked at, never resent blindly
                Reconciler(store, transport, CONFIG).run()
                Sweeper(store, CONFIG).retry_failed()
                for key in store.claimable():
                    Dispatcher(store, transport, CONFIG).dispatch(key)
                keys = (queued.key, inflight.key, late.key, lost.key)
                assert {store.get(k).state for k in keys} == {"published"}  # each found on the platform
                assert sink.creates == 4 and sink.creates_by_key == dict.fromkeys(keys, 1)  # nothing resent
                assert store.current_epoch() == 3  # the straggler step above advanced it once more
    finally:
        store.close()
        pg_databases.drop(url)


def test_a_restore_without_sequence_positions_is_refused_on_open_and_repaired_by_declare_restore(
    pg_databases, tmp_path, capsys
):
    """pg_dump A, pg_restore into an empty B without the dump's SEQUENCE SET entries (what a schema-only or
    partial restore leaves): B refuses to open, declare-restore repairs it in one go, and work resumes with
    generations past every stored one while the worker from before the dump is refused."""
    from atmostonce import SequenceBehind
    from atmostonce.store import FENCING_GUARDS
    from tests.helpers import submit, to_state

    url_a = pg_databases.fresh()
    dsn = sa.engine.make_url(url_a)
    conn_args = ["-h", dsn.query["host"], "-p", str(dsn.query["port"]), "-U", dsn.username or "postgres"]
    name_b = f"{dsn.database}_b"
    url_b = dsn.set(database=name_b).render_as_string(hide_password=False)
    dump, listing = tmp_path / "a.dump", tmp_path / "a.list"
    store = open_store(url_a, migrate=False)
    try:
        for i in range(5):
            to_state(store, "published", text=f"published {i}")
        inflight = submit(store, text="in flight at the dump")
        stale = store.begin(inflight.key, lease_seconds=30)
        _pg("pg_dump", *conn_args, "-Fc", "-f", str(dump), dsn.database)
    finally:
        store.close()
    with pg_databases.admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name_b}"')
    try:
        entries = subprocess.run(
            [str(find_pg_bin() / "pg_restore"), "-l", str(dump)], check=True, capture_output=True, text=True
        ).stdout.splitlines()
        kept = [e for e in entries if "SEQUENCE SET" not in e]
        assert len(kept) < len(entries)  # the dump had sequence positions, and they are left behind
        listing.write_text("\n".join(kept) + "\n", encoding="utf-8")
        _pg("pg_restore", *conn_args, "--use-list", str(listing), "-d", name_b, str(dump))

        with pytest.raises(SequenceBehind) as refused:
            open_store(url_b, migrate=False)
        behind = {n: (v, m) for n, v, m in refused.value.behind}
        assert behind["generation"] == (0, stale.generation)
        assert behind["aom_history.seq"][1] > 0
        assert refused.value.repair == "atmostonce db declare-restore --operator NAME"

        assert cli(["--json", "db", "declare-restore", "--operator", "ops", "--database-url", url_b]) == 0
        out = json.loads(capsys.readouterr().out)
        assert (out["restore_epoch"], out["fenced"]) == (2, 1)
        store = open_store(url_b, migrate=False)
        try:
            fresh = submit(store, text="after the restore")  # the history sequence no longer collides
            assert store.begin(fresh.key, lease_seconds=30).generation > stale.generation
            store.park(inflight.key, operator="ops")
            store.resolve_not_sent(inflight.key, operator="ops")
            store.retry(inflight.key)
            renewed = store.begin(inflight.key, lease_seconds=30)
            assert renewed.generation > stale.generation
            with pytest.raises(GuardRefused) as stale_refused:  # before any byte
                store.authorize_dispatch(stale, request_digest=inflight.request_digest)
            assert stale_refused.value.guard in FENCING_GUARDS
            assert store.get(inflight.key).attempt_token == renewed.attempt_token
        finally:
            store.close()
    finally:
        pg_databases.drop(url_b)
        pg_databases.drop(url_a)
