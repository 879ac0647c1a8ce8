"""A page of due work costs a page of an index, however long the queue and however many intents share a
creation time (docs/performance.md, the plan table; migration 0015).

The worker's pick (``claimable``) and the reconciler's (``list_intents(state=...)``) order by creation time,
then key. With the key in their partial indexes (``aom_intents_claimable``, ``aom_intents_unknown``) the database reads
the first entries of the index and stops: no sort of every tied row, and a page after a key (``after=``)
starts at that key. Checked on PostgreSQL with the statistics stale (the backlog arrived after the last
ANALYZE), as a queue that grows suddenly leaves them.
"""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

pytestmark = pytest.mark.postgres

BACKLOG = 5000


def _plan(store, pick):
    """The plan PostgreSQL runs for the query ``pick()`` sends, in a transaction with the settings it sends
    before it (EXPLAIN ANALYZE, BUFFERS)."""
    sent = []

    def seen(conn, cursor, statement, parameters, context, executemany):
        sent.append((statement, parameters))

    sa.event.listen(store.engine, "before_cursor_execute", seen)
    try:
        result = pick()
    finally:
        sa.event.remove(store.engine, "before_cursor_execute", seen)
    *settings, (statement, parameters) = sent  # the pick's transaction: its settings, then its one query
    with store.engine.begin() as conn:
        for setting, values in settings:
            conn.exec_driver_sql(setting, values)
        raw = conn.exec_driver_sql("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + statement, parameters).scalar_one()
    plan = (json.loads(raw) if isinstance(raw, str) else raw)[0]["Plan"]
    return result, plan


def _nodes(plan):
    yield plan
    for child in plan.get("Plans", []):
        yield from _nodes(child)


def _tied_backlog(store, state):
    """``BACKLOG`` intents in ``state`` with one creation time, inserted after the last ANALYZE."""
    with store.engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE aom_intents")
        conn.exec_driver_sql(
            """
            INSERT INTO aom_intents (key, account, action_kind, target, request, request_digest, state,
              attempt_count, max_attempts, reconcile_count, max_reconciles, resend_epoch, normalizer_version,
              created_at, updated_at, history_count)
            SELECT md5('tied' || i) || md5('k' || i), 'acct', 'post', 'room-' || i, '{"text":"tied"}', md5('d' || i),
                   %(state)s, 0, 3, 0, 3, 0, 1, 1700000000.0, 1700000000.0, 0
            FROM generate_series(1, %(n)s) AS i
            """,
            {"state": state, "n": BACKLOG},
        )


def _reads_a_page(plan, index, limit):
    kinds = [n["Node Type"] for n in _nodes(plan)]
    scans = [n.get("Index Name") for n in _nodes(plan) if n.get("Relation Name") == "aom_intents"]
    assert index in scans, list(_nodes(plan))
    assert not {"Sort", "Incremental Sort", "Seq Scan"} & set(kinds), kinds
    # about a buffer per row returned (its index entry and heap row), not one per tied row of the backlog
    assert plan["Shared Hit Blocks"] + plan.get("Shared Read Blocks", 0) <= 2 * limit + 10


def test_a_workers_pick_reads_one_page_of_the_index_behind_a_tied_backlog(pg_store):
    _tied_backlog(pg_store, pg_store.table.initial)
    first, plan = _plan(pg_store, lambda: pg_store.claimable(100))
    assert len(first) == 100 and first == sorted(first)  # one creation time: key order
    _reads_a_page(plan, "aom_intents_claimable", 100)
    after, plan = _plan(pg_store, lambda: pg_store.claimable(100, after=first[-1]))
    assert after[0] > first[-1] and len(after) == 100
    _reads_a_page(plan, "aom_intents_claimable", 100)


def test_the_reconcilers_pick_reads_one_page_of_the_index_behind_a_tied_backlog(pg_store):
    _tied_backlog(pg_store, "indeterminate")
    first, plan = _plan(pg_store, lambda: pg_store.list_intents(state="indeterminate", limit=50))
    keys = [it.key for it in first]
    assert len(keys) == 50 and keys == sorted(keys)
    _reads_a_page(plan, "aom_intents_unknown", 50)
    after, plan = _plan(pg_store, lambda: pg_store.list_intents(state="indeterminate", limit=50, after=keys[-1]))
    assert after[0].key > keys[-1]
    _reads_a_page(plan, "aom_intents_unknown", 50)


def test_an_authorization_behind_a_backlog_the_statistics_missed_reads_its_row_by_key(pg_databases):
    """A queue that grew after the last ANALYZE: the statistics call the queue's partial index nearly empty. The
    authorization of one queued intent must still read that intent's row through the primary key, from the
    first run of its statement on a new connection (a custom plan made with the values chose the queue's
    index there, and read the whole backlog for the one key)."""
    import psycopg

    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    store = open_store(url, migrate=False)
    try:
        _tied_backlog(store, store.table.initial)
        with store.engine.connect() as conn:
            keys = [k for (k,) in conn.exec_driver_sql("SELECT key FROM aom_intents ORDER BY key LIMIT 6")]
    finally:
        store.close()
    admin = psycopg.connect(dsn, autocommit=True)
    try:
        admin.execute("SELECT pg_stat_reset()")
        store = open_store(url, migrate=False)  # new connections: no statement of theirs planned yet
        try:
            for k in keys:
                store.begin_and_authorize(k, request_digest=store.get(k).request_digest)
        finally:
            store.close()
        for _ in range(2000):  # the store's backends report their counts as they exit
            others = admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
            ).fetchone()[0]
            if others == 0:
                break
            admin.execute("SELECT pg_sleep(0.005)")
        read = dict(
            admin.execute(
                "SELECT indexrelname, idx_tup_read FROM pg_stat_user_indexes WHERE relname = 'aom_intents'"
            ).fetchall()
        )
    finally:
        admin.close()
        pg_databases.drop(url)
    assert read["aom_intents_claimable"] == read["aom_intents_state"] == 0, read
    assert read["aom_intents_pkey"] > 0


def test_an_authorization_planned_while_the_text_claims_were_empty_reads_them_through_their_index(pg_databases):
    """A cached generic plan outlives the statistics it was made from. The store's statements are planned on
    their first run, here on a new database whose tables were all analyzed empty; then thousands of text claims
    arrive (other accounts' sends) with no ANALYZE since. Every later authorization still checks the duplicate
    text window through the claims' index, never by reading the whole table: the claims table's sequential
    scans stay at zero across the publishes (``pg_stat_user_tables``)."""
    from atmostonce.runtime import Dispatcher
    from atmostonce_sql import open_store
    from tests.test_fused_dispatch import CONFIG, Platform

    url = pg_databases.fresh()
    store = open_store(url, migrate=False, pool_size=1)
    try:
        with store.engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")  # what autovacuum does on a new database: every table counted empty
        dispatcher = Dispatcher(store, Platform(), CONFIG)
        assert dispatcher.publish("acct", "post", "room-0", {"text": "first"})[1] == "read_back.match"
        with store.engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO aom_text_claims (key, account, text_hash, start_at, end_at, released) "
                "SELECT i.key, 'other-' || g, md5(g::text), 0, 1e12, false "
                "FROM aom_intents i, generate_series(1, %s) g",
                (BACKLOG,),
            )

        def scans():
            # the store's one connection reports its counters when it next goes idle, not later
            with store._exec.tx(autocommit=True) as conn:
                conn.exec_driver_sql("SELECT pg_stat_force_next_flush()")
            with store.engine.connect() as conn:
                conn.exec_driver_sql("SELECT pg_stat_clear_snapshot()")
                return conn.exec_driver_sql(
                    "SELECT seq_scan, idx_scan FROM pg_stat_user_tables WHERE relname = 'aom_text_claims'"
                ).one()

        seq_before, idx_before = scans()
        for i in range(1, 6):
            assert dispatcher.publish("acct", "post", f"room-{i}", {"text": f"send {i}"})[1] == "read_back.match"
        seq_after, idx_after = scans()
        assert seq_after == seq_before
        assert idx_after >= idx_before + 5
    finally:
        store.close()
        pg_databases.drop(url)
