"""Operator keys and signed approvals (docs/design.md#signed-approvals).

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "aom_operator_keys",
        sa.Column("key_id", sa.Text, primary_key=True),
        sa.Column("operator", sa.Text, nullable=False),
        sa.Column("public_key", sa.Text, nullable=False),
        sa.Column("added_by", sa.Text, nullable=False),
        sa.Column("added_at", sa.Float(53), nullable=False),
        sa.CheckConstraint(
            "length(trim(operator)) > 0 AND length(trim(added_by)) > 0 AND length(public_key) = 64",
            name="aom_operator_keys_sane",
        ),
    )
    op.create_table(
        "aom_signing_policies",
        sa.Column("account", sa.Text, primary_key=True),
        sa.Column("required", sa.Boolean, nullable=False),
    )
    op.add_column("aom_approvals", sa.Column("signature", sa.Text, nullable=True))
    op.add_column("aom_approvals", sa.Column("signing_key_id", sa.Text, nullable=True))


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
