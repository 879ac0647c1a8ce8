"""SQL fragments for the table's guard catalogue, one per guard name.

Each fragment takes ``(c, now, x)``, as the approval and claim fragments of
:mod:`atmostonce_sql.claims` do (one calling convention for every machine's guards):
``c`` the moved table's columns (here the intents'), ``now`` the database-clock
expression (seconds), ``x`` a :class:`GuardRefs` with what a fragment compares
besides the row's own columns (the intent's key, the approval presented, the tables
for state names). What the caller presents (attempt
token, generation, digest, plan, operator, fenced flag) enters as named bind
parameters (:data:`PARAMS`, bound as ``p_<name>``), so one statement per event is built once, cached,
and executed with the caller's values. The store ANDs the fragments of an
event's guards into its conditional ``UPDATE``; after zero rows it evaluates
each one in a follow-up ``SELECT`` to name the guard that refused. A NULL
parameter never matches (``col = NULL`` is not true), so a missing token
cannot match a row without one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import ColumnElement

from .schema import (
    TEXT_WINDOW_SETTING,
    contracts,
    credentials,
    kill_switches,
    meta,
    rate_limits,
    settings,
    sources,
    text_claims,
)

__all__ = ["PARAMS", "SQL_GUARDS", "GuardRefs", "SqlGuard", "text_window_expr"]


@dataclass(frozen=True)
class GuardRefs:
    """What a guard fragment compares besides the moved row's own columns. For an intent move: the row's own
    key, no approval; for an approval or claim move (:mod:`atmostonce_sql.claims`): the intent key and approval
    id presented (bound parameters), or in a move coupled to an intent's, the claim row's own binding."""

    key: Any  # the intent key the move is for
    approval_id: Any  # the approval the move is under (None for an intent move)
    table: Any  # the intent table (atmostonce.table.Table), for state names
    approval_table: Any  # the approval machine (spec/approval.toml)


SqlGuard = Callable[[Any, ColumnElement, GuardRefs], ColumnElement]
"""A guard's SQL fragment, for every machine: ``(c, now, x)`` to a boolean column expression."""

PARAMS: dict[str, sa.types.TypeEngine[Any]] = {
    "attempt_token": sa.Text(),
    "generation": sa.BigInteger(),
    "request_digest": sa.Text(),
    "plan_generation": sa.BigInteger(),
    "plan_reconcile_count": sa.Integer(),
    "plan_epoch": sa.BigInteger(),
    "fenced": sa.Boolean(),
    "operator": sa.Text(),
    "epoch": sa.BigInteger(),
    "credential_version": sa.Text(),
    "platform": sa.Text(),
    "contract_version": sa.Text(),
    "text_window": sa.Float(53),
}


def p(name: str) -> sa.BindParameter:
    """The named parameter a guard compares against (its value comes from the caller's arguments)."""
    return sa.bindparam(f"p_{name}", type_=PARAMS[name], required=False)


def no_open_attempt(c, now, x):
    return c.attempt_token.is_(None)


def attempts_remaining(c, now, x):
    return c.attempt_count < c.max_attempts


def attempts_exhausted(c, now, x):
    return c.attempt_count >= c.max_attempts


def lease_holder(c, now, x):
    return sa.and_(c.attempt_token == p("attempt_token"), c.generation == p("generation"))


def lease_live(c, now, x):
    return c.lease_expires_at > now


def lease_expired(c, now, x):
    return c.lease_expires_at <= now


def request_digest_matches(c, now, x):
    return c.request_digest == p("request_digest")


def remote_id_known(c, now, x):
    return c.remote_id.is_not(None)


def _current_epoch():
    return sa.select(meta.c.value).where(meta.c.name == "restore_epoch").scalar_subquery()


def restore_epoch_current(c, now, x):
    return sa.and_(c.epoch == p("epoch"), p("epoch") == _current_epoch())


def kill_switch_off(c, now, x):
    k = kill_switches.c
    return ~sa.exists().where(sa.or_(k.scope == "global", k.scope == sa.literal("account:") + c.account))


def credential_current(c, now, x):
    cr = credentials.c
    return ~sa.exists().where(cr.account == c.account, cr.version.is_distinct_from(p("credential_version")))


def contract_supported(c, now, x):
    ct = contracts.c
    return ~sa.exists().where(ct.platform == p("platform"), ct.version.is_distinct_from(p("contract_version")))


def text_window_expr() -> ColumnElement:
    """The duplicate-text window in seconds: the stored policy (``aom_settings``), else the store's default
    (``p_text_window``), read inside the statement that uses it."""
    stored = sa.select(settings.c.value).where(settings.c.name == TEXT_WINDOW_SETTING).scalar_subquery()
    return sa.func.coalesce(stored, p("text_window"))


def text_window_clear(c, now, x):
    t = text_claims.c
    clash = sa.exists().where(
        t.account == c.account,
        t.text_hash == c.text_hash,
        sa.not_(t.released),
        t.start_at < now + text_window_expr(),
        t.end_at > now,
    )
    return sa.or_(c.text_hash.is_(None), ~clash)


def source_is_head(c, now, x):
    head = sa.select(sources.c.head_version).where(sources.c.source_id == c.source_id).scalar_subquery()
    return sa.or_(c.source_version.is_(None), c.source_version == head)


def window_full(r, now):
    """The account row ``r`` has a running window whose sends reached the limit."""
    return sa.and_(r.window_start.is_not(None), r.window_start + r.window_seconds > now, r.used >= r.max_sends)


def rate_limit_clear(c, now, x):
    r = rate_limits.c
    return ~sa.exists().where(r.account == c.account, window_full(r, now))


def no_remote_object(c, now, x):
    return c.remote_id.is_(None)


def plan_unchanged(c, now, x):
    return sa.and_(
        c.generation.is_not_distinct_from(p("plan_generation")),
        c.reconcile_count == p("plan_reconcile_count"),
        p("plan_epoch") == _current_epoch(),
    )


def absence_provable(c, now, x):
    return c.epoch == _current_epoch()


def reconcile_budget_left(c, now, x):
    return c.reconcile_count < c.max_reconciles


def evidence_fenced(c, now, x):
    return p("fenced").is_(sa.true())


def operator_identified(c, now, x):
    return sa.func.length(sa.func.trim(p("operator"))) > 0


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
        restore_epoch_current,
        kill_switch_off,
        credential_current,
        contract_supported,
        text_window_clear,
        source_is_head,
        rate_limit_clear,
        no_remote_object,
        plan_unchanged,
        absence_provable,
        reconcile_budget_left,
        evidence_fenced,
        operator_identified,
    )
}
