"""The database refuses a state the tables do not declare (migration 0013, generated from the tables by
atmostonce_sql.state_checks), on SQLite and PostgreSQL."""

from __future__ import annotations

import re

import pytest
import sqlalchemy as sa

from atmostonce.table import table
from atmostonce_sql.state_checks import state_check_statements, state_checks
from tests.helpers import submit


def test_a_write_of_an_undeclared_intent_state_is_refused_naming_the_constraint(sql_store):
    it = submit(sql_store)
    with pytest.raises(sa.exc.IntegrityError) as e, sql_store.engine.begin() as conn:
        if sql_store.dialect == "postgresql":  # past the move-guard trigger (it refuses too): the CHECK itself
            conn.execute(sa.text("SET LOCAL session_replication_role = replica"))
        conn.execute(sa.text("UPDATE aom_intents SET state = 'teleported' WHERE key = :k"), {"k": it.key})
    if sql_store.dialect == "postgresql":
        assert e.value.orig.diag.constraint_name == "aom_intents_state_declared"
    else:
        assert "aom_intents_state_declared" in str(e.value.orig)
    assert sql_store.get(it.key).state == "pending"
    with sql_store.engine.begin() as conn:  # a declared state is accepted: the rule is the table, not a block
        conn.execute(sa.text("UPDATE aom_intents SET prev_state = 'parked' WHERE key = :k"), {"k": it.key})


def test_the_databases_rules_are_the_ones_the_current_tables_give(sql_store):
    with sql_store.engine.connect() as conn:
        if sql_store.dialect == "postgresql":
            rows = conn.execute(
                sa.text("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conname LIKE '%_declared'")
            ).all()
            found = {name: set(re.findall(r"'([a-z_]+)'::text", d)) - {"claim", "approval"} for name, d in rows}
            assert found["aom_intents_state_declared"] == set(table().states)
            assert set(found) == {c.name for c in state_checks()}
        else:
            sql = conn.execute(
                sa.text("SELECT sql FROM sqlite_master WHERE type = 'trigger' AND name LIKE '%_declared_%'")
            )
            assert {r[0] for r in sql} == set(state_check_statements("sqlite"))
