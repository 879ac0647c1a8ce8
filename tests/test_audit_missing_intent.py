"""verify_store reports history whose intent row is gone as a structured break: reason missing_intent, field key."""

from __future__ import annotations

import sqlite3

import atmostonce
from atmostonce.audit import verify_store
from tests.helpers import to_state


def _delete_intent_under_the_store(store, path, key) -> None:
    with store.engine.begin() as conn:  # what the file's owner can do: drop the guards
        conn.exec_driver_sql("DROP TRIGGER aom_intents_move_guard")
        conn.exec_driver_sql("DROP TRIGGER aom_intents_no_delete")
    raw = sqlite3.connect(path)  # a plain connection: foreign keys off
    try:
        raw.execute("DELETE FROM aom_intents WHERE key = ?", (key,))
        raw.commit()
    finally:
        raw.close()


def test_an_intent_deleted_under_the_store_is_a_missing_intent_break_on_the_key_field(tmp_path):
    path = tmp_path / "a.sqlite3"
    store = atmostonce.open_store(f"sqlite:///{path}")
    try:
        kept, _ = to_state(store, "published", text="kept")
        gone, _ = to_state(store, "published", text="gone")
        _delete_intent_under_the_store(store, str(path), gone.key)
        report = verify_store(store)
        (brk,) = report.breaks
        assert (brk.key, brk.seq, brk.reason, brk.field) == (gone.key, None, "missing_intent", "key")
        d = report.as_dict()
        assert d["intact"] is False
        assert [(b["key"], b["reason"], b["field"]) for b in d["breaks"]] == [(gone.key, "missing_intent", "key")]
        assert report.intents == 1 and set(report.heads) == {kept.key}
    finally:
        store.close()
