"""The store's PostgreSQL sessions never JIT-compile a statement (adapters/atmostonce_sql/execution.py,
``GENERIC_PLANS_SQL``). Those sessions turn sequential scans off, so a table with an index is read through it
whatever its statistics say; a table without one is still scanned, priced at PostgreSQL's disable cost, which
is above every JIT threshold. Each run of such a statement was then compiled anew: half a second of server CPU
for a one-row statement (a test clock table read by every move made each move take that long)."""

from __future__ import annotations

import pytest


@pytest.mark.postgres
def test_a_statement_the_store_must_scan_is_not_compiled_on_each_run(pg_store):
    with pg_store._autocommit.connect() as conn:
        conn.exec_driver_sql("CREATE TEMP TABLE aom_unindexed (t double precision)")
        conn.exec_driver_sql("INSERT INTO aom_unindexed VALUES (1)")
        (plan,) = conn.exec_driver_sql("EXPLAIN (ANALYZE, FORMAT JSON) SELECT t + 1 FROM aom_unindexed").scalar_one()
    assert plan["Plan"]["Node Type"] == "Seq Scan"  # scanned, as it must be
    assert "JIT" not in plan  # and not compiled
