"""What `audit verify` and the database catch beyond the hash chain (docs/design.md, "The chain replayed
through the table" and "The database refuses moves the table does not list"), on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3

import pytest
import sqlalchemy as sa

from atmostonce.audit import history_hash, verify_store
from atmostonce_sql.schema import history, intents
from tests.helpers import to_state


def _bypass_move_guard(store, conn) -> None:
    """What the tables' owner (or anyone holding the SQLite file) can still do: switch the guard off."""
    if store.dialect == "sqlite":
        conn.exec_driver_sql("DROP TRIGGER aom_intents_move_guard")
        conn.exec_driver_sql("DROP TRIGGER aom_intents_no_delete")
    else:
        conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # triggers and FK checks off


def test_the_database_refuses_a_raw_update_to_a_state_the_table_does_not_reach(sql_store):
    it, _ = to_state(sql_store, "indeterminate")
    with pytest.raises(sa.exc.DBAPIError) as refused:
        with sql_store.engine.begin() as conn:
            conn.execute(sa.update(intents).where(intents.c.key == it.key).values(state="pending"))
    assert "not in the transition table" in str(refused.value.orig)
    assert sql_store.get(it.key).state == "indeterminate"
    with sql_store.engine.begin() as conn:  # a move the table lists is not the trigger's business
        conn.execute(sa.update(intents).where(intents.c.key == it.key).values(state="parked"))


def test_the_database_refuses_deleting_an_intent_even_without_foreign_keys(sql_store):
    it, _ = to_state(sql_store, "published")
    if sql_store.dialect == "sqlite":  # a plain sqlite3 connection: foreign keys are off by default
        conn = sqlite3.connect(sql_store.engine.url.database)
        try:
            with pytest.raises(sqlite3.DatabaseError, match="DELETE of an intent refused"):
                conn.execute("DELETE FROM aom_intents WHERE key = ?", (it.key,))
        finally:
            conn.close()
    else:
        with pytest.raises(sa.exc.DBAPIError, match="DELETE of an intent refused"):
            with sql_store.engine.begin() as conn:
                conn.exec_driver_sql("SET LOCAL session_replication_role = origin")
                conn.execute(sa.delete(intents).where(intents.c.key == it.key))
    assert sql_store.get(it.key).state == "published"


def test_verify_names_an_intent_state_that_its_chain_does_not_derive(sql_store):
    it, _ = to_state(sql_store, "indeterminate")
    assert verify_store(sql_store).intact
    with sql_store.engine.begin() as conn:
        _bypass_move_guard(sql_store, conn)
        conn.execute(sa.update(intents).where(intents.c.key == it.key).values(state="pending"))
    report = verify_store(sql_store)
    assert [(b.key, b.reason, b.field) for b in report.breaks] == [(it.key, "intent", "state")]


def _forge(store, key: str, event: str, frm: str, to: str) -> None:
    """Append a history row the chain accepts (PostgreSQL's trigger chains it; on SQLite it is hashed here)
    and bump the intent's history count to match."""
    with store.engine.begin() as conn:
        gen = conn.execute(sa.select(intents.c.generation).where(intents.c.key == key)).scalar_one()
        if store.dialect == "postgresql":
            conn.execute(
                sa.insert(history).values(
                    key=key,
                    event=event,
                    actor="reconciler",
                    from_state=frm,
                    to_state=to,
                    generation=gen,
                    detail={},
                    recorded_at=1.5,
                )
            )
        else:
            h = history.c
            prev = conn.execute(sa.select(h.row_hash).where(h.key == key).order_by(h.seq.desc()).limit(1)).scalar()
            seq = conn.execute(sa.select(sa.func.max(h.seq))).scalar_one() + 1
            row_hash = history_hash(prev, seq, key, event, "reconciler", frm, to, None, gen, "{}", 1.5)
            conn.execute(
                sa.insert(history).values(
                    seq=seq,
                    key=key,
                    event=event,
                    actor="reconciler",
                    from_state=frm,
                    to_state=to,
                    generation=gen,
                    detail={},
                    recorded_at=1.5,
                    prev_hash=prev,
                    row_hash=row_hash,
                )
            )
        conn.execute(sa.update(intents).where(intents.c.key == key).values(history_count=intents.c.history_count + 1))


def test_verify_catches_a_forged_legal_looking_row_by_the_counters_it_derives(sql_store):
    it, _ = to_state(sql_store, "indeterminate")
    _forge(sql_store, it.key, "reconcile_not_found", "indeterminate", "indeterminate")
    report = verify_store(sql_store)
    assert [(b.key, b.reason, b.field) for b in report.breaks] == [(it.key, "intent", "reconcile_count")]


def test_verify_catches_a_forged_row_that_is_no_move_of_the_table(sql_store):
    it, _ = to_state(sql_store, "indeterminate")
    _forge(sql_store, it.key, "resend", "parked", "pending")  # a resend from a state the intent never reached
    (brk,) = verify_store(sql_store).breaks
    assert (brk.key, brk.reason, brk.field) == (it.key, "replay", "from_state")
    assert brk.seq == sql_store.audit_chain(it.key).rows[-1].seq


def test_verify_exposes_an_intent_deleted_under_the_store(sql_store):
    kept, _ = to_state(sql_store, "published", text="kept")
    gone, _ = to_state(sql_store, "published", text="gone")
    if sql_store.dialect == "sqlite":  # a plain sqlite3 connection (foreign keys off), the guard dropped
        with sql_store.engine.begin() as conn:
            _bypass_move_guard(sql_store, conn)
        raw = sqlite3.connect(sql_store.engine.url.database)
        try:
            raw.execute("DELETE FROM aom_intents WHERE key = ?", (gone.key,))
            raw.commit()
        finally:
            raw.close()
    else:
        with sql_store.engine.begin() as conn:
            _bypass_move_guard(sql_store, conn)
            conn.execute(sa.delete(intents).where(intents.c.key == gone.key))
    assert sql_store.find(gone.key) is None
    report = verify_store(sql_store)
    assert [(b.key, b.reason) for b in report.breaks] == [(gone.key, "missing_intent")]
    assert report.intents == 1 and kept.key in report.heads
