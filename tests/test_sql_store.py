"""SQL-only properties on both dialects: schema equals migrations, append-only enforced by the
database, unique keys and tokens, the database clock decides, driver errors are mapped (docs/design.md#the-gate-is-the-conditional-write)."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from atmostonce import AppendOnlyViolation, GuardRefused, IllegalMove, StoreError
from atmostonce.names import EFFECT, EVENT, GUARD
from atmostonce_sql import make_engine, open_store
from atmostonce_sql.execution import APPEND_ONLY_SQLSTATE, Deadlock
from atmostonce_sql.schema import APPEND_ONLY_TABLES, metadata
from tests.helpers import begin_authorize, submit, to_state


def test_schema_built_from_migration_1_equals_the_declared_schema(sql_store):
    with sql_store.engine.connect() as conn:
        diffs = compare_metadata(MigrationContext.configure(conn), metadata)
    assert diffs == []


def test_migrations_are_recorded_and_idempotent(sql_store):
    from alembic.script import ScriptDirectory

    from atmostonce_sql import upgrade
    from atmostonce_sql.migrate import alembic_config, current_revision

    upgrade(sql_store.engine)  # a second run changes nothing
    assert current_revision(sql_store.engine) == ScriptDirectory.from_config(alembic_config()).get_current_head()


@pytest.mark.parametrize("table", APPEND_ONLY_TABLES)
@pytest.mark.parametrize("statement", ["UPDATE {t} SET recorded_at = 0", "DELETE FROM {t}"])
def test_append_only_tables_refuse_tampering(sql_store, table, statement):
    it, lease = to_state(sql_store, "indeterminate")
    with pytest.raises(IllegalMove) as late:  # a late success, kept in aom_late_outcomes
        sql_store.record_success(lease, remote_id="obj-late")
    sql_store.record_late_outcome(lease, outcome="send.success", refused=late.value, remote_id="obj-late")
    plan = sql_store.get(it.key).plan
    sql_store.reconcile_not_found(plan)
    with pytest.raises(GuardRefused):  # a stale plan: refused and recorded in aom_refusals
        sql_store.reconcile_not_found(plan)
    sql_store.capture_source("https://example.org/a", "a body")
    if table == "aom_failovers":  # written by a store in HA mode on a PostgreSQL cluster (tests/ha): one row here
        with sql_store._tx() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO aom_failovers (timeline, kind, mode, recorded_at) VALUES (1, 'first_seen', 'sync', 0)"
                )
            )
    sql_store.set_kill_switch("account:x", True, operator="ann")  # a row of the policy log
    column = {"aom_attempts": "opened_at", "aom_source_versions": "captured_at"}.get(table, "recorded_at")
    with sql_store.engine.connect() as conn:
        before = conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
    assert before > 0
    with pytest.raises(AppendOnlyViolation):
        with sql_store._tx() as conn:
            conn.exec_driver_sql(statement.format(t=table).replace("recorded_at", column))
    with sql_store.engine.connect() as conn:
        assert conn.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one() == before


@pytest.mark.postgres
def test_truncate_of_history_is_refused_on_postgresql(pg_store):
    to_state(pg_store, "published")
    with pytest.raises(AppendOnlyViolation):
        with pg_store._tx() as conn:
            conn.exec_driver_sql("TRUNCATE aom_history CASCADE")


def test_delivery_keys_and_attempt_tokens_are_unique_in_the_database(sql_store):
    it, lease = to_state(sql_store, "failed")
    with pytest.raises(StoreError):
        with sql_store._tx() as conn:
            conn.exec_driver_sql(
                "INSERT INTO aom_attempts (attempt_token, key, number, generation, request_digest, opened_at) "
                f"VALUES ('{lease.attempt_token}', '{it.key}', 99, 999999, 'x', 0)"
            )
    with pytest.raises(StoreError):
        with sql_store._tx() as conn:
            row = conn.execute(sa.text("SELECT * FROM aom_intents")).mappings().one()
            cols = ", ".join(row.keys())
            conn.execute(sa.text(f"INSERT INTO aom_intents ({cols}) SELECT {cols} FROM aom_intents"))


def test_history_rows_carry_sequence_actor_and_wall_time(sql_store):
    it, _ = to_state(sql_store, "parked")
    hist = sql_store.history(it.key)
    assert [h.seq for h in hist] == sorted({h.seq for h in hist})
    assert hist[-1].actor == "operator:alice" and hist[1].actor == "worker"
    now = sql_store.now()
    assert all(now - 60 < h.recorded_at <= now + 1 for h in hist)


def test_lease_deadlines_come_from_the_database_clock(sql_store):
    it = submit(sql_store)
    before = sql_store.now()
    lease = sql_store.begin(it.key, lease_seconds=30)
    after = sql_store.now()
    assert before + 30 <= lease.expires_at <= after + 30


@pytest.mark.parametrize("skew", [-600, 600])
def test_worker_clock_skew_changes_nothing(sql_store, monkeypatch, skew):
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    it = submit(sql_store)
    lease = sql_store.begin(it.key, lease_seconds=5)
    db_now = sql_store.now()
    assert abs(db_now - real()) < 5, "the store used the skewed worker clock"
    assert lease.expires_at - db_now <= 5
    assert sql_store.due_leases() == []  # a skewed worker cannot make a live lease look expired
    sql_store.authorize_dispatch(lease, request_digest=it.request_digest)
    assert sql_store.get(it.key).state == "authorized"


@pytest.mark.postgres
def test_sweeper_finds_due_leases_through_the_partial_index(pg_store):
    for i in range(50):
        begin_authorize(pg_store, submit(pg_store, text=f"t{i}").key)
    with pg_store.engine.connect() as conn:
        conn.exec_driver_sql("SET enable_seqscan = off")
        plan = "\n".join(
            r[0]
            for r in conn.exec_driver_sql(
                "EXPLAIN SELECT * FROM aom_intents WHERE lease_expires_at IS NOT NULL "
                "AND lease_expires_at <= 1e12 ORDER BY lease_expires_at LIMIT 100"
            )
        )
    assert "aom_intents_lease_due" in plan


def test_driver_errors_are_mapped_to_store_error(tmp_path):
    store = open_store(f"sqlite:///{tmp_path / 'x.sqlite3'}")
    with store.engine.begin() as conn:
        conn.exec_driver_sql("DROP TABLE aom_sequences")
    it = submit(store)
    with pytest.raises(StoreError):
        store.begin(it.key)
    store.close()


def test_a_sqlite_write_lock_held_elsewhere_is_a_store_error_and_moves_nothing(tmp_path):
    import sqlite3

    path = tmp_path / "x.sqlite3"
    store = open_store(f"sqlite:///{path}")
    it = submit(store)
    sa.event.listen(store.engine, "connect", lambda dbapi_conn, _r: dbapi_conn.execute("PRAGMA busy_timeout=50"))
    store.engine.dispose()  # every connection from here on waits 50 ms for a lock, not 30 s
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock: BEGIN IMMEDIATE cannot start
    try:
        with pytest.raises(StoreError):
            store.begin(it.key)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert store.get(it.key).state == "pending"
    store.close()


def test_unsupported_urls_are_refused():
    with pytest.raises(ValueError):
        make_engine("mysql://nobody@localhost/x")


@pytest.mark.postgres
def test_the_append_only_trigger_names_its_table_by_its_own_code(pg_store):
    to_state(pg_store, "published")
    with pytest.raises(AppendOnlyViolation) as e:
        with pg_store._tx() as conn:
            conn.exec_driver_sql("UPDATE aom_history SET event = event")
    diag = e.value.__cause__.orig.diag
    assert (e.value.__cause__.orig.sqlstate, diag.message_detail) == (APPEND_ONLY_SQLSTATE, "aom_history")


@pytest.mark.postgres
def test_a_deadlock_is_known_by_its_code_and_refuses_a_text_claim_as_the_window_guard(pg_store):
    """PostgreSQL's deadlock victim wrote nothing. Its SQLSTATE (40P01) alone makes it a Deadlock; in the
    move that claims a text slot it is the losing side of two conflicting claims, so it is refused as
    ``text_window_clear``; in any other move it stays a Deadlock for the caller to retry."""
    with pytest.raises(Deadlock):
        with pg_store._tx() as conn:
            conn.exec_driver_sql("DO $$ BEGIN RAISE EXCEPTION 'cycle' USING ERRCODE = 'deadlock_detected'; END $$")

    def victim():
        raise Deadlock("deadlock detected")

    authorize, begin = pg_store.table.event(EVENT.authorize_dispatch), pg_store.table.event(EVENT.begin)
    assert EFFECT.claim_text_slot in authorize.effects and EFFECT.claim_text_slot not in begin.effects
    with pytest.raises(GuardRefused) as refused:
        pg_store._refusing(authorize, "key-1", {}, victim)
    assert (refused.value.event, refused.value.guard) == (EVENT.authorize_dispatch, GUARD.text_window_clear)
    with pytest.raises(Deadlock):
        pg_store._refusing(begin, "key-1", {}, victim)


def test_a_move_missing_a_parameter_is_refused_before_it_is_sent_never_sent_with_null(sql_store):
    """The store builds a statement's arguments from a plan made once (``Executor.arguments``): a parameter
    the statement needs and the caller did not give is an error, as SQLAlchemy's own check makes it, and
    the statement's own constants (states, event names) are there without being passed."""
    ev = sql_store.table.event(EVENT.record_not_sent)
    stmts = sql_store._statements(ev)
    name = "one" if sql_store.dialect == "postgresql" else "update"
    arguments = sql_store._exec.arguments(stmts, name)
    with pytest.raises(sa.exc.InvalidRequestError, match="bind parameter 'p_"):
        arguments({})
    params = sql_store._params(ev, "k", {"reason": "r", "attempt_token": "t", "generation": 1, "epoch": 0}, None)
    values = arguments(params)
    assert "k" in values and ev.target in values and ev.sources[0] in values
