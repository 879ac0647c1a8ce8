"""Late outcomes kept as evidence; claim moves and refusals on one sequence.

* ``aom_late_outcomes`` (append-only): an outcome a worker presented after its move was refused (a
  success with the platform's object id, a not-sent, an unknown, a read-back result), on the attempt
  it was for (docs/design.md#late-outcomes-are-evidence). It moves no state; the reconciler reads
  a recorded remote id for its one read-back.
* ``aom_refusals.claim_seq``: a claim refusal's number on the claim log's sequence (the identity of
  ``aom_claim_history.seq``), so a target's moves and refusals interleave in the order they happened
  (docs/design.md, "Approvals and per-target dispatch claims").

Forward-only.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

SEQ = sa.BigInteger().with_variant(sa.Integer, "sqlite")


def _append_only(dialect: str, t: str) -> None:
    if dialect == "postgresql":  # aom_refuse_change() comes from migration 0001
        op.execute(
            f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
            "FOR EACH ROW EXECUTE FUNCTION aom_refuse_change()"
        )
        op.execute(
            f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} FOR EACH STATEMENT EXECUTE FUNCTION aom_refuse_change()"
        )
        return
    for what in ("UPDATE", "DELETE"):
        op.execute(
            f"CREATE TRIGGER {t}_no_{what.lower()} BEFORE {what} ON {t} "
            f"BEGIN SELECT RAISE(ABORT, 'atmostonce: {what} on append-only table {t} refused'); END"
        )
    op.execute(
        f"CREATE TRIGGER {t}_no_replace BEFORE INSERT ON {t} WHEN EXISTS (SELECT 1 FROM {t} WHERE seq = NEW.seq) "
        f"BEGIN SELECT RAISE(ABORT, 'atmostonce: replacing a row of append-only table {t} refused'); END"
    )


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "aom_late_outcomes",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
        sa.Column("attempt_token", sa.Text, sa.ForeignKey("aom_attempts.attempt_token"), nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("refused_event", sa.Text, nullable=False),
        sa.Column("refused_by", sa.Text, nullable=False),
        sa.Column("remote_id", sa.Text, nullable=True),
        sa.Column("response_digest", sa.Text, nullable=True),
        sa.Column("reason", sa.Text, nullable=True),
        sa.Column("worker_time", sa.Float(53), nullable=True),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("aom_late_outcomes_key_seq", "aom_late_outcomes", ["key", "seq"])
    _append_only(dialect, "aom_late_outcomes")
    # claim refusals take their number from the claim log's sequence (aom_claim_history.seq); older rows keep
    # NULL (their place among the moves was never recorded; they read by their own seq)
    op.add_column("aom_refusals", sa.Column("claim_seq", sa.BigInteger, nullable=True))


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
