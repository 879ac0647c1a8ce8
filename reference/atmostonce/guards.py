"""Model predicates for the table's guard catalogue.

Each predicate takes ``(row, args, now)``: ``row`` the intent's current
columns (a mapping named like the SQL columns), ``args`` the arguments the
caller presented, ``now`` the store clock in seconds. The SQL store has one
fragment per name in ``atmostonce_sql.guards``; a test checks both registries
cover exactly the table's catalogue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["GUARDS", "GuardFn"]

GuardFn = Callable[[Mapping[str, Any], Mapping[str, Any], float], bool]


def no_open_attempt(row, args, now) -> bool:
    return row["attempt_token"] is None


def attempts_remaining(row, args, now) -> bool:
    return row["attempt_count"] < row["max_attempts"]


def attempts_exhausted(row, args, now) -> bool:
    return row["attempt_count"] >= row["max_attempts"]


def lease_holder(row, args, now) -> bool:
    return (
        row["attempt_token"] is not None
        and row["attempt_token"] == args.get("attempt_token")
        and row["generation"] == args.get("generation")
    )


def lease_live(row, args, now) -> bool:
    return row["lease_expires_at"] is not None and row["lease_expires_at"] > now


def lease_expired(row, args, now) -> bool:
    return row["lease_expires_at"] is not None and row["lease_expires_at"] <= now


def request_digest_matches(row, args, now) -> bool:
    return row["request_digest"] == args.get("request_digest")


def remote_id_known(row, args, now) -> bool:
    return row["remote_id"] is not None


def no_remote_object(row, args, now) -> bool:
    return row["remote_id"] is None


def plan_unchanged(row, args, now) -> bool:
    return row["generation"] == args.get("plan_generation") and row["reconcile_count"] == args.get(
        "plan_reconcile_count"
    )


def reconcile_budget_left(row, args, now) -> bool:
    return row["reconcile_count"] < row["max_reconciles"]


def evidence_fenced(row, args, now) -> bool:
    return args.get("fenced") is True


def operator_identified(row, args, now) -> bool:
    op = args.get("operator")
    return isinstance(op, str) and op.strip() != ""


GUARDS: dict[str, GuardFn] = {
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
