"""Approvals bound to exact bytes, per-target dispatch claims, and their append-only history (docs/design.md#approvals-and-per-target-dispatch-claims).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
SEQ = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.add_column("aom_intents", sa.Column("requires_approval", sa.Boolean, nullable=False, server_default=sa.false()))
    op.create_table(
        "aom_claims",
        sa.Column("target", sa.Text, primary_key=True),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("target_version", sa.BigInteger, nullable=False),
        sa.Column("owner", sa.Text, nullable=True),
        sa.Column("owner_token", sa.Text, nullable=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=True),
        sa.Column("approval_id", sa.Text, nullable=True),
        sa.Column("lease_expires_at", sa.Float(53), nullable=True),
        sa.Column("updated_at", sa.Float(53), nullable=False),
    )
    op.create_table(
        "aom_approvals",
        sa.Column("approval_id", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
        sa.Column("request_digest", sa.Text, nullable=False),
        sa.Column("account", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("target_version", sa.BigInteger, nullable=False),
        sa.Column("approver", sa.Text, nullable=False),
        sa.Column("expires_at", sa.Float(53), nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("approved_at", sa.Float(53), nullable=False),
        sa.Column("used_epoch", sa.BigInteger, nullable=True),
        sa.Column("updated_at", sa.Float(53), nullable=False),
        sa.CheckConstraint("length(trim(approver)) > 0", name="aom_approvals_approver"),
    )
    op.create_index("aom_approvals_key", "aom_approvals", ["key"])
    op.create_index("aom_approvals_due", "aom_approvals", ["state", "expires_at"])
    op.create_table(
        "aom_claim_history",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("machine", sa.Text, nullable=False),
        sa.Column("subject", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("from_state", sa.Text, nullable=True),
        sa.Column("to_state", sa.Text, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=True),
        sa.Column("key", sa.Text, nullable=True),
        sa.Column("detail", JSONType, nullable=False),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("aom_claim_history_target_seq", "aom_claim_history", ["target", "seq"])
    t = "aom_claim_history"
    if dialect == "postgresql":  # aom_refuse_change() comes from migration 0001
        op.execute(
            f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
            "FOR EACH ROW EXECUTE FUNCTION aom_refuse_change()"
        )
        op.execute(
            f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION aom_refuse_change()"
        )
    else:
        for what in ("UPDATE", "DELETE"):
            op.execute(
                f"CREATE TRIGGER {t}_no_{what.lower()} BEFORE {what} ON {t} "
                f"BEGIN SELECT RAISE(ABORT, 'atmostonce: {what} on append-only table {t} refused'); END"
            )
        op.execute(
            f"CREATE TRIGGER {t}_no_replace BEFORE INSERT ON {t} WHEN EXISTS (SELECT 1 FROM {t} WHERE seq = NEW.seq) "
            f"BEGIN SELECT RAISE(ABORT, 'atmostonce: replacing a row of append-only table {t} refused'); END"
        )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
