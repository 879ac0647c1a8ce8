"""Sequences checked on open and after a restore; moves the table allows, enforced by the database.

The sequence check and resync need no schema (``atmostonce_sql.sequences``). This revision installs the
move guard on ``aom_intents`` generated from the transition table (``atmostonce_sql.moves``): an UPDATE
of ``state`` to a state no event of the table reaches from the current one is refused, and so is a DELETE
of an intent, on PostgreSQL and SQLite alike.

Revision ID: 0006
Revises: 0005
"""

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from atmostonce_sql.moves import install_move_guard

    install_move_guard(op.get_bind())


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
