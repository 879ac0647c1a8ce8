"""SQL fragments for the table's guard catalogue, one per guard name.

Each fragment takes ``(c, args, now)``: ``c`` the intents table's columns,
``args`` the caller's arguments, ``now`` the database-clock expression (seconds).
The store ANDs the fragments of an event's guards into its conditional
``UPDATE``; after zero rows it evaluates each one in a follow-up ``SELECT`` to
name the guard that refused. A comparison against a missing argument is
``false()``, never ``IS NULL`` (a NULL token must not match a NULL column).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

__all__ = ["SQL_GUARDS", "SqlGuard"]

SqlGuard = Callable[[Any, Mapping[str, Any], ColumnElement], ColumnElement]


def _eq(col, value) -> ColumnElement:
    return sa.false() if value is None else col == sa.bindparam(None, value, type_=col.type)


def _flag(value: bool) -> ColumnElement:
    return sa.true() if value else sa.false()


def no_open_attempt(c, args, now):
    return c.attempt_token.is_(None)


def attempts_remaining(c, args, now):
    return c.attempt_count < c.max_attempts


def attempts_exhausted(c, args, now):
    return c.attempt_count >= c.max_attempts


def lease_holder(c, args, now):
    return sa.and_(
        c.attempt_token.is_not(None),
        _eq(c.attempt_token, args.get("attempt_token")),
        _eq(c.generation, args.get("generation")),
    )


def lease_live(c, args, now):
    return c.lease_expires_at > now


def lease_expired(c, args, now):
    return c.lease_expires_at <= now


def request_digest_matches(c, args, now):
    return _eq(c.request_digest, args.get("request_digest"))


def remote_id_known(c, args, now):
    return c.remote_id.is_not(None)


def no_remote_object(c, args, now):
    return c.remote_id.is_(None)


def plan_unchanged(c, args, now):
    return sa.and_(
        c.generation.is_not_distinct_from(sa.bindparam(None, args.get("plan_generation"), type_=c.generation.type)),
        _eq(c.reconcile_count, args.get("plan_reconcile_count")),
    )


def reconcile_budget_left(c, args, now):
    return c.reconcile_count < c.max_reconciles


def evidence_fenced(c, args, now):
    return _flag(args.get("fenced") is True)


def operator_identified(c, args, now):
    op = args.get("operator")
    return _flag(isinstance(op, str) and op.strip() != "")


SQL_GUARDS: dict[str, SqlGuard] = {
    f.__name__: f
    for f in (
        no_open_attempt,
        attempts_remaining,
        attempts_exhausted,
        lease_holder,
        lease_live,
        lease_expired,
        request_digest_matches,
        remote_id_known,
        no_remote_object,
        plan_unchanged,
        reconcile_budget_left,
        evidence_fenced,
        operator_identified,
    )
}
