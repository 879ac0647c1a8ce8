"""Sequences after a restore, and the restore declared in one transaction (docs/design.md, "Sequences after a
restore" and "Declaring a restore is atomic"), on SQLite and PostgreSQL. The real pg_dump/pg_restore
version is in tests/test_pg_restore.py; here the sequences are put back the way a partial restore leaves them."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from atmostonce import GuardRefused, SequenceBehind, StoreError
from atmostonce_cli.main import main as cli
from atmostonce_sql import open_store
from atmostonce_sql.schema import history, intents, meta
from atmostonce_sql.sequences import identity_columns, sequences_behind
from tests.helpers import submit, to_state


def rewind_sequences(store) -> None:
    """Put every sequence back to its start, as a restore without the sequence positions does."""
    with store.engine.begin() as conn:
        if store.dialect == "sqlite":
            conn.exec_driver_sql("UPDATE aom_sequences SET value = 0")
            conn.exec_driver_sql("UPDATE sqlite_sequence SET seq = 0")
            return
        for name, table, column in identity_columns():
            seq = (
                "aom_generation"
                if name == "generation"
                else conn.exec_driver_sql(f"SELECT pg_get_serial_sequence('{table}', '{column}')").scalar_one()
            )
            conn.exec_driver_sql(f"ALTER SEQUENCE {seq} RESTART WITH 1")


def _url(store) -> str:
    return store.engine.url.render_as_string(hide_password=False)


def _some_work(store):
    """A published intent, a failed one, and one in flight whose lease a (soon stale) worker holds."""
    to_state(store, "published", text="one")
    to_state(store, "failed", text="two")
    inflight = submit(store, text="three")
    lease = store.begin(inflight.key, lease_seconds=30)
    return inflight, lease


def test_open_refuses_a_store_whose_sequences_are_behind_the_data(sql_store, capsys):
    _, lease = _some_work(sql_store)
    rewind_sequences(sql_store)
    with pytest.raises(SequenceBehind) as refused:
        open_store(_url(sql_store), migrate=False)
    exc = refused.value
    behind = {name: (value, stored) for name, value, stored in exc.behind}
    assert behind["generation"] == (0, lease.generation)
    assert behind["aom_history.seq"][0] == 0 and behind["aom_history.seq"][1] > 0
    assert (exc.sequence, exc.value, exc.stored_max) == exc.behind[0]
    assert exc.repair == "atmostonce db declare-restore --operator NAME"
    # every command but the repair refuses, with the same structured fields
    assert cli(["--json", "intents", "list", "--database-url", _url(sql_store)]) == 3
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert doc["sequence_behind"]["sequence"] == exc.sequence
    assert doc["sequence_behind"]["stored_max"] == exc.stored_max


def test_declare_restore_moves_every_sequence_past_the_data_and_new_leases_outrank_old_generations(sql_store):
    inflight, stale = _some_work(sql_store)
    with sql_store.engine.connect() as conn:
        old_max_generation = conn.exec_driver_sql("SELECT max(generation) FROM aom_attempts").scalar_one()
    rewind_sequences(sql_store)
    assert cli(["db", "declare-restore", "--operator", "ops", "--database-url", _url(sql_store)]) == 0
    store = open_store(_url(sql_store), migrate=False)  # no longer refused
    try:
        with store.engine.connect() as conn:
            assert sequences_behind(conn) == ()
        fresh = submit(store, text="after the restore")  # the history sequence no longer collides
        assert store.begin(fresh.key, lease_seconds=30).generation > old_max_generation
        # the intent in flight at the backup is settled by a person, then worked again under a new lease
        assert store.get(inflight.key).state == "indeterminate"
        store.park(inflight.key, operator="ops")
        store.resolve_not_sent(inflight.key, operator="ops")
        store.retry(inflight.key)
        renewed = store.begin(inflight.key, lease_seconds=30)
        assert renewed.generation > old_max_generation
        with pytest.raises(GuardRefused) as refused:  # the worker from before the restore, before any byte
            store.authorize_dispatch(stale, request_digest=inflight.request_digest)
        assert refused.value.guard in store.table.fencing_guards
        assert refused.value.event == "authorize_dispatch"
        assert store.get(inflight.key).attempt_token == renewed.attempt_token
    finally:
        store.close()


def _inject_failure_on_second_fence(store) -> None:
    """Make the database refuse the second restore_fence history row (a failure in the middle of the fencing)."""
    with store.engine.begin() as conn:
        if store.dialect == "sqlite":
            conn.exec_driver_sql(
                "CREATE TRIGGER aom_test_inject BEFORE INSERT ON aom_history WHEN NEW.event = 'restore_fence' "
                "AND (SELECT count(*) FROM aom_history WHERE event = 'restore_fence') >= 1 "
                "BEGIN SELECT RAISE(ABORT, 'injected failure'); END"
            )
            return
        conn.exec_driver_sql(
            "CREATE FUNCTION aom_test_inject() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.event = 'restore_fence' AND (SELECT count(*) FROM aom_history WHERE event = 'restore_fence') >= 1 "
            "THEN RAISE EXCEPTION 'injected failure'; END IF; RETURN NEW; END $$"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER aom_test_inject BEFORE INSERT ON aom_history FOR EACH ROW EXECUTE FUNCTION aom_test_inject()"
        )


def _snapshot(store):
    with store.engine.connect() as conn:
        return (
            conn.execute(sa.select(meta.c.value).where(meta.c.name == "restore_epoch")).scalar_one(),
            sorted(conn.execute(sa.select(intents.c.key, intents.c.state, intents.c.history_count)).all()),
            conn.execute(sa.select(sa.func.count()).select_from(history)).scalar_one(),
            sequences_behind(conn),
        )


def test_a_declare_restore_that_fails_midway_changes_nothing(sql_store):
    _some_work(sql_store)
    to_state(sql_store, "pending", text="queued")
    rewind_sequences(sql_store)
    before = _snapshot(sql_store)
    assert before[0] == 1 and before[3]  # epoch 1, sequences behind
    _inject_failure_on_second_fence(sql_store)
    with pytest.raises(StoreError):
        sql_store.declare_restore(operator="ops")
    assert _snapshot(sql_store) == before  # no epoch bump, no intent fenced, no sequence moved


def test_the_open_check_is_one_statement(sql_store):
    statements = []
    sa.event.listen(sql_store.engine, "before_cursor_execute", lambda *a: statements.append(a[2]))
    with sql_store.engine.connect() as conn:
        assert sequences_behind(conn) == ()
    assert len([s for s in statements if not s.startswith("BEGIN")]) == 1
