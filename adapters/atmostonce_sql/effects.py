"""SQL implementations of the table's effect catalogue, one entry per effect name (``[effects.*]`` in
spec/table.toml), the SQL twin of ``atmostonce.effects``.

An effect writes in up to three places, all of them here:

* ``values``: the columns it sets in the move's conditional ``UPDATE aom_intents`` (``c`` the intents
  table's columns, ``now`` the database clock, ``dialect`` the SQL dialect's name);
* ``appends``: the rows it writes beside the move, each an ``INSERT ... SELECT`` (or ``UPDATE``) reading
  the moved row ``u`` (the ``UPDATE ... RETURNING`` on PostgreSQL, the re-read row on SQLite), run in the
  move's statement or transaction;
* ``window``: a compare-and-set on another table's row in the move's transaction (the account's rate
  window), with ``fast_path``, the condition under which the move may skip it (and run as one statement).

``atmostonce_sql.statements`` builds every move from these entries; docs/guards.md ("Effects") shows
each one's SQL, and a test checks the registry covers exactly the table's catalogue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from .guards import text_window_expr, window_full
from .schema import attempt_outcomes, attempts, intents, meta, rate_limits, text_claims

__all__ = ["SQL_EFFECTS", "TEXT_CLAIM_LOCK_CLASS", "SqlEffect", "claims_text", "rate_window_move", "text_claim_lock"]

Values = Callable[[Any, ColumnElement[Any], str], dict[str, Any]]
Appends = Callable[[str, Any, ColumnElement[Any]], list[sa.Insert | sa.Update]]


def _none(c: Any, now: ColumnElement[Any], dialect: str) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class SqlEffect:
    """One effect's SQL: the columns it sets, the rows it appends, the window row it moves."""

    name: str
    values: Values = _none
    appends: Appends | None = None
    window: bool = False
    """Moves the account's rate window (:func:`rate_window_move`) in the move's transaction."""

    def fast_path(self, c: Any) -> ColumnElement[bool] | None:
        """The condition under which the move needs no transaction of its own for this effect."""
        if self.window:  # an account with a rate limit moves its window row in the same transaction
            return ~sa.exists().where(rate_limits.c.account == c.account)
        return None


def _lease(now: ColumnElement[Any]) -> ColumnElement[Any]:
    return now + sa.bindparam("p_lease_seconds", type_=sa.Float(53))


def _open_attempt_values(c: Any, now: ColumnElement[Any], dialect: str) -> dict[str, Any]:
    generation = (
        sa.func.nextval("aom_generation")
        if dialect == "postgresql"
        else sa.bindparam("p_new_generation", type_=sa.BigInteger)  # drawn in the transaction (aom_sequences)
    )
    return {
        "attempt_count": c.attempt_count + 1,
        "attempt_token": sa.bindparam("p_new_token", type_=sa.Text),
        "generation": generation,
        "lease_expires_at": _lease(now),
        "remote_id": None,
        "epoch": sa.select(meta.c.value).where(meta.c.name == "restore_epoch").scalar_subquery(),
    }


def _open_attempt_appends(event: str, u: Any, now: ColumnElement[Any]) -> list[sa.Insert | sa.Update]:
    cols = ["attempt_token", "key", "number", "generation", "request_digest", "opened_at", "resend_epoch"]
    return [
        sa.insert(attempts).from_select(
            [*cols, "fence_epoch"],
            sa.select(
                u.attempt_token,
                u.key,
                u.attempt_count,
                u.generation,
                u.request_digest,
                now,
                u.resend_epoch,
                u.fence_epoch,
            ),
        )
    ]


def _close_attempt_values(c: Any, now: ColumnElement[Any], dialect: str) -> dict[str, Any]:
    return {"attempt_token": None, "lease_expires_at": None}


def _close_attempt_appends(event: str, u: Any, now: ColumnElement[Any]) -> list[sa.Insert | sa.Update]:
    return [
        sa.insert(attempt_outcomes).from_select(
            ["attempt_token", "outcome", "recorded_at"],
            sa.select(u.prev_attempt_token, sa.literal(event, sa.Text), now).where(u.prev_attempt_token.is_not(None)),
        )
    ]


def _claim_text_slot_appends(event: str, u: Any, now: ColumnElement[Any]) -> list[sa.Insert | sa.Update]:
    return [
        sa.insert(text_claims).from_select(
            ["key", "account", "text_hash", "start_at", "end_at", "released"],
            sa.select(u.key, u.account, u.text_hash, now, now + text_window_expr(), sa.false()).where(
                u.text_hash.is_not(None)
            ),
        )
    ]


def _release_text_slot_appends(event: str, u: Any, now: ColumnElement[Any]) -> list[sa.Insert | sa.Update]:
    return [
        sa.update(text_claims)
        .where(text_claims.c.key == sa.select(u.key).scalar_subquery(), sa.not_(text_claims.c.released))
        .values(released=True)
    ]


TEXT_CLAIM_LOCK_CLASS = 0x616F6D74  # "aomt": the first key of the advisory locks below, apart from other uses
"""PostgreSQL: the class of the transaction-scoped advisory lock on one account's text (:func:`text_claim_lock`)."""


def text_claim_lock(account: Any, text_hash: Any, *, wait: bool) -> ColumnElement[Any]:
    """PostgreSQL: the transaction-scoped advisory lock on the account's text, which every writer of a text claim
    holds from before its guarded statement until it commits (docs/design.md#the-duplicate-text-window). With
    ``wait``, ``pg_advisory_xact_lock`` (waits for the holder); else ``pg_try_advisory_xact_lock`` (``false``
    when another transaction holds it). Held this way, a claim never waits on the duplicate-text exclusion
    constraint inside a statement whose guards were read before the wait: the claimant before it has
    committed or rolled back by the time the lock is granted."""
    key = sa.func.hashtext(sa.func.concat(account, ":", text_hash))
    fn = sa.func.pg_advisory_xact_lock if wait else sa.func.pg_try_advisory_xact_lock
    return fn(sa.literal(TEXT_CLAIM_LOCK_CLASS, sa.Integer), key)


def claims_text(ev: Any) -> bool:
    """Whether the move ``ev`` writes a text claim (its ``claim_text_slot`` effect)."""
    return "claim_text_slot" in ev.effects


def rate_window_move(now: ColumnElement[Any], check_limit: bool) -> sa.Update:
    """``take_rate_slot``'s compare-and-set on the account's window row (``:p_account``): a passed window
    restarts at one, a running one counts one more while it has room (with ``check_limit``, the
    ``rate_limit_clear`` guard); returns the account when it moved. The row lock serializes concurrent sends."""
    r = rate_limits.c
    restart = sa.or_(r.window_start.is_(None), r.window_start + r.window_seconds <= now)
    where = [r.account == sa.bindparam("p_account", type_=sa.Text)]
    if check_limit:
        where.append(sa.not_(window_full(r, now)))
    return (
        sa.update(rate_limits)
        .where(*where)
        .values(
            window_start=sa.case((restart, now), else_=r.window_start),
            used=sa.case((restart, 1), else_=r.used + 1),
        )
        .returning(r.account)
    )


SQL_EFFECTS: dict[str, SqlEffect] = {
    e.name: e
    for e in (
        SqlEffect("create"),  # the creating event's INSERT (atmostonce_sql.statements.creation)
        SqlEffect("open_attempt", _open_attempt_values, _open_attempt_appends),
        SqlEffect("extend_lease", lambda c, now, dialect: {"lease_expires_at": _lease(now)}),
        SqlEffect(
            "write_descriptor",
            lambda c, now, dialect: {"descriptor": sa.bindparam("p_descriptor", type_=intents.c.descriptor.type)},
        ),
        SqlEffect("set_remote_id", lambda c, now, dialect: {"remote_id": sa.bindparam("p_remote_id", type_=sa.Text)}),
        SqlEffect("close_attempt", _close_attempt_values, _close_attempt_appends),
        SqlEffect("claim_text_slot", appends=_claim_text_slot_appends),
        SqlEffect("take_rate_slot", window=True),
        SqlEffect("release_text_slot", appends=_release_text_slot_appends),
        SqlEffect("fence_restore", _close_attempt_values, _close_attempt_appends),
        SqlEffect("count_reconcile", lambda c, now, dialect: {"reconcile_count": c.reconcile_count + 1}),
        SqlEffect("bump_resend_epoch", lambda c, now, dialect: {"resend_epoch": c.resend_epoch + 1, "remote_id": None}),
        SqlEffect("bump_fence_epoch", lambda c, now, dialect: {"fence_epoch": c.fence_epoch + 1}),
        SqlEffect(
            "grant_attempt",
            lambda c, now, dialect: {
                "max_attempts": sa.case((c.max_attempts > c.attempt_count, c.max_attempts), else_=c.attempt_count + 1)
            },
        ),
        SqlEffect(
            "grant_reconcile",
            lambda c, now, dialect: {
                "max_reconciles": sa.case(
                    (c.max_reconciles > c.reconcile_count, c.max_reconciles), else_=c.reconcile_count + 1
                )
            },
        ),
    )
}
"""The SQL effect registry: effect name -> its SQL, exactly the table's catalogue."""
