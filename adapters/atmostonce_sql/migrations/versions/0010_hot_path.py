"""The hot path (docs/design.md#two-durable-points-per-send): a move that must have moved a row, for moves
sent together, and the partial index a worker's poll reads.

PostgreSQL only: ``aom_moved(n, move)`` returns ``n`` when it is positive and otherwise fails the
statement with SQLSTATE ``AOM01`` (the move's event name in the error's DETAIL). The store appends it
to each move of a pipelined transaction (``begin`` with ``authorize_dispatch``, ``record_success`` with
the read-back's move), so that a refused move aborts the transaction before the moves queued after it
and the COMMIT can apply: all of them or none, in one or two round trips. SQLite runs such moves one
statement at a time in its transaction and needs nothing.

``aom_intents_claimable`` (both dialects): ``created_at`` of the intents in the table's initial state with
no open attempt, the rows ``claimable`` returns oldest first.

Revision ID: 0010
Revises: 0009
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from atmostonce.table import table
    from atmostonce_sql.schema import claimable_where

    where = sa.text(claimable_where(table().initial))
    op.create_index("aom_intents_claimable", "aom_intents", ["created_at"], postgresql_where=where, sqlite_where=where)
    if op.get_bind().dialect.name != "postgresql":
        return
    op.execute(
        """
        CREATE FUNCTION aom_moved(n bigint, move text) RETURNS bigint
        LANGUAGE plpgsql VOLATILE AS $$
        BEGIN
          IF n IS NULL OR n < 1 THEN
            RAISE EXCEPTION 'atmostonce: the move % moved no row', move USING ERRCODE = 'AOM01', DETAIL = move;
          END IF;
          RETURN n;
        END
        $$
        """
    )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
