"""Fence epochs: the platform key of a retry after a proven absence (docs/design.md, "A fence is a tombstone").

``aom_intents.fence_epoch`` counts the fenced absences proven for an intent (``reconcile_absent``
bumps it); ``aom_attempts.resend_epoch`` and ``aom_attempts.fence_epoch`` record the epochs each
attempt's platform idempotency key was composed from. Attempts begun before this revision keep a
NULL resend epoch (not recorded) and fence epoch 0 (there was none).

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("aom_intents", sa.Column("fence_epoch", sa.Integer, nullable=False, server_default=sa.text("0")))
    op.add_column("aom_attempts", sa.Column("resend_epoch", sa.Integer, nullable=True))
    op.add_column("aom_attempts", sa.Column("fence_epoch", sa.Integer, nullable=False, server_default=sa.text("0")))


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
