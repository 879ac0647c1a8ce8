"""Model predicates for the table's guard catalogue.

Each predicate takes ``(row, args, now, world)``: ``row`` the intent's current
columns (a mapping named like the SQL columns), ``args`` the arguments the
caller presented, ``now`` the store clock in seconds, ``world`` the store-wide
state a guard may consult (restore epoch, kill switches, credential and
contract versions, text slots, rate windows; see :class:`World`). The SQL store has one
fragment per name in ``atmostonce_sql.guards``; a test checks both registries
cover exactly the table's catalogue.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

__all__ = ["GUARDS", "GuardFn", "World"]

GuardFn = Callable[[Mapping[str, Any], Mapping[str, Any], float, "World"], bool]


class World(Protocol):
    """What guards may read besides the row: the model keeps these in memory, SQL stores in tables."""

    # read-only members, so the model's plain dicts and lists satisfy them
    @property
    def epoch(self) -> int: ...
    @property
    def kill_switches(self) -> Mapping[str, bool]: ...
    @property
    def credentials(self) -> Mapping[str, str]: ...
    @property
    def contracts(self) -> Mapping[str, str]: ...
    @property
    def text_claims(self) -> Sequence[Mapping[str, Any]]: ...
    @property
    def text_window_seconds(self) -> float: ...
    @property
    def source_heads(self) -> Mapping[str, str]: ...
    @property
    def rate_limits(self) -> Mapping[str, Mapping[str, Any]]: ...


def no_open_attempt(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["attempt_token"] is None


def attempts_remaining(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["attempt_count"] < row["max_attempts"]


def attempts_exhausted(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["attempt_count"] >= row["max_attempts"]


def lease_holder(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return (
        row["attempt_token"] is not None
        and row["attempt_token"] == args.get("attempt_token")
        and row["generation"] == args.get("generation")
    )


def lease_live(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["lease_expires_at"] is not None and row["lease_expires_at"] > now


def lease_expired(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["lease_expires_at"] is not None and row["lease_expires_at"] <= now


def request_digest_matches(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["request_digest"] == args.get("request_digest")


def remote_id_known(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["remote_id"] is not None


def restore_epoch_current(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["epoch"] is not None and row["epoch"] == args.get("epoch") == world.epoch


def kill_switch_off(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return not (world.kill_switches.get("global") or world.kill_switches.get(f"account:{row['account']}"))


def credential_current(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    current = world.credentials.get(row["account"])
    return current is None or current == args.get("credential_version")


def contract_supported(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    current = world.contracts.get(args.get("platform"))  # type: ignore[arg-type]  # no platform (None): no key
    return current is None or current == args.get("contract_version")


def text_window_clear(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    if row["text_hash"] is None:
        return True
    window = world.text_window_seconds
    return not any(
        t["account"] == row["account"]
        and t["text_hash"] == row["text_hash"]
        and not t["released"]
        and t["start_at"] < now + window
        and t["end_at"] > now
        for t in world.text_claims
    )


def source_is_head(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["source_version"] is None or world.source_heads.get(row["source_id"]) == row["source_version"]


def rate_limit_clear(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    r = world.rate_limits.get(row["account"])
    return (
        r is None
        or r["window_start"] is None
        or r["window_start"] + r["window_seconds"] <= now
        or r["used"] < r["max_sends"]
    )


def no_remote_object(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["remote_id"] is None


def plan_unchanged(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return (
        row["generation"] == args.get("plan_generation")
        and row["reconcile_count"] == args.get("plan_reconcile_count")
        and args.get("plan_epoch") == world.epoch
    )


def absence_provable(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["epoch"] is not None and row["epoch"] == world.epoch


def reconcile_budget_left(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return row["reconcile_count"] < row["max_reconciles"]


def evidence_fenced(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
    return args.get("fenced") is True


def operator_identified(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: World) -> bool:
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
