"""Failovers seen by a store in HA mode (docs/design.md, "Failover and synchronous replication").

``aom_failovers`` (append-only): one row per server timeline the store's connections have found, the first one
(``kind`` ``first_seen``) and each later one (``failover``), with the database time, the HA mode of the store that
found it and, when that store fenced it like a declared restore (``async`` mode), the restore epoch it advanced to
and how many intents it fenced. The unique timeline makes one connection record (and fence) each failover.

Forward-only.

Revision ID: 0011
Revises: 0010
"""

import sqlalchemy as sa
from alembic import op

from atmostonce_sql.append_only import append_only_statements

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

SEQ = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "aom_failovers",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("timeline", sa.BigInteger, nullable=False, unique=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("mode", sa.Text, nullable=False),
        sa.Column("restore_epoch", sa.BigInteger, nullable=True),
        sa.Column("fenced", sa.Integer, nullable=True),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sa.CheckConstraint("kind IN ('first_seen', 'failover')", name="aom_failovers_kind"),
        sqlite_autoincrement=True,
    )
    for statement in append_only_statements(dialect, "aom_failovers"):
        op.execute(statement)


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
