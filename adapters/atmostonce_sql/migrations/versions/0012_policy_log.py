"""Policy changes on the record, and the duplicate-text window as a stored policy.

* ``aom_policy_changes`` (append-only): one row per policy change (kill switch, rate limit, credential and
  contract version, signing, duplicate-text window) with the new value as JSON, the operator who made it
  and the database clock, written in the same transaction as the policy itself
  (docs/design.md#policy-changes-are-on-the-record).
* ``aom_settings``: store-wide policy values by name; ``text_window_seconds`` is the duplicate-text window
  the ``text_window_clear`` guard reads in its conditional write (no row: the store's configured default).

Forward-only.

Revision ID: 0012
Revises: 0011
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from atmostonce_sql.append_only import append_only_statements

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

SEQ = sa.BigInteger().with_variant(sa.Integer, "sqlite")
JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "aom_policy_changes",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("kind", sa.Text, nullable=False),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("value", JSONType, nullable=True),
        sa.Column("operator", sa.Text, nullable=True),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    for statement in append_only_statements(dialect, "aom_policy_changes"):
        op.execute(statement)
    op.create_table(
        "aom_settings",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.Float(53), nullable=False),
    )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
