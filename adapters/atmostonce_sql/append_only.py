"""The triggers that make a table append-only, for migrations that add one (docs/design.md, "The gate is
the conditional write": append-only is enforced by the database).

PostgreSQL: ``UPDATE``, ``DELETE`` and ``TRUNCATE`` call ``aom_refuse_change()`` (migration 0001).
SQLite: ``UPDATE`` and ``DELETE`` abort, and so does an ``INSERT`` that would replace an existing row
(``INSERT OR REPLACE`` on the table's ``seq``). The table must have a ``seq`` primary key.
"""

from __future__ import annotations

__all__ = ["append_only_messages", "append_only_statements"]


def append_only_messages(table: str) -> tuple[str, str, str]:
    """What SQLite's triggers on ``table`` raise for an ``UPDATE``, a ``DELETE`` and a replacing ``INSERT``
    (``atmostonce_sql.execution`` maps exactly these to ``AppendOnlyViolation``)."""
    return (
        f"atmostonce: UPDATE on append-only table {table} refused",
        f"atmostonce: DELETE on append-only table {table} refused",
        f"atmostonce: replacing a row of append-only table {table} refused",
    )


def append_only_statements(dialect: str, table: str) -> list[str]:
    """The DDL that makes ``table`` append-only on ``dialect`` (``postgresql`` or ``sqlite``), in order."""
    t = table
    if dialect == "postgresql":
        return [
            f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
            "FOR EACH ROW EXECUTE FUNCTION aom_refuse_change()",
            f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION aom_refuse_change()",
        ]
    on_update, on_delete, on_replace = append_only_messages(t)
    return [
        f"CREATE TRIGGER {t}_no_update BEFORE UPDATE ON {t} BEGIN SELECT RAISE(ABORT, '{on_update}'); END",
        f"CREATE TRIGGER {t}_no_delete BEFORE DELETE ON {t} BEGIN SELECT RAISE(ABORT, '{on_delete}'); END",
        f"CREATE TRIGGER {t}_no_replace BEFORE INSERT ON {t} WHEN EXISTS (SELECT 1 FROM {t} WHERE seq = NEW.seq) "
        f"BEGIN SELECT RAISE(ABORT, '{on_replace}'); END",
    ]
