"""The declared schema (SQLAlchemy Core). Migrations must build exactly this (tested).

Times are ``double precision`` seconds since the Unix epoch from the database
clock; history is ordered by ``seq`` (a store-assigned identity), never by time.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

__all__ = [
    "APPEND_ONLY_TABLES",
    "CLAIM_HISTORY_TABLES",
    "approvals",
    "rate_limits",
    "claim_history",
    "claims",
    "contracts",
    "credentials",
    "kill_switches",
    "meta",
    "text_claims",
    "attempt_outcomes",
    "attempts",
    "history",
    "intents",
    "metadata",
    "reconciliations",
    "refusals",
    "sequences",
    "source_versions",
    "sources",
]

metadata = sa.MetaData()

JSONType = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

intents = sa.Table(
    "aom_intents",
    metadata,
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
    sa.Column("requires_approval", sa.Boolean, nullable=False, server_default=sa.false()),
    # history rows this intent wrote (migration 0002): a removed newest row breaks the count
    sa.Column("history_count", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.Index(
        "aom_intents_lease_due",
        "lease_expires_at",
        postgresql_where=sa.text("lease_expires_at IS NOT NULL"),
        sqlite_where=sa.text("lease_expires_at IS NOT NULL"),
    ),
    sa.Index("aom_intents_state", "state", "created_at"),
)

attempts = sa.Table(
    "aom_attempts",
    metadata,
    sa.Column("attempt_token", sa.Text, primary_key=True),
    sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
    sa.Column("number", sa.Integer, nullable=False),
    sa.Column("generation", sa.BigInteger, nullable=False),
    sa.Column("request_digest", sa.Text, nullable=False),
    sa.Column("opened_at", sa.Float(53), nullable=False),
    sa.UniqueConstraint("key", "number", name="aom_attempts_key_number"),
    sa.UniqueConstraint("generation", name="aom_attempts_generation"),
    sqlite_autoincrement=False,
)

attempt_outcomes = sa.Table(
    "aom_attempt_outcomes",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("attempt_token", sa.Text, sa.ForeignKey("aom_attempts.attempt_token"), nullable=False),
    sa.Column("outcome", sa.Text, nullable=False),
    sa.Column("recorded_at", sa.Float(53), nullable=False),
    sqlite_autoincrement=True,
)

history = sa.Table(
    "aom_history",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("actor", sa.Text, nullable=False),
    sa.Column("from_state", sa.Text, nullable=True),
    sa.Column("to_state", sa.Text, nullable=False),
    sa.Column("attempt_token", sa.Text, nullable=True),
    sa.Column("generation", sa.BigInteger, nullable=True),
    sa.Column("detail", JSONType, nullable=False),
    sa.Column("recorded_at", sa.Float(53), nullable=False),
    # the per-intent hash chain (migration 0002; atmostonce.audit defines the hash)
    sa.Column("prev_hash", sa.Text, nullable=True),
    sa.Column("row_hash", sa.Text, nullable=True),
    sa.Index("aom_history_key_seq", "key", "seq"),
    sqlite_autoincrement=True,
)

reconciliations = sa.Table(
    "aom_reconciliations",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
    sa.Column("result", sa.Text, nullable=False),
    sa.Column("remote_id", sa.Text, nullable=True),
    sa.Column("recorded_at", sa.Float(53), nullable=False),
    # the audit row (history seq) of the send this record reconciles, and the event that wrote it (0002)
    sa.Column("send_seq", sa.BigInteger, nullable=True),
    sa.Column("event", sa.Text, nullable=True),
    sa.Index("aom_reconciliations_key_seq", "key", "seq"),
    sa.Index("aom_reconciliations_send", "send_seq", "seq"),
    sqlite_autoincrement=True,
)

# SQLite has no SEQUENCE; this one-row-per-name table stands in for it (PostgreSQL
# uses CREATE SEQUENCE aom_generation). Truncating aom_intents does not reset it.
sequences = sa.Table(
    "aom_sequences",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

# Durable store facts: the restore epoch (bumped by `atmostonce db declare-restore`).
meta = sa.Table(
    "aom_meta",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.BigInteger, nullable=False),
)

# The policy layer every path reads (seed 004 M2): kill switches, credential and contract versions.
kill_switches = sa.Table(
    "aom_kill_switches",
    metadata,
    sa.Column("scope", sa.Text, primary_key=True),  # "global" or "account:<id>"
    sa.Column("engaged", sa.Boolean, nullable=False),
)
credentials = sa.Table(
    "aom_credentials",
    metadata,
    sa.Column("account", sa.Text, primary_key=True),
    sa.Column("version", sa.Text, nullable=False),
)
contracts = sa.Table(
    "aom_contracts",
    metadata,
    sa.Column("platform", sa.Text, primary_key=True),
    sa.Column("version", sa.Text, nullable=False),
)

# Duplicate-text window (seed 004 M6): one row per authorized send of a text; PostgreSQL adds an
# exclusion constraint over (account, text_hash, [start_at, end_at)) for unreleased rows, SQLite a trigger.
text_claims = sa.Table(
    "aom_text_claims",
    metadata,
    sa.Column("id", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("key", sa.Text, sa.ForeignKey("aom_intents.key"), nullable=False),
    sa.Column("account", sa.Text, nullable=False),
    sa.Column("text_hash", sa.Text, nullable=False),
    sa.Column("start_at", sa.Float(53), nullable=False),
    sa.Column("end_at", sa.Float(53), nullable=False),
    sa.Column("released", sa.Boolean, nullable=False),
    sa.Index("aom_text_claims_lookup", "account", "text_hash"),
    sa.Index("aom_text_claims_key", "key"),
    sqlite_autoincrement=True,
)

# Source chains (seed 004, "Recovery"): the head the store holds per source, and every version seen.
sources = sa.Table(
    "aom_sources",
    metadata,
    sa.Column("source_id", sa.Text, primary_key=True),
    sa.Column("head_version", sa.Text, nullable=False),
    sa.Column("updated_at", sa.Float(53), nullable=False),
)
source_versions = sa.Table(
    "aom_source_versions",
    metadata,
    sa.Column("version", sa.Text, primary_key=True),
    sa.Column("source_id", sa.Text, nullable=False),
    sa.Column("supersedes", sa.Text, nullable=True),
    sa.Column("raw_hash", sa.Text, nullable=True),
    sa.Column("normalizer_version", sa.Integer, nullable=False),
    sa.Column("captured_at", sa.Float(53), nullable=False),
)

# Refused stale writes (seed 003): who presented what, against what was current, and which event superseded it.
refusals = sa.Table(
    "aom_refusals",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("key", sa.Text, nullable=False),
    sa.Column("event", sa.Text, nullable=False),
    sa.Column("guard", sa.Text, nullable=False),
    sa.Column("presented", JSONType, nullable=False),
    sa.Column("current", JSONType, nullable=False),
    sa.Column("superseded_by_seq", sa.BigInteger, nullable=True),
    sa.Column("recorded_at", sa.Float(53), nullable=False),
    sa.Index("aom_refusals_key_seq", "key", "seq"),
    sqlite_autoincrement=True,
)

APPEND_ONLY_TABLES = (
    "aom_attempts",
    "aom_attempt_outcomes",
    "aom_history",
    "aom_reconciliations",
    "aom_refusals",
    "aom_source_versions",
)

# Approvals and per-target dispatch claims (seeds 001-003, spec/approval.toml and spec/claim.toml).
# One claim row per target: it carries the target's version (publication bumps it) and serializes dispatch.
claims = sa.Table(
    "aom_claims",
    metadata,
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
approvals = sa.Table(
    "aom_approvals",
    metadata,
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
    sa.Index("aom_approvals_key", "key"),
    sa.Index("aom_approvals_due", "state", "expires_at"),
)
claim_history = sa.Table(
    "aom_claim_history",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
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
    sa.Index("aom_claim_history_target_seq", "target", "seq"),
    sqlite_autoincrement=True,
)

CLAIM_HISTORY_TABLES = ("aom_claim_history",)

# Per-account rate limits (issue 6): the policy and its fixed-window counter, moved by a compare-and-set.
rate_limits = sa.Table(
    "aom_rate_limits",
    metadata,
    sa.Column("account", sa.Text, primary_key=True),
    sa.Column("max_sends", sa.Integer, nullable=False),
    sa.Column("window_seconds", sa.Float(53), nullable=False),
    sa.Column("window_start", sa.Float(53), nullable=True),
    sa.Column("used", sa.Integer, nullable=False, server_default=sa.text("0")),
    sa.CheckConstraint("max_sends > 0 AND window_seconds > 0 AND used >= 0", name="aom_rate_limits_sane"),
)
