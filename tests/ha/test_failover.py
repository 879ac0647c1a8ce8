"""The SQL store on a real Patroni cluster (docs/design.md, "Failover and synchronous replication"): the store opens
libpq's multi-host URL, the authorization is acknowledged only once the synchronous standby has it and is refused with
a typed error while there is none, a move cut off by the primary's death is an unknown outcome resolved by re-reading
(nothing is sent), and the first connection to the promoted server records the failover; in ``async`` mode it fences
every lease and plan from before it like a declared restore."""

from __future__ import annotations

import threading
import time

import pytest

from atmostonce.errors import IllegalMove, NoSynchronousStandby, StoreError
from atmostonce.identity import request_digest
from atmostonce.runtime import Dispatcher, RuntimeConfig, wire_request
from atmostonce_function import FunctionTransport
from atmostonce_sql import open_store
from tests.ha.conftest import create_database

pytestmark = [pytest.mark.postgres, pytest.mark.slow]


def _authorize(store, lease):
    wire = wire_request(store.get(lease.key))
    return store.authorize_dispatch(
        lease, request_digest=request_digest(wire.body), send_lease_seconds=60.0, descriptor={}
    )


def _queued(store, n, prefix):
    return [store.submit("acct", "post", f"{prefix}-{i}", {"text": f"{prefix} {i}"}).key for i in range(n)]


def _retry_store_errors(fn, timeout=60.0):
    """The first calls after a failover meet broken pooled connections (StoreError); the pool reconnects."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return fn()
        except StoreError as exc:
            if isinstance(exc, NoSynchronousStandby) or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def _wait_sync_rep_waiter(ha, name, timeout=30.0):
    """Wait until a backend on node ``name`` waits for the synchronous standby (wait event SyncRep)."""
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(ha.node_dsn(name), autocommit=True) as conn:
            if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone()[0]:
                return
        time.sleep(0.1)
    raise AssertionError("no commit waited for the synchronous standby")


def _wait_no_streaming_standby(ha, name, timeout=60.0):
    """Wait until the primary's walsender has noticed that its standby is gone (wal_sender_timeout)."""
    import psycopg

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with psycopg.connect(ha.node_dsn(name), autocommit=True) as conn:
            if not conn.execute("SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'").fetchone()[0]:
                return
        time.sleep(0.2)
    raise AssertionError("the standby still streams")


def test_authorization_is_refused_while_no_synchronous_standby_streams_and_other_moves_keep_working(ha_cluster):
    ha = ha_cluster
    create_database(ha, "refusal")
    store = open_store(ha.url("refusal", atmostonce_ha="sync"))
    try:
        first, second, third = _queued(store, 3, "r")
        assert _authorize(store, store.begin(first)).state == "authorized"
        lease = store.begin(second, lease_seconds=300.0)

        standby = next(n for n in ha.nodes if n != ha.primary())
        ha._kill_node(ha.nodes[standby])  # the standby's host dies; the primary stays
        _wait_no_streaming_standby(ha, ha.primary())
        with pytest.raises(NoSynchronousStandby) as caught:
            _authorize(store, lease)
        refused = caught.value
        assert refused.as_dict()["event"] == "authorize_dispatch"
        assert refused.key == second and refused.sync_standbys == 0
        assert store.get(second).state == "pending"  # nothing was written
        with pytest.raises(NoSynchronousStandby) as not_begun:  # nor is a dispatch begun that could not send
            store.begin(third)
        assert (not_begun.value.event, not_begun.value.key) == ("begin", third)
        assert store.attempts(third) == []
        assert store.submit("acct", "post", "r-late", {"text": "late"}).state == "pending"

        ha.restart(standby)
        ha.wait_replicating()
        assert _retry_store_errors(lambda: _authorize(store, lease)).state == "authorized"
    finally:
        store.close()


def test_a_failover_loses_no_authorization_and_a_move_cut_off_by_it_is_resolved_by_rereading(ha_cluster):
    ha = ha_cluster
    create_database(ha, "sync")
    create_database(ha, "async")
    store = open_store(ha.url("sync", atmostonce_ha="sync"))
    fenced_store = open_store(ha.url("async", atmostonce_ha="async"))
    sends = []
    dispatcher = Dispatcher(
        store,
        FunctionTransport(lambda wire: sends.append(wire.delivery_key) or "id"),
        RuntimeConfig(),
        work=lambda _intent: ha.hold_replication(),  # after begin: the standby gets nothing more from here on
    )
    try:
        done, cut_off = _queued(store, 2, "s")
        assert _authorize(store, store.begin(done)).state == "authorized"
        (stale,) = _queued(fenced_store, 1, "a")
        stale_lease = fenced_store.begin(stale)
        epoch_before = fenced_store.current_epoch()
        assert [(f["timeline"], f["kind"]) for f in store.failovers()] == [(1, "first_seen")]

        (later,) = _queued(store, 1, "later")
        later_lease = store.begin(later, lease_seconds=300.0)
        old = ha.primary()
        outcome: dict[str, BaseException] = {}

        def dispatch():
            try:
                dispatcher.dispatch(cut_off)
            except BaseException as exc:  # noqa: BLE001 - handed to the test thread
                outcome["raised"] = exc

        worker = threading.Thread(target=dispatch)
        worker.start()
        _wait_sync_rep_waiter(ha, old)
        ha.kill_primary()
        worker.join(60)
        assert isinstance(outcome.get("raised"), StoreError)  # the move's outcome is unknown to the worker
        assert sends == []  # and nothing was sent
        new = ha.wait_primary(exclude=old)
        assert new != old

        # re-reading settles it: the authorization was never acknowledged, and it is not on the new primary
        assert _retry_store_errors(lambda: store.get(cut_off)).state == "pending"
        assert store.get(done).state == "authorized"  # an acknowledged authorization survives the failover
        assert [(f["timeline"], f["kind"], f["mode"]) for f in store.failovers()][1:] == [(2, "failover", "sync")]
        assert store.current_epoch() == 1  # synchronous: nothing acknowledged was lost, nothing fenced

        # async mode: the first connection to the new timeline fences everything from before it
        assert _retry_store_errors(lambda: fenced_store.get(stale)).state == "indeterminate"
        assert fenced_store.current_epoch() == epoch_before + 1
        recorded = fenced_store.failovers()[-1]
        assert (recorded["timeline"], recorded["kind"], recorded["mode"]) == (2, "failover", "async")
        assert recorded["restore_epoch"] == epoch_before + 1 and recorded["fenced"] >= 1
        with pytest.raises(IllegalMove) as refused:  # the lease from before the failover sends nothing
            _retry_store_errors(lambda: _authorize(fenced_store, stale_lease))
        assert (refused.value.guard, refused.value.state) == ("source_state", "indeterminate")
        fence = [h for h in fenced_store.history(stale) if h.event == "restore_fence"]
        assert len(fence) == 1 and fence[0].actor == "operator:failover"

        # with the standby gone the promoted primary has no synchronous standby: authorizations wait
        with pytest.raises(NoSynchronousStandby):
            _retry_store_errors(lambda: _authorize(store, later_lease))
        ha.restart(old)  # the old primary rejoins as a standby
        ha.wait_replicating()
        assert ha.role(old) == "replica"
        assert _retry_store_errors(lambda: _authorize(store, later_lease)).state == "authorized"
    finally:
        store.close()
        fenced_store.close()
