"""The sequences a store draws identities from, checked against the data on open and resynced by a restore.

A restore that leaves sequence positions behind (a schema-only or partial ``pg_restore``, a copied
SQLite file with ``sqlite_sequence`` or ``aom_sequences`` rows reset) makes the next history row,
generation or record collide with one already stored, or worse, hand a new lease a generation a
stale worker still holds. :func:`sequences_behind` finds such sequences in one statement;
:func:`resync_sequences` moves each past its stored maximum inside the caller's transaction
(docs/design.md, "Sequences after a restore").

The list is derived from the schema: every identity column (``sa.Identity()``), plus the lease
generation (``aom_generation`` on PostgreSQL, the ``generation`` row of ``aom_sequences`` on SQLite),
whose stored maximum is read from ``aom_attempts.generation`` (every intent's generation is an
attempt's; the unique index makes the maximum cheap).
"""

from __future__ import annotations

from sqlalchemy.engine import Connection

from .schema import metadata

__all__ = ["GENERATION", "identity_columns", "resync_sequences", "sequences_behind"]

GENERATION = ("generation", "aom_attempts", "generation")


def identity_columns() -> tuple[tuple[str, str, str], ...]:
    """``(sequence name, table, column)`` for every identity column of the schema, then the generation."""
    out = [
        (f"{t.name}.{c.name}", t.name, c.name) for t in metadata.sorted_tables for c in t.c if c.identity is not None
    ]
    return (*sorted(out), GENERATION)


def _position_sql(dialect: str, table: str, column: str, name: str) -> str:
    """SQL for a sequence's current position (0 when never drawn from)."""
    if dialect == "postgresql":
        if name == "generation":
            where = "s.schemaname = current_schema() AND s.sequencename = 'aom_generation'"
        else:
            where = f"quote_ident(s.schemaname) || '.' || quote_ident(s.sequencename) = pg_get_serial_sequence('{table}', '{column}')"
        return f"coalesce((SELECT s.last_value FROM pg_sequences s WHERE {where}), 0)"
    if name == "generation":
        return "coalesce((SELECT value FROM aom_sequences WHERE name = 'generation'), 0)"
    return f"coalesce((SELECT seq FROM sqlite_sequence WHERE name = '{table}'), 0)"


def _positions(conn: Connection) -> list[tuple[str, int, int]]:
    dialect = conn.dialect.name
    parts = [
        f"SELECT '{name}' AS name, {_position_sql(dialect, table, column, name)} AS value, "
        f"coalesce((SELECT max({column}) FROM {table}), 0) AS stored_max"
        for name, table, column in identity_columns()
    ]
    rows = conn.exec_driver_sql(" UNION ALL ".join(parts)).all()
    order = {n: i for i, (n, _, _) in enumerate(identity_columns())}
    return sorted(((r[0], int(r[1]), int(r[2])) for r in rows), key=lambda r: order[r[0]])


def sequences_behind(conn: Connection) -> tuple[tuple[str, int, int], ...]:
    """Every ``(sequence, position, stored maximum)`` whose next value could collide with stored data.
    One statement; on PostgreSQL the role needs ``SELECT`` on the sequences (``db grant-app-role`` gives it)."""
    return tuple(r for r in _positions(conn) if r[1] < r[2])


def resync_sequences(conn: Connection) -> tuple[tuple[str, int, int], ...]:
    """Move every sequence that is behind to its stored maximum (the next value is one past it), inside
    the caller's transaction: on PostgreSQL by ``ALTER SEQUENCE ... RESTART`` and one ``nextval`` (transactional,
    undone with the transaction; needs the sequences' owner), on SQLite by writing ``sqlite_sequence`` and
    ``aom_sequences``. Never moves a sequence backwards. Returns what was moved, as found."""
    dialect = conn.dialect.name
    if dialect == "postgresql":  # hold off writers while the maxima are read and the sequences moved
        # aom_intents first: every move writes the intent row before the rows it appends (history, attempts,
        # outcomes), so once this lock is held no move is between tables, and none that waits for it holds
        # a table locked below (no wait cycle with a move in flight, whatever order it appends in)
        tables = ["aom_intents", *sorted({t for _, t, _ in identity_columns()} - {"aom_intents"})]
        conn.exec_driver_sql(f"LOCK TABLE {', '.join(tables)} IN SHARE MODE")
    behind = sequences_behind(conn)
    for name, _value, stored_max in behind:
        table, column = next((t, c) for n, t, c in identity_columns() if n == name)
        if dialect == "postgresql":
            seq = (
                "aom_generation"
                if name == "generation"
                else conn.exec_driver_sql(f"SELECT pg_get_serial_sequence('{table}', '{column}')").scalar_one()
            )
            # restart at the maximum and draw it once: the position reads as the maximum (is_called),
            # the next value is one past it, and both are undone if the transaction rolls back
            conn.exec_driver_sql(f"ALTER SEQUENCE {seq} RESTART WITH {int(stored_max)}")
            conn.exec_driver_sql(f"SELECT nextval('{seq}')")
        elif name == "generation":
            conn.exec_driver_sql(f"UPDATE aom_sequences SET value = {int(stored_max)} WHERE name = 'generation'")
        else:
            conn.exec_driver_sql(f"DELETE FROM sqlite_sequence WHERE name = '{table}'")
            conn.exec_driver_sql(f"INSERT INTO sqlite_sequence (name, seq) VALUES ('{table}', {int(stored_max)})")
    return behind
