"""Per-account rate limits: the policy row and its fixed-window counter (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract).

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "aom_rate_limits",
        sa.Column("account", sa.Text, primary_key=True),
        sa.Column("max_sends", sa.Integer, nullable=False),
        sa.Column("window_seconds", sa.Float(53), nullable=False),
        sa.Column("window_start", sa.Float(53), nullable=True),
        sa.Column("used", sa.Integer, nullable=False, server_default=sa.text("0")),
        sa.CheckConstraint("max_sends > 0 AND window_seconds > 0 AND used >= 0", name="aom_rate_limits_sane"),
    )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
