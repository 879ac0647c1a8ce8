"""The moves of an intent's state the database itself allows, generated from the transition table.

Migration 0006 installs a trigger on ``aom_intents`` that refuses an ``UPDATE`` changing ``state`` to
one the table does not reach from the current state by some event, and refuses ``DELETE`` of an
intent, for every writer of the database (the application's role included), on both dialects
(docs/design.md, "The database refuses moves the table does not list"). The pairs come from the
table (:func:`allowed_moves`), so a table with new events gets them by re-running
:func:`install_move_guard` in a later migration.
"""

from __future__ import annotations

from collections.abc import Iterable

from atmostonce.table import Table
from atmostonce.table import table as default_table

__all__ = ["MOVE_GUARD_MESSAGE", "allowed_moves", "install_move_guard", "move_guard_statements"]

MOVE_GUARD_MESSAGE = "atmostonce: intent state move refused: not in the transition table"
DELETE_GUARD_MESSAGE = "atmostonce: DELETE of an intent refused: intents are never removed"


def allowed_moves(t: Table | None = None) -> tuple[tuple[str, str], ...]:
    """Every ``(from, to)`` a non-creating event of the table moves an intent along, sorted."""
    t = t or default_table()
    return tuple(sorted({(s, ev.target) for ev in t.events.values() if not ev.creates for s in ev.sources}))


def _pairs_sql(pairs: Iterable[tuple[str, str]]) -> str:
    for a, b in pairs:
        if "'" in a or "'" in b or ">" in a:
            raise ValueError(f"state names must be plain: {a!r}, {b!r}")
    return ", ".join(f"'{a}>{b}'" for a, b in pairs)


def move_guard_statements(dialect: str, t: Table | None = None) -> list[str]:
    """The DDL that (re)creates the move guard for ``dialect`` (``postgresql`` or ``sqlite``)."""
    pairs = _pairs_sql(allowed_moves(t))
    if dialect == "postgresql":
        return [
            f"""
            CREATE OR REPLACE FUNCTION aom_intents_move_guard() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF TG_OP = 'DELETE' THEN
                RAISE EXCEPTION '{DELETE_GUARD_MESSAGE}' USING ERRCODE = 'integrity_constraint_violation';
              END IF;
              IF NEW.state IS DISTINCT FROM OLD.state AND (OLD.state || '>' || NEW.state) NOT IN ({pairs}) THEN
                RAISE EXCEPTION '{MOVE_GUARD_MESSAGE} (% -> %)', OLD.state, NEW.state
                  USING ERRCODE = 'integrity_constraint_violation';
              END IF;
              RETURN NEW;
            END $$
            """,
            "DROP TRIGGER IF EXISTS aom_intents_move_guard ON aom_intents",
            "CREATE TRIGGER aom_intents_move_guard BEFORE UPDATE OF state OR DELETE ON aom_intents "
            "FOR EACH ROW EXECUTE FUNCTION aom_intents_move_guard()",
        ]
    return [
        "DROP TRIGGER IF EXISTS aom_intents_move_guard",
        "CREATE TRIGGER aom_intents_move_guard BEFORE UPDATE OF state ON aom_intents "
        f"WHEN NEW.state IS NOT OLD.state AND (OLD.state || '>' || NEW.state) NOT IN ({pairs}) "
        f"BEGIN SELECT RAISE(ABORT, '{MOVE_GUARD_MESSAGE}'); END",
        "DROP TRIGGER IF EXISTS aom_intents_no_delete",
        f"CREATE TRIGGER aom_intents_no_delete BEFORE DELETE ON aom_intents BEGIN SELECT RAISE(ABORT, '{DELETE_GUARD_MESSAGE}'); END",
    ]


def install_move_guard(conn, t: Table | None = None) -> None:
    """Create or replace the move guard on ``conn`` (a migration's connection)."""
    import sqlalchemy as sa

    for stmt in move_guard_statements(conn.dialect.name, t):
        conn.execute(sa.text(stmt))  # text(): the driver sees plpgsql's % escaped
