"""Bulk settle: one operator move per selected intent, each through the store's own guarded move.

Shared by the console's settle page and ``atmostonce settle``. A selection is a filter over the intents
(state, account, kind, target); settling it calls the store move once per intent, so every guard applies
to each one on its own and a refusal of one (its state moved on since the selection was made, say) is
reported for that key and stops nothing else (docs/design.md, "The gate is the conditional write").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from atmostonce.errors import SOURCE_STATE, FoundOnPlatform, IntakeError, ObjectOnRecord, Rejected, StoreError
from atmostonce.names import EFFECT, EVENT
from atmostonce.protocols import OperatorStore
from atmostonce.records import Intent, Plan, check_text

__all__ = ["SETTLE_MOVES", "Look", "SettleResult", "refusal_doc", "select", "sends_again", "settle", "would"]

SETTLE_MOVES: Mapping[str, str] = {"not-sent": "resolve_not_sent", "resend": "resend", "park": "park"}
"""``--as`` choice -> the table event (and store method) it performs. ``published`` is not here: each object
has its own remote id, read back one by one on the intent page (``resolve --published``)."""


@dataclass(frozen=True)
class SettleResult:
    """What settling one key did: ``result`` is ``moved`` (``state_after`` holds where it went), ``refused``
    (``refused`` holds the typed refusal: event, guard, state, meaning, next moves), ``found`` (the platform's
    lookup found the object before a move that sends it again: ``found`` holds ``key``, ``remote_id`` and
    ``platform_key``; or the store records an object a send of it made: ``found`` holds ``key``, ``remote_id``
    and ``recorded_as``; nothing was written) or ``error``. ``lookup``: what was looked up before a move that
    sends again (``looked_up``, the platform keys; ``why``, what was not looked up), ``None`` for other moves.
    ``lookup_failed``: the ``error`` is the platform's: its lookup gave no usable answer (nothing was decided;
    the same settle may be run again once it answers). ``store_failed``: the ``error`` is the store's
    (``StoreError``: it gave no answer; nothing is known to have been written for that key)."""

    key: str
    state_before: str | None
    result: str
    state_after: str | None = None
    refused: dict[str, Any] | None = None
    error: str | None = None
    found: dict[str, Any] | None = None
    lookup: dict[str, Any] | None = None
    lookup_failed: bool = False
    store_failed: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _event(as_: str) -> str:
    try:
        return SETTLE_MOVES[as_]
    except KeyError:
        raise IntakeError(f"settle --as is one of {', '.join(SETTLE_MOVES)}, got {as_!r}") from None


def select(
    store: OperatorStore,
    *,
    state: str,
    account: str | None = None,
    kind: str | None = None,
    target: str | None = None,
    limit: int = 1000,
) -> list[Intent]:
    """The intents in ``state`` (a table state) that match every filter given, oldest change first."""
    if state not in store.table.states:
        raise IntakeError(f"unknown state {state!r}; states: {', '.join(store.table.states)}")
    items = store.list_intents(state=state, limit=limit)
    picked = [
        it
        for it in items
        if (account is None or it.account == account)
        and (kind is None or it.action_kind == kind)
        and (target is None or it.target == target)
    ]
    return sorted(picked, key=lambda it: (it.updated_at, it.key))


def would(store: OperatorStore, intents: Iterable[Intent], as_: str) -> list[dict[str, Any]]:
    """The dry run: for each intent, the move the table lists from its state (``to``), or ``None`` when the
    table has no such move from there; and ``on_record``, for a move that sends again, the ids of the objects
    the store records as made by a send of it (its ``remote_id``, late successes' ids): settling it will be
    refused (``found``; record the object with resolve as published). Guards are not predicted: the store
    decides them at settle time, and the platform is not asked."""
    from atmostonce.runtime import objects_on_record

    ev = store.table.event(_event(as_))
    again = sends_again(store.table, ev.name)
    out = []
    for it in intents:
        on_record: list[str] = []
        if again and it.state in ev.sources:
            on_record = list(dict.fromkeys(remote_id for remote_id, _ in objects_on_record(store, it)))
        out.append(
            {
                "key": it.key,
                "state": it.state,
                "account": it.account,
                "kind": it.action_kind,
                "target": it.target,
                "event": ev.name,
                "to": ev.target if it.state in ev.sources else None,
                "on_record": on_record,
            }
        )
    return out


def next_moves(table, exc: Rejected) -> list[dict[str, Any]]:
    """For a move refused by its source state: the operator's moves, from the table, that take the intent from
    where it is to a state the refused move starts from (``park`` before ``resolve_not_sent``)."""
    if exc.guard != SOURCE_STATE or exc.state is None or exc.event not in table.events:
        return []
    wanted = table.sources(exc.event)
    return [
        {"event": e.name, "from": exc.state, "to": e.target}
        for e in table.events.values()
        if table.is_human(e.name)
        and exc.state in e.sources
        and e.target in wanted
        and e.target != exc.state
        and EFFECT.fence_restore not in e.effects  # a move for after a declared restore, not around a live send
    ]


def refusal_doc(table, exc: Rejected) -> dict[str, Any]:
    """A typed refusal for a person: the refused event, the guard (its meaning from the table), the state, and
    the moves that would make the refused one possible."""
    guard = table.guards.get(exc.guard)
    if guard is not None:
        meaning = guard.meaning
    elif exc.guard == SOURCE_STATE and exc.event in table.events:
        meaning = f"{exc.event} starts only from {', '.join(table.sources(exc.event))}"
    else:
        meaning = exc.detail or exc.guard
    return exc.as_dict() | {"meaning": meaning, "detail": exc.detail, "next": next_moves(table, exc)}


Look = Callable[[str, str], tuple[Plan, dict[str, Any] | None]]
"""``(key, event) -> (plan, {"looked_up": [...], "why": ...})``: the checks and the platform's lookup before a
person sends ``key`` again by ``event`` (:func:`atmostonce.runtime.check_before_sending_again` bound to a store
and a transport): the plan of the read they were about, for the move to present, and what was looked up."""


def sends_again(table: Any, event: str) -> bool:
    """Whether ``event`` leaves the intent where the machine sends it again: the table's initial state (a new
    attempt is begun from it) or a state the retry move leaves (``resend``, ``resolve_not_sent``; not ``park``)."""
    target = table.event(event).target
    return target == table.initial or target in table.sources(EVENT.retry)


def settle(
    store: OperatorStore,
    keys: Iterable[str],
    *,
    as_: str,
    operator: str,
    reason: str,
    look: Look | None = None,
    on_result: Callable[[SettleResult], None] | None = None,
) -> list[SettleResult]:
    """Settle each key by the move ``as_`` names, one guarded store move per key, in the order given.

    A move that sends the intent again (:func:`sends_again`) is preceded, per key, by ``look`` when given: an
    object found on the platform (:class:`~atmostonce.errors.FoundOnPlatform`) makes that key's result
    ``found`` and a platform that gives no usable answer (the transport's error) makes it ``error``; nothing
    is written for that key either way, and the other keys go on. Without ``look`` nothing is looked up and
    each such result says so (``lookup.why``). A key the store cannot read (``IntakeError``) is that key's
    ``error``.

    ``on_result`` is called with each key's result as soon as it is known, so that a caller records every move
    made even when something that is not an ``Exception`` (an interrupt) stops the settle part-way: that
    propagates, and has no result for the key it stopped at: its move may have committed just before the interrupt,
    so a caller reads that key again to say where it is (the CLI does). Raises :class:`IntakeError` for an
    unknown ``as_`` or an empty operator or reason, before any key is touched."""
    event = _event(as_)
    operator = check_text("operator", operator)
    reason = check_text("reason", reason)
    again = sends_again(store.table, event)
    out: list[SettleResult] = []
    for key in keys:
        result = _settle_one(store, key, event, operator, reason, look if again else None, again)
        out.append(result)
        if on_result is not None:
            on_result(result)
    return out


def _settle_one(
    store: OperatorStore, key: str, event: str, operator: str, reason: str, look: Look | None, again: bool
) -> SettleResult:
    try:
        found = store.find(key)
    except (IntakeError, StoreError) as exc:  # a key the store refuses to read (too long, not text), or no store
        return _error(key, None, exc)
    before = None if found is None else found.state
    lookup: dict[str, Any] | None = None
    plan = None  # an unknown key is refused by the move (intent_exists)
    if again:
        from atmostonce.runtime import check_before_sending_again

        try:
            if found is None:
                pass  # nothing to check or look up: the move refuses an unknown key (intent_exists)
            elif look is not None:
                plan, lookup = look(key, event)
            else:
                plan, _ = check_before_sending_again(store, None, key, event)
                lookup = {"looked_up": [], "why": "no platform to look it up"}
        except (FoundOnPlatform, ObjectOnRecord) as exc:
            return SettleResult(key, before, "found", found=exc.as_dict())
        except Rejected as exc:  # not a move from its state, or sent again each time it was looked up
            return SettleResult(key, before, "refused", refused=refusal_doc(store.table, exc))
        except (IntakeError, StoreError) as exc:
            return _error(key, before, exc)
        except Exception as exc:  # noqa: BLE001 - the transport's own error: the platform gave no usable answer
            error = f"lookup failed: {type(exc).__name__}: {exc}"
            return SettleResult(key, before, "error", error=error, lookup_failed=True)
    try:
        # the move presents the plan of the read that was checked and looked up (plan_unchanged)
        if event == EVENT.resend:
            it = store.resend(key, operator=operator, plan=plan)
        elif event == EVENT.resolve_not_sent:
            it = store.resolve_not_sent(key, operator=operator, reason=reason, plan=plan)
        else:
            it = getattr(store, event)(key, operator=operator, reason=reason)
    except Rejected as exc:
        return SettleResult(key, before, "refused", refused=refusal_doc(store.table, exc), lookup=lookup)
    except (IntakeError, StoreError) as exc:
        return _error(key, before, exc, lookup)
    return SettleResult(key, before, "moved", state_after=it.state, lookup=lookup)


def _error(key: str, before: str | None, exc: Exception, lookup: dict[str, Any] | None = None) -> SettleResult:
    """A key's ``error``: bad input (``IntakeError``) or a store that gave no answer (``store_failed``)."""
    failed = isinstance(exc, StoreError)
    return SettleResult(key, before, "error", error=str(exc), lookup=lookup, store_failed=failed)
