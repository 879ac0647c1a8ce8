"""Audit: a per-intent hash chain over history, and reconciliation records keyed to the audit sequence.

* ``aom_history.prev_hash`` / ``row_hash``: the chain (``atmostonce.audit`` defines the hash). On
  PostgreSQL a ``BEFORE INSERT`` trigger fills both: it reads the previous row's hash with a query
  of its own, which in READ COMMITTED takes a fresh snapshot, after the statement already holds the
  intent's row lock, so it sees a row committed by a writer this one waited for. On SQLite the
  store computes them in its INSERT through ``aom_chain_hash``, a function registered on each
  connection, under SQLite's single writer.
* ``aom_intents.history_count``: history rows the intent wrote (catches a removed newest row).
* ``aom_reconciliations.send_seq`` / ``event``: which audit row's send a record reconciles, and the
  event that wrote it.

Rows written before this revision are chained here, in sequence order, with the same function;
intents that are ``indeterminate`` now get their opening ``unknown`` record. Forward-only.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_SQLITE_NO_UPDATE = (
    "CREATE TRIGGER aom_history_no_update BEFORE UPDATE ON aom_history "
    "BEGIN SELECT RAISE(ABORT, 'atmostonce: UPDATE on append-only table aom_history refused'); END"
)


def upgrade() -> None:
    from atmostonce import audit

    conn = op.get_bind()
    dialect = conn.dialect.name
    op.add_column("aom_history", sa.Column("prev_hash", sa.Text, nullable=True))
    op.add_column("aom_history", sa.Column("row_hash", sa.Text, nullable=True))
    op.add_column("aom_intents", sa.Column("history_count", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("aom_reconciliations", sa.Column("send_seq", sa.BigInteger, nullable=True))
    op.add_column("aom_reconciliations", sa.Column("event", sa.Text, nullable=True))
    op.create_index("aom_reconciliations_send", "aom_reconciliations", ["send_seq", "seq"])

    # chain the rows already written, oldest first, with the one definition of the hash
    detail = "detail::text" if dialect == "postgresql" else "detail"
    rows = conn.exec_driver_sql(
        "SELECT seq, key, event, actor, from_state, to_state, attempt_token, generation, "
        f"{detail}, recorded_at FROM aom_history ORDER BY key, seq"
    ).fetchall()
    if rows:
        if dialect == "postgresql":
            op.execute("ALTER TABLE aom_history DISABLE TRIGGER aom_history_append_only")
        else:
            op.execute("DROP TRIGGER aom_history_no_update")
        heads: dict[str, str] = {}
        for r in rows:
            prev = heads.get(r[1])
            h = audit.history_hash(prev, *r)
            conn.execute(
                sa.text("UPDATE aom_history SET prev_hash = :p, row_hash = :h WHERE seq = :s"),
                {"p": prev, "h": h, "s": r[0]},
            )
            heads[r[1]] = h
        if dialect == "postgresql":
            op.execute("ALTER TABLE aom_history ENABLE TRIGGER aom_history_append_only")
        else:
            op.execute(_SQLITE_NO_UPDATE)
    op.execute(
        "UPDATE aom_intents SET history_count = (SELECT count(*) FROM aom_history h WHERE h.key = aom_intents.key)"
    )
    # an indeterminate intent's send is unknown: open its reconciliation record at the move into that state
    op.execute(
        "INSERT INTO aom_reconciliations (key, send_seq, event, result, remote_id, recorded_at) "
        "SELECT i.key, h.seq, h.event, 'unknown', i.remote_id, h.recorded_at FROM aom_intents i "
        "JOIN aom_history h ON h.seq = (SELECT max(x.seq) FROM aom_history x WHERE x.key = i.key "
        "AND x.to_state = 'indeterminate' AND x.from_state <> 'indeterminate') "
        "WHERE i.state = 'indeterminate'"
    )

    if dialect == "postgresql":
        from atmostonce_sql.chain_sql import row_hash_sql

        op.execute(
            f"""
            CREATE FUNCTION aom_history_chain() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              -- a query of its own: a fresh snapshot (READ COMMITTED), taken after this statement
              -- locked the intent row, so the newest committed row of the chain is seen
              SELECT h.row_hash INTO NEW.prev_hash FROM aom_history h
                WHERE h.key = NEW.key AND h.seq < NEW.seq ORDER BY h.seq DESC LIMIT 1;
              NEW.row_hash := {row_hash_sql("NEW")};
              RETURN NEW;
            END $$
            """
        )
        op.execute(
            "CREATE TRIGGER aom_history_chain BEFORE INSERT ON aom_history "
            "FOR EACH ROW EXECUTE FUNCTION aom_history_chain()"
        )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
