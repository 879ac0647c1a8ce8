"""Model implementations of the table's effect catalogue, one per effect name (``[effects.*]`` in
spec/table.toml).

Each effect takes ``(store, row, args, now, event, appends)``: ``store`` the model's state an effect
writes besides the row (:class:`EffectStore`), ``row`` a copy of the intent's columns that the move
will commit (changed in place), ``args`` what the caller presented, ``now`` the store clock,
``event`` the move's name, and ``appends`` the deferred writes: ``(target, item)`` pairs the model
commits with ``target.append(item)`` once every check passed, so a refused move writes nothing.
The SQL store has one entry per name in ``atmostonce_sql.effects``; a test checks both registries
cover exactly the table's catalogue, and docs/guards.md ("Effects") lists where each lives.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from .identity import attempt_token

__all__ = ["EFFECTS", "Append", "AppendTarget", "EffectFn", "EffectStore"]


class AppendTarget(Protocol):
    """Where an effect's commit-time write goes: a store list, or a releaser / rate-window counter."""

    def append(self, item: Any, /) -> None: ...


Append = tuple[AppendTarget, Any]
"""One deferred write of an effect: ``target.append(item)`` once every check passed."""


class EffectStore(Protocol):
    """What effects write besides the row: the model keeps these in memory."""

    _attempts: list[dict[str, Any]]
    _attempt_outcomes: list[tuple[int, str, str]]
    _generation: itertools.count[int]
    _seq: itertools.count[int]
    epoch: int
    text_claims: list[dict[str, Any]]
    rate_limits: dict[str, dict[str, Any]]

    @property
    def text_window_seconds(self) -> float: ...


EffectFn = Callable[[EffectStore, dict[str, Any], Mapping[str, Any], float, str, list[Append]], None]


class _Releaser:
    """An append target that frees the text slots of one key (``append`` keeps the commit loop uniform)."""

    def __init__(self, claims: list[dict[str, Any]], key: str):
        self.claims, self.key = claims, key

    def append(self, _item: Any) -> None:
        for c in self.claims:
            if c["key"] == self.key:
                c["released"] = True


class _RateSlot:
    """An append target that counts one send in an account's rate window (at commit time)."""

    def __init__(self, limits: dict[str, dict[str, Any]], account: str, now: float):
        self.limits, self.account, self.now = limits, account, now

    def append(self, _item: Any) -> None:
        r = self.limits.get(self.account)
        if r is None:
            return
        if r["window_start"] is None or r["window_start"] + r["window_seconds"] <= self.now:
            r["window_start"], r["used"] = self.now, 1
        else:
            r["used"] += 1


def create(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    """The creating event's row is inserted by the store's ``_create``; no move applies it to a row."""


def open_attempt(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    tok = attempt_token()
    gen = next(store._generation)
    row["attempt_count"] += 1
    row["attempt_token"] = tok
    row["generation"] = gen
    row["lease_expires_at"] = now + args["lease_seconds"]
    row["remote_id"] = None
    row["epoch"] = store.epoch
    attempt = {
        "attempt_token": tok,
        "key": row["key"],
        "number": row["attempt_count"],
        "generation": gen,
        "opened_at": now,
        "resend_epoch": row["resend_epoch"],
        "fence_epoch": row["fence_epoch"],
    }
    appends.append((store._attempts, attempt))


def extend_lease(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["lease_expires_at"] = now + args["lease_seconds"]


def write_descriptor(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["descriptor"] = copy.deepcopy(dict(args.get("descriptor") or {}))


def set_remote_id(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["remote_id"] = args["remote_id"]


def close_attempt(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    if row["attempt_token"] is not None:
        appends.append((store._attempt_outcomes, (next(store._seq), row["attempt_token"], event)))
    row["attempt_token"] = None
    row["lease_expires_at"] = None


def claim_text_slot(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    if row["text_hash"] is not None:
        claim = {
            "key": row["key"],
            "account": row["account"],
            "text_hash": row["text_hash"],
            "start_at": now,
            "end_at": now + store.text_window_seconds,
            "released": False,
        }
        appends.append((store.text_claims, claim))


def take_rate_slot(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    appends.append((_RateSlot(store.rate_limits, row["account"], now), None))


def release_text_slot(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    # released at commit time (appends run after every check passed)
    appends.append((_Releaser(store.text_claims, row["key"]), None))


def fence_restore(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    close_attempt(store, row, args, now, event, appends)


def count_reconcile(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["reconcile_count"] += 1  # the lookup's record is written beside the move (the model's _reconciliation)


def bump_resend_epoch(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["resend_epoch"] += 1
    row["remote_id"] = None


def bump_fence_epoch(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["fence_epoch"] += 1


def grant_attempt(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["max_attempts"] = max(row["max_attempts"], row["attempt_count"] + 1)


def grant_reconcile(
    store: EffectStore, row: dict[str, Any], args: Mapping[str, Any], now: float, event: str, appends: list[Append]
) -> None:
    row["max_reconciles"] = max(row["max_reconciles"], row["reconcile_count"] + 1)


EFFECTS: dict[str, EffectFn] = {
    f.__name__: f
    for f in (
        create,
        open_attempt,
        extend_lease,
        write_descriptor,
        set_remote_id,
        close_attempt,
        claim_text_slot,
        take_rate_slot,
        release_text_slot,
        fence_restore,
        count_reconcile,
        bump_resend_epoch,
        bump_fence_epoch,
        grant_attempt,
        grant_reconcile,
    )
}
"""The model's effect registry: effect name -> implementation, exactly the table's catalogue."""
