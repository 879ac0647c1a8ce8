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
    "late_outcomes",
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
    sa.Index("aom_intents_state", "state", "created_at", "key"),
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

# The policy layer every path reads (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract): kill switches, credential and contract versions.
kill_switches = sa.Table(
    "aom_kill_switches",
    metadata,
    sa.Column("scope", sa.Text, primary_key=True),  # "global" or "account:<id>"; engaged while its row exists
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

# Duplicate-text window (docs/design.md#the-duplicate-text-window): one row per authorized send of a text; PostgreSQL adds an
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

# Source chains (docs/design.md#sources-and-the-freshness-fence): the head the store holds per source, and every version seen.
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

# Refused stale writes (docs/design.md#refusals-are-recorded): who presented what, against what was current, and which event superseded it.
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

APPEND_ONLY_TABLES: tuple[str, ...] = (
    "aom_attempts",
    "aom_attempt_outcomes",
    "aom_history",
    "aom_reconciliations",
    "aom_refusals",
    "aom_source_versions",
)

# Approvals and per-target dispatch claims (docs/design.md#approvals-and-per-target-dispatch-claims, spec/approval.toml and spec/claim.toml).
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

# Per-account rate limits (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract): the policy and its fixed-window counter, moved by a compare-and-set.
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

# -- migration 0005 (fence tombstones): the fence epoch of the platform idempotency key, and the epochs
# each attempt's key was composed from (docs/design.md, "A fence is a tombstone")
intents.append_column(sa.Column("fence_epoch", sa.Integer, nullable=False, server_default=sa.text("0")))
attempts.append_column(sa.Column("resend_epoch", sa.Integer, nullable=True))  # NULL: begun before 0005
attempts.append_column(sa.Column("fence_epoch", sa.Integer, nullable=False, server_default=sa.text("0")))

# ---- migration 0007 (late evidence; claim log on one sequence) ----
# Late outcomes (docs/design.md#late-outcomes-are-evidence): what a worker presented after its move was
# refused, on the attempt it was for. Append-only; it moves no state.
late_outcomes = sa.Table(
    "aom_late_outcomes",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
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
    sa.Index("aom_late_outcomes_key_seq", "key", "seq"),
    sqlite_autoincrement=True,
)
APPEND_ONLY_TABLES = (*APPEND_ONLY_TABLES, "aom_late_outcomes")
# Claim refusals numbered on the claim log's sequence (aom_claim_history.seq), so a target's moves and refused
# stale claim writes interleave by sequence; NULL for intent refusals and for rows written before 0007.
refusals.append_column(sa.Column("claim_seq", sa.BigInteger, nullable=True))

# -- migration 0008 (signed approvals, docs/design.md#signed-approvals) ---------------------------------
# Operators' Ed25519 public keys (registered by an administrator), the per-account signing policy, and
# the signature and key id an approval carries (both NULL for an unsigned approval).
operator_keys = sa.Table(
    "aom_operator_keys",
    metadata,
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
signing_policies = sa.Table(
    "aom_signing_policies",
    metadata,
    sa.Column("account", sa.Text, primary_key=True),
    sa.Column("required", sa.Boolean, nullable=False),
)
approvals.append_column(sa.Column("signature", sa.Text, nullable=True))
approvals.append_column(sa.Column("signing_key_id", sa.Text, nullable=True))
__all__ += ["operator_keys", "signing_policies"]

# -- migration 0011 (failovers, docs/design.md "Failover and synchronous replication") ----------------------
# One row per server timeline a store in HA mode found: the first, then each failover (and its fence, if any).
failovers = sa.Table(
    "aom_failovers",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("timeline", sa.BigInteger, nullable=False, unique=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("mode", sa.Text, nullable=False),
    sa.Column("restore_epoch", sa.BigInteger, nullable=True),
    sa.Column("fenced", sa.Integer, nullable=True),
    sa.Column("recorded_at", sa.Float(53), nullable=False),
    sa.CheckConstraint("kind IN ('first_seen', 'failover')", name="aom_failovers_kind"),
    sqlite_autoincrement=True,
)
APPEND_ONLY_TABLES = (*APPEND_ONLY_TABLES, "aom_failovers")
__all__ += ["failovers"]

# ---- migration 0010 (the hot path, docs/design.md#two-durable-points-per-send) ----
# what a worker's poll picks (``claimable``): queued intents with no open attempt, oldest first. A partial
# index holds only those rows, so a poll reads the few it returns however large the table or the backlog
# is, and whatever the planner's statistics say about the state column.
CLAIMABLE_WHERE = "{row}state = '{initial}' AND {row}attempt_token IS NULL"
UNKNOWN_WHERE = "{row}state = '{state}'"


def _state_name(name: str) -> str:
    if not name.isidentifier():
        raise ValueError(f"a state name is an identifier, got {name!r}")
    return name


def claimable_where(initial: str, row: str = "") -> str:
    """The claimable index's predicate for the table's initial state (a table state name: an identifier).
    ``row`` prefixes each column (``"NEW."`` for a trigger's WHEN). Raises ``ValueError`` on a name that is
    not an identifier."""
    return CLAIMABLE_WHERE.format(initial=_state_name(initial), row=row)


def unknown_where(state: str, row: str = "") -> str:
    """The predicate of the index of unknown sends (``aom_intents_unknown``, the reconciler's pick); ``row``
    and the errors as for :func:`claimable_where`."""
    return UNKNOWN_WHERE.format(state=_state_name(state), row=row)


def _partial_index(name: str, where: str) -> sa.Index:
    clause = sa.text(where)
    return sa.Index(name, intents.c.created_at, intents.c.key, postgresql_where=clause, sqlite_where=clause)


def _partial_indexes() -> None:
    from atmostonce.names import STATE
    from atmostonce.table import table

    _partial_index("aom_intents_claimable", claimable_where(table().initial))
    _partial_index("aom_intents_unknown", unknown_where(STATE.indeterminate))


_partial_indexes()

# ---- migration 0012 (policy changes on the record, docs/design.md#policy-changes-are-on-the-record) ----
# Every policy change with its new value (JSON) and the operator who made it (NULL: a program, no person
# named), on the database clock, in the transaction of the change itself. Append-only.
policy_changes = sa.Table(
    "aom_policy_changes",
    metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), sa.Identity(), primary_key=True),
    sa.Column("kind", sa.Text, nullable=False),
    sa.Column("name", sa.Text, nullable=False),
    sa.Column("value", JSONType, nullable=True),
    sa.Column("operator", sa.Text, nullable=True),
    sa.Column("recorded_at", sa.Float(53), nullable=False),
    sqlite_autoincrement=True,
)
APPEND_ONLY_TABLES = (*APPEND_ONLY_TABLES, "aom_policy_changes")
# Store-wide policy values by name: ``text_window_seconds`` (the duplicate-text window; no row: the store's
# configured default), read by the ``text_window_clear`` guard inside its conditional write.
settings = sa.Table(
    "aom_settings",
    metadata,
    sa.Column("name", sa.Text, primary_key=True),
    sa.Column("value", sa.Float(53), nullable=False),
)
TEXT_WINDOW_SETTING = "text_window_seconds"
__all__ += ["policy_changes", "settings", "TEXT_WINDOW_SETTING"]
