"""The triggers that make a table append-only, for migrations that add one (docs/design.md, "The gate is
the conditional write": append-only is enforced by the database).

PostgreSQL: ``UPDATE``, ``DELETE`` and ``TRUNCATE`` call ``aom_refuse_change()`` (migration 0001).
SQLite: ``UPDATE`` and ``DELETE`` abort, and so does an ``INSERT`` that would replace an existing row
(``INSERT OR REPLACE`` on the table's ``seq``). The table must have a ``seq`` primary key.
"""

from __future__ import annotations

__all__ = ["append_only_statements"]


def append_only_statements(dialect: str, table: str) -> list[str]:
    """The DDL that makes ``table`` append-only on ``dialect`` (``postgresql`` or ``sqlite``), in order."""
    t = table
    if dialect == "postgresql":
        return [
            f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
            "FOR EACH ROW EXECUTE FUNCTION aom_refuse_change()",
            f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION aom_refuse_change()",
        ]
    return [
        *(
            f"CREATE TRIGGER {t}_no_{what.lower()} BEFORE {what} ON {t} "
            f"BEGIN SELECT RAISE(ABORT, 'atmostonce: {what} on append-only table {t} refused'); END"
            for what in ("UPDATE", "DELETE")
        ),
        f"CREATE TRIGGER {t}_no_replace BEFORE INSERT ON {t} WHEN EXISTS (SELECT 1 FROM {t} WHERE seq = NEW.seq) "
        f"BEGIN SELECT RAISE(ABORT, 'atmostonce: replacing a row of append-only table {t} refused'); END",
    ]
