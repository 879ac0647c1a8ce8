"""Initial schema: intents, append-only attempts, outcomes, history, reconciliations.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
SEQ = sa.BigInteger().with_variant(sa.Integer, "sqlite")
APPEND_ONLY = (
    "aom_attempts",
    "aom_attempt_outcomes",
    "aom_history",
    "aom_reconciliations",
    "aom_refusals",
    "aom_source_versions",
)
UNIQUE_COLUMNS = {
    "aom_attempts": (("attempt_token",), ("generation",), ("key", "number")),
    "aom_attempt_outcomes": (("seq",),),
    "aom_history": (("seq",),),
    "aom_reconciliations": (("seq",),),
    "aom_refusals": (("seq",),),
    "aom_source_versions": (("version",),),
}


def upgrade() -> None:
    dialect = op.get_bind().dialect.name
    op.create_table(
        "aom_intents",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("account", sa.Text, nullable=False),
        sa.Column("action_kind", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
        sa.Column("request", sa.Text, nullable=False),  # canonical JSON (RFC 8785) text
        sa.Column("request_digest", sa.Text, nullable=False),
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("prev_state", sa.Text, nullable=True),
        sa.Column("attempt_count", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("attempt_token", sa.Text, nullable=True),
        sa.Column("prev_attempt_token", sa.Text, nullable=True),
        sa.Column("generation", sa.BigInteger, nullable=True),
        sa.Column("lease_expires_at", sa.Float(53), nullable=True),
        sa.Column("remote_id", sa.Text, nullable=True),
        sa.Column("reconcile_count", sa.Integer, nullable=False),
        sa.Column("max_reconciles", sa.Integer, nullable=False),
        sa.Column("resend_epoch", sa.Integer, nullable=False),
        sa.Column("descriptor", JSONType, nullable=True),
        sa.Column("normalizer_version", sa.Integer, nullable=False),
        sa.Column("created_at", sa.Float(53), nullable=False),
        sa.Column("updated_at", sa.Float(53), nullable=False),
        sa.Column("epoch", sa.BigInteger, nullable=True),
        sa.Column("text_hash", sa.Text, nullable=True),
        sa.Column("source_id", sa.Text, nullable=True),
        sa.Column("source_version", sa.Text, nullable=True),
    )
    op.create_index(
        "aom_intents_lease_due",
        "aom_intents",
        ["lease_expires_at"],
        postgresql_where=sa.text("lease_expires_at IS NOT NULL"),
        sqlite_where=sa.text("lease_expires_at IS NOT NULL"),
    )
    op.create_index("aom_intents_state", "aom_intents", ["state", "created_at"])
    op.create_table(
        "aom_attempts",
        sa.Column("attempt_token", sa.Text, primary_key=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
        sa.Column("number", sa.Integer, nullable=False),
        sa.Column("generation", sa.BigInteger, nullable=False),
        sa.Column("request_digest", sa.Text, nullable=False),
        sa.Column("opened_at", sa.Float(53), nullable=False),
        sa.UniqueConstraint("key", "number", name="aom_attempts_key_number"),
        sa.UniqueConstraint("generation", name="aom_attempts_generation"),
    )
    op.create_table(
        "aom_attempt_outcomes",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("attempt_token", sa.Text, sa.ForeignKey("aom_attempts.attempt_token"), nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_table(
        "aom_history",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("actor", sa.Text, nullable=False),
        sa.Column("from_state", sa.Text, nullable=True),
        sa.Column("to_state", sa.Text, nullable=False),
        sa.Column("attempt_token", sa.Text, nullable=True),
        sa.Column("generation", sa.BigInteger, nullable=True),
        sa.Column("detail", JSONType, nullable=False),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("aom_history_key_seq", "aom_history", ["key", "seq"])
    op.create_table(
        "aom_reconciliations",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
        sa.Column("result", sa.Text, nullable=False),
        sa.Column("remote_id", sa.Text, nullable=True),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("aom_reconciliations_key_seq", "aom_reconciliations", ["key", "seq"])
    op.create_table(
        "aom_sources",
        sa.Column("source_id", sa.Text, primary_key=True),
        sa.Column("head_version", sa.Text, nullable=False),
        sa.Column("updated_at", sa.Float(53), nullable=False),
    )
    op.create_table(
        "aom_source_versions",
        sa.Column("version", sa.Text, primary_key=True),
        sa.Column("source_id", sa.Text, nullable=False),
        sa.Column("supersedes", sa.Text, nullable=True),
        sa.Column("raw_hash", sa.Text, nullable=True),
        sa.Column("normalizer_version", sa.Integer, nullable=False),
        sa.Column("captured_at", sa.Float(53), nullable=False),
    )
    op.create_table(
        "aom_refusals",
        sa.Column("seq", SEQ, sa.Identity(), primary_key=True),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("event", sa.Text, nullable=False),
        sa.Column("guard", sa.Text, nullable=False),
        sa.Column("presented", JSONType, nullable=False),
        sa.Column("current", JSONType, nullable=False),
        sa.Column("superseded_by_seq", sa.BigInteger, nullable=True),
        sa.Column("recorded_at", sa.Float(53), nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("aom_refusals_key_seq", "aom_refusals", ["key", "seq"])
    op.create_table(
        "aom_sequences",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.execute("INSERT INTO aom_sequences (name, value) VALUES ('generation', 0)")
    op.create_table(
        "aom_meta",
        sa.Column("name", sa.Text, primary_key=True),
        sa.Column("value", sa.BigInteger, nullable=False),
    )
    op.execute("INSERT INTO aom_meta (name, value) VALUES ('restore_epoch', 1)")
    op.create_table(
        "aom_kill_switches",
        sa.Column("scope", sa.Text, primary_key=True),
        sa.Column("engaged", sa.Boolean, nullable=False),
    )
    op.create_table(
        "aom_credentials",
        sa.Column("account", sa.Text, primary_key=True),
        sa.Column("version", sa.Text, nullable=False),
    )
    op.create_table(
        "aom_contracts",
        sa.Column("platform", sa.Text, primary_key=True),
        sa.Column("version", sa.Text, nullable=False),
    )
    op.create_table(
        "aom_text_claims",
        sa.Column("id", SEQ, sa.Identity(), primary_key=True),
        sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
        sa.Column("account", sa.Text, nullable=False),
        sa.Column("text_hash", sa.Text, nullable=False),
        sa.Column("start_at", sa.Float(53), nullable=False),
        sa.Column("end_at", sa.Float(53), nullable=False),
        sa.Column("released", sa.Boolean, nullable=False),
        sqlite_autoincrement=True,
    )
    op.create_index("aom_text_claims_lookup", "aom_text_claims", ["account", "text_hash"])
    op.create_index("aom_text_claims_key", "aom_text_claims", ["key"])
    if dialect == "postgresql":
        # holds under concurrency: two overlapping unreleased claims of one text cannot both commit
        op.execute("CREATE EXTENSION IF NOT EXISTS btree_gist")
        op.execute(
            "ALTER TABLE aom_text_claims ADD CONSTRAINT aom_text_claims_window EXCLUDE USING gist "
            "(account WITH =, text_hash WITH =, numrange(start_at::numeric, end_at::numeric, '[)') WITH &&) "
            "WHERE (NOT released)"
        )
    else:
        # SQLite serializes writers; this trigger is the same rule for anyone writing the file
        op.execute(
            "CREATE TRIGGER aom_text_claims_window BEFORE INSERT ON aom_text_claims "
            "WHEN EXISTS (SELECT 1 FROM aom_text_claims t WHERE t.account = NEW.account "
            "AND t.text_hash = NEW.text_hash AND NOT t.released "
            "AND t.start_at < NEW.end_at AND t.end_at > NEW.start_at) "
            "BEGIN SELECT RAISE(ABORT, 'atmostonce: aom_text_claims_window: duplicate text inside the window'); END"
        )

    if dialect == "postgresql":
        op.execute("CREATE SEQUENCE aom_generation AS bigint START 1")
        op.execute(
            """
            CREATE FUNCTION aom_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              RAISE EXCEPTION 'atmostonce: % on append-only table % refused', TG_OP, TG_TABLE_NAME
                USING ERRCODE = 'insufficient_privilege';
            END $$
            """
        )
        for t in APPEND_ONLY:
            op.execute(
                f"CREATE TRIGGER {t}_append_only BEFORE UPDATE OR DELETE ON {t} "
                "FOR EACH ROW EXECUTE FUNCTION aom_refuse_change()"
            )
            op.execute(
                f"CREATE TRIGGER {t}_no_truncate BEFORE TRUNCATE ON {t} "
                "FOR EACH STATEMENT EXECUTE FUNCTION aom_refuse_change()"
            )
    else:
        for t in APPEND_ONLY:
            for what in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {t}_no_{what.lower()} BEFORE {what} ON {t} "
                    f"BEGIN SELECT RAISE(ABORT, 'atmostonce: {what} on append-only table {t} refused'); END"
                )
        # INSERT OR REPLACE deletes the old row without firing DELETE triggers: refuse any insert
        # that would collide with an existing row on a unique column.
        for t, cols in UNIQUE_COLUMNS.items():
            clash = " OR ".join(
                "EXISTS (SELECT 1 FROM {} WHERE {})".format(t, " AND ".join(f"{c} = NEW.{c}" for c in group))
                for group in cols
            )
            op.execute(
                f"CREATE TRIGGER {t}_no_replace BEFORE INSERT ON {t} WHEN {clash} "
                f"BEGIN SELECT RAISE(ABORT, 'atmostonce: replacing a row of append-only table {t} refused'); END"
            )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
