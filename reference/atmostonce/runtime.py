"""The runtime that drives any store and any transport (docs/design.md#the-runtime).

* :class:`Dispatcher`: one dispatch: ``begin`` (lease), the caller's expensive
  work, ``authorize_dispatch`` as the very last step before bytes, one
  ``send``, the outcome recorded, read-back on success.
* :class:`Sweeper`: acts on expired leases (after authorization: to
  ``indeterminate``; before: attempt closed as abandoned) and runs the retry
  policy for ``failed`` intents at a bounded rate.
* :class:`Reconciler`: at most one platform lookup per intent per call; moves
  only on evidence.

Only this module reads transport capabilities. Nothing here resends an
unknown outcome.
"""

from __future__ import annotations

import inspect
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar, cast

from . import observe
from .errors import (
    LOST_RACE,
    SOURCE_STATE,
    FoundOnPlatform,
    GuardRefused,
    IllegalMove,
    IntakeError,
    LookupAnswerError,
    NotVerified,
    ObjectOnRecord,
    Rejected,
    RetractionUnsupported,
)
from .identity import canonical_json, platform_idempotency_key, request_digest
from .names import ACTOR, CLAIM_GUARD, EFFECT, EVENT, GUARD, OUTCOME, STATE
from .protocols import IntakeStore, MaintenanceStore, OperatorStore, WorkerStore
from .records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_RECONCILES,
    MAX_LEASE_SECONDS,
    Intent,
    Lease,
    Plan,
    Submission,
    check_limit,
    check_retry_after,
    exception_reason,
    storable_reason,
    usable_remote_id,
)
from .store import RETRACTION_PREFIX, retraction_of
from .table import table as default_table
from .transport import Found, LookupResult, NotFound, NotSent, Sent, Transport, Unknown, Unsupported, WireRequest

__all__ = [
    "CRASH_POINTS",
    "RECONCILER_NAME",
    "RECONCILER_VERSION",
    "Dispatcher",
    "Reconciler",
    "RuntimeConfig",
    "SimulatedCrash",
    "Sweeper",
    "Worker",
    "backoff_delay",
    "check_retraction",
    "late_remote_id",
    "read_back_outcome",
    "retraction_refusal",
    "verify_remote_object",
    "wire_request",
]

RECONCILER_NAME = "atmostonce.runtime.Reconciler"
RECONCILER_VERSION = 1

CRASH_POINTS = ("after_begin", "after_work", "after_authorize", "after_send", "after_record_success")
"""Step boundaries at which a crash hook may kill a dispatch (the worker just stops)."""


class SimulatedCrash(Exception):
    """Raised by a crash hook: the worker dies at this point and makes no further store call."""


@dataclass(frozen=True)
class RuntimeConfig:
    """Lease lengths in seconds (store clock); ``retries_per_tick`` bounds how many failed
    intents one sweeper tick re-queues, so raising a cap releases a backlog at a rate;
    ``reconcile_interval`` (seconds, store clock) spaces the lookups of one intent, so a
    platform's read lag does not burn the reconcile budget in one burst; the first look at an unknown
    send is not spaced but made ``first_look_after`` seconds after the move that made it unknown
    (default 0: at once, on the next reconciler pass). A lookup that fails (the platform errs, the answer
    cannot be read) writes nothing; the same intent is looked up again ``lookup_error_backoff`` seconds
    later, doubling with each failure in a row up to ``lookup_error_backoff_max``, so a platform that keeps
    failing is not asked again on every pass. A failed intent (a proven not-sent) is re-queued
    ``retry_backoff`` seconds after the move that failed it, doubling with each attempt already made up to
    ``retry_backoff_max``, and not before the pause the platform asked for (``Retry-After``), up to
    ``retry_after_max`` (:meth:`Sweeper.retry_failed`): a short outage or a rate limit does not spend the
    attempts in a burst."""

    lease_seconds: float = 30.0
    send_lease_seconds: float = 60.0
    retries_per_tick: int = 50
    sweep_batch: int = 100
    reconcile_batch: int = 50
    reconcile_interval: float = 1.0
    first_look_after: float = 0.0
    lookup_error_backoff: float = 1.0
    lookup_error_backoff_max: float = 60.0
    retry_backoff: float = 5.0
    retry_backoff_max: float = 300.0
    retry_after_max: float = 86_400.0


_T = TypeVar("_T")

log = logging.getLogger("atmostonce.runtime")


class RoundRobin(Generic[_T]):
    """Pages of a queue read in turn: ``page(limit, after)`` returns up to ``limit`` items in the queue's order
    after the item whose key is ``after`` (from the start when ``None``); each call here continues after the
    last item the previous call returned, and starts again from the start once a page comes back short. So
    items that only wait at the head of the queue (an account whose kill switch is on, drafts awaiting
    approval, lookups that keep failing) cannot keep the ones behind them from ever being offered: every item
    is offered once per round. Thread-safe: callers share the position."""

    def __init__(self, page: Callable[[int, str | None], Sequence[_T]], key: Callable[[_T], str]):
        self.page, self.key = page, key
        self._after: str | None = None
        self._lock = threading.Lock()

    def __call__(self, limit: int) -> list[_T]:
        with self._lock:
            after = self._after
        items = list(self.page(limit, after))
        if after is not None and not items:  # past the end (or the item it stood on left the queue)
            items = list(self.page(limit, None))
        with self._lock:
            self._after = self.key(items[-1]) if items and len(items) >= limit else None
        return items


def wire_request(intent: Intent) -> WireRequest:
    """The exact request for an intent: its body, its delivery key, its resend and fence epochs; for a retraction
    (``Operations.submit_retraction``) also the action (``delete`` / ``correct``) and the object it acts on."""
    retraction = retraction_of(intent) if intent.action_kind.startswith(RETRACTION_PREFIX) else None
    return WireRequest(
        body=dict(intent.request),
        delivery_key=intent.key,
        resend_epoch=intent.resend_epoch,
        fence_epoch=intent.fence_epoch,
        action="create" if retraction is None else retraction["mode"],
        object_id=None if retraction is None else retraction["remote_id"],
    )


def read_back_confirms(transport: Transport, wire: WireRequest, rb: Any) -> bool:
    """Whether a read-back proves the request took effect: the object holds what was approved (create,
    correct: the transport's projection compare), or the object is gone (delete)."""
    if wire.action == "delete":
        return isinstance(rb, NotFound)
    return isinstance(rb, Found) and _confirmed(transport, wire, rb)


def _confirmed(transport: Transport, wire: WireRequest, found: Found) -> bool:
    """``transport.matches(wire, found)``, taken as a confirmation only when it is ``True`` itself: anything else
    (a coroutine from an ``async def matches``, a truthy object) confirms nothing."""
    answer = transport.matches(wire, found)
    if answer is True:
        return True
    if answer is not False:
        close = getattr(answer, "close", None)
        if inspect.iscoroutine(answer) and close is not None:
            close()  # never awaited: closed, so it is not reported as such
        log.warning(
            "%s.matches answered %s, not a bool: taken as no confirmation", transport.name, type(answer).__name__
        )
    return False


def retraction_refusal(transport: Transport, action: str) -> str | None:
    """``retract.unsupported`` when ``action`` is a retraction (``delete`` / ``correct``) and ``transport``
    declares it cannot retract (the dispatcher then begins nothing, and the intent would wait in the queue
    for ever); ``None`` when the transport can carry it (or for a ``create``)."""
    if action != "create" and not transport.capabilities.retract:
        return OUTCOME.retract_unsupported
    return None


def check_retraction(transport: Transport, key: str, action: str) -> None:
    """Refuse, before it is queued, a retraction of ``key`` the transport cannot carry
    (:class:`RetractionUnsupported`); the check the dispatcher makes (:func:`retraction_refusal`)."""
    outcome = retraction_refusal(transport, action)
    if outcome is not None:
        raise RetractionUnsupported(key, action, transport.name, outcome)


def read_back_outcome(transport: Transport, wire: WireRequest, rb: Any) -> str:
    """The outcome a read-back gives for ``wire``: ``read_back.match`` when it confirms the request
    (:func:`read_back_confirms`), else ``read_back.differs`` (an object that does not hold what was
    approved) or ``read_back.not_found``."""
    if read_back_confirms(transport, wire, rb):
        return OUTCOME.read_back_match
    return OUTCOME.read_back_differs if isinstance(rb, Found) else OUTCOME.read_back_not_found


def verify_remote_object(store: OperatorStore, transport: Transport, key: str, remote_id: str) -> dict[str, Any]:
    """Read back the object ``remote_id`` a person says intent ``key`` published, before the store accepts
    it (``resolve --published``): the dispatcher's own read-back and comparison, nothing else.

    Returns the evidence to keep with the resolution (``{"verified": True, "read_back": outcome,
    "remote_id": ...}``). Raises :class:`NotVerified` when the object does not confirm the intent (not
    found, a different content: the first differing field and both projections are in ``evidence``) or
    the transport cannot read objects back; whatever the transport raises when the platform gives no usable
    answer (e.g. ``HttpTransportError``) propagates: nothing is decided then."""
    it = store.get(key)
    wire = wire_request(it)
    if not transport.capabilities.read_back:
        raise NotVerified(it.key, remote_id, OUTCOME.read_back_unavailable)
    rb = transport.read_back(remote_id)
    outcome = read_back_outcome(transport, wire, rb)
    if outcome != OUTCOME.read_back_match:
        raise NotVerified(it.key, remote_id, outcome, read_back_evidence(transport, wire, rb))
    return {"verified": True, "read_back": outcome, "remote_id": remote_id}


def look_before_sending_again(
    store: OperatorStore, transport: Transport, key: str, event: str | None = None, despite: str | None = None
) -> dict[str, Any]:
    """Before a person sends intent ``key`` again by ``event`` (``resend``, the default, or ``resolve_not_sent``): look it up on the
    platform under every idempotency key its attempts were sent under, newest first, writing nothing.

    Returns what was looked at, to show the person: ``{"looked_up": [platform keys], "why": None}`` (no keys when
    ``event`` cannot leave the intent's state: the move is then refused by its source state), or with
    ``why`` saying what was not looked up: the transport has no lookup by key, no attempt was made, or (a fenced
    lookup, which tombstones a key it finds nothing under) the key ``event`` sends under again, when the move
    keeps it: looking there would make the platform refuse the very send the person allows.

    Raises :class:`FoundOnPlatform` for the first key an object is found under (whatever it holds: an object
    under the intent's key is its post), but for the object ``despite`` names (the person sends another copy
    anyway, ``--despite-object``): looking goes on under the other keys, and the result says where it was
    (``despite_found``: ``remote_id``, ``platform_key``); :class:`Rejected` (guard ``lost_race``) when the intent's attempts
    changed during the look three times running (someone else sent it again meanwhile: the keys looked at are not
    all its keys); whatever the transport raises when the platform gives no usable answer propagates (e.g.
    ``HttpTransportError``): nothing is decided then. A lookup that finds nothing proves nothing
    (docs/design.md#a-fence-is-a-tombstone): the person still decides."""
    table = store.table
    event = EVENT.resend if event is None else event
    if store.get(key).state not in table.sources(event):
        return {"looked_up": [], "why": None}  # the move is refused by its source state: ask the platform nothing
    if not transport.capabilities.lookup_by_key:
        return {"looked_up": [], "why": "the platform config has no lookup by key"}
    keeps_key = not ({EFFECT.bump_resend_epoch, EFFECT.bump_fence_epoch} & set(table.event(event).effects))
    for _ in range(3):
        it = store.get(key)
        seen = (it.state, it.attempt_count, it.generation, it.resend_epoch, it.fence_epoch)
        looked = _look_under_every_key(store, transport, it, keeps_key, despite)
        after = store.get(key)
        if (after.state, after.attempt_count, after.generation, after.resend_epoch, after.fence_epoch) == seen:
            return looked
    raise Rejected(event, key, LOST_RACE, after.state, "the intent was sent again while it was being looked up")


def refuse_if_object_on_record(store: OperatorStore, key: str, event: str, despite: str | None = None) -> Plan:
    """Before a person sends intent ``key`` again by ``event``: raise :class:`ObjectOnRecord` when the store
    already records an object a send of it made (its ``remote_id``; a late success's id, of any attempt: a post
    an earlier attempt made is a copy all the same). ``despite``: the id the person names to send again anyway
    (the object is wrong, or was deleted); any other recorded id still refuses. Writes nothing, asks the
    platform nothing.

    Returns the ``Intent.plan`` of the read it checked, for the move to present (``plan=``): everything the
    person is shown before the move (this check, the platform's look after it) is about that read, and the
    move is refused (``plan_unchanged``) if the intent had another attempt or lookup since
    (docs/design.md#a-lookup-must-answer-for-its-key). Call it again after a look at the platform: a late
    answer recorded meanwhile does not move the intent, so the plan does not fence it.

    Raises :class:`IllegalMove` (``source_state``) when ``event`` cannot leave the intent's state, as the move
    would: nothing is checked then, so no plan is given (the intent may be parked next without another attempt,
    by the reconciler or a person, and a plan of this read would let a move through that no check covered);
    ``KeyError`` for an unknown key."""
    it = store.get(key)
    if it.state not in store.table.sources(event):
        refused = IllegalMove(event, key, SOURCE_STATE, it.state)
        observe.log_refusal(refused)  # counted by guard, as the store's own refusal would have been
        raise refused
    for remote_id, recorded_as in reversed(objects_on_record(store, it)):
        if remote_id != despite:
            raise ObjectOnRecord(key, remote_id, recorded_as)
    return it.plan


def objects_on_record(store: object, it: Intent) -> list[tuple[str, str]]:
    """The objects the store records as made by a send of intent ``it``: ``(remote_id, recorded_as)`` pairs, the
    late successes' ids first (``late_outcome``, oldest first), then the intent's ``remote_id`` (``remote_id``)."""
    on_record = [(remote_id, "late_outcome") for remote_id in late_remote_ids(store, it.key)]
    if it.remote_id is not None:
        on_record.append((it.remote_id, "remote_id"))
    return on_record


def check_before_sending_again(
    store: OperatorStore, transport: Transport | None, key: str, event: str, despite: str | None = None
) -> tuple[Plan, dict[str, Any] | None]:
    """Everything a person's move that sends intent ``key`` again (``resend``, ``resolve_not_sent``) checks first,
    writing nothing: :func:`refuse_if_object_on_record`, then with a ``transport`` :func:`look_before_sending_again`
    and the object-on-record check once more (a late answer is recorded without moving the intent, so the plan
    would not fence one that came during the look).

    Returns ``(plan, looked)``: the ``Intent.plan`` the move presents (``plan=``), read before the look and read
    again, unchanged, after it, so the keys looked under are every key the intent was sent under up to the move's
    conditional write; ``looked`` as :func:`look_before_sending_again` returns it, ``None`` without a transport.
    When the intent had another attempt or lookup during the look, it is looked up again, three rounds at most.

    Raises what those raise: ``ObjectOnRecord``, ``FoundOnPlatform``, ``IllegalMove`` (the move does not start
    from the intent's state), :class:`Rejected` (``lost_race``: it kept moving), the transport's error."""
    plan = refuse_if_object_on_record(store, key, event, despite)
    if transport is None:
        return plan, None
    for _ in range(3):
        looked = look_before_sending_again(store, transport, key, event, despite)
        again = refuse_if_object_on_record(store, key, event, despite)
        if again == plan:
            return plan, looked
        plan = again
    raise Rejected(
        event, key, LOST_RACE, store.get(key).state, "the intent was sent again while it was being looked up"
    )


def lookup_answer(transport: Transport, key: str, resend_epoch: int, fence_epoch: int) -> LookupResult:
    """``transport.lookup(key, resend_epoch, fence_epoch)``, refusing an answer that is none of ``Found``,
    ``NotFound`` and ``Unsupported``: raises :class:`LookupAnswerError` (a ``TypeError``) then (a plugin's
    ``None``, a mapping, an unawaited coroutine), so that the caller counts a failed lookup (the CLI exits 3, the
    console shows a platform error); nothing but a ``NotFound`` says "not found"."""
    res = transport.lookup(key, resend_epoch, fence_epoch)
    if not isinstance(res, (Found, NotFound, Unsupported)):
        raise LookupAnswerError(
            f"the {getattr(transport, 'name', type(transport).__name__)} transport's lookup answered "
            f"{type(res).__name__}, not Found, NotFound or Unsupported"
        )
    return res


def _look_under_every_key(
    store: OperatorStore, transport: Transport, it: Intent, keeps_key: bool, despite: str | None
) -> dict[str, Any]:
    epochs: list[tuple[int, int]] = []
    for a in reversed(store.attempts(it.key)):
        pair = (it.resend_epoch, it.fence_epoch) if a.resend_epoch is None else (a.resend_epoch, a.fence_epoch)
        if pair not in epochs:
            epochs.append(pair)
    if not epochs:
        return {"looked_up": [], "why": "no attempt was made"}
    why = None
    if transport.capabilities.fenced_lookup and keeps_key:
        next_key = platform_idempotency_key(it.key, it.resend_epoch, it.fence_epoch)
        epochs = [e for e in epochs if e != (it.resend_epoch, it.fence_epoch)]
        why = f"not under {next_key}: a fenced lookup would tombstone the key this move sends under again"
    looked: list[str] = []
    named: dict[str, str] = {}  # the object the person named, where it was found: {"remote_id", "platform_key"}
    for resend_epoch, fence_epoch in epochs:
        platform_key = platform_idempotency_key(it.key, resend_epoch, fence_epoch)
        res = lookup_answer(transport, it.key, resend_epoch, fence_epoch)
        looked.append(platform_key)
        if isinstance(res, Found):
            if despite is None or res.remote_id != despite:
                raise FoundOnPlatform(it.key, res.remote_id, platform_key)
            named = {"remote_id": res.remote_id, "platform_key": platform_key}
        if isinstance(res, Unsupported):
            return {"looked_up": looked[:-1], "why": f"the platform cannot look up by key: {res.reason}"}
    return {"looked_up": looked, "why": why} | ({"despite_found": named} if named else {})


MAX_EVIDENCE_BYTES = 16 * 1024
"""Both projections are kept as evidence up to this size (canonical JSON); past it, only the field."""


def read_back_evidence(transport: Transport, wire: WireRequest, rb: Any) -> dict[str, Any] | None:
    """What a read-back that did not confirm the send showed: the first field that differed and both
    projections (``atmostonce.projection.Comparison.evidence``), when the transport can say; else ``None``."""
    compare = getattr(transport, "compare", None)
    if wire.action == "delete" or not isinstance(rb, Found) or compare is None:
        return None
    ev: dict[str, Any] = compare(wire, rb).evidence()
    try:
        if len(canonical_json(ev)) > MAX_EVIDENCE_BYTES:
            ev = {"field": ev["field"]}
    except (ValueError, TypeError):
        ev = {"field": ev["field"]}
    return ev


def late_remote_ids(store: object, key: str, generation: int | None = None) -> list[str]:
    """The platform object ids late outcomes brought for intent ``key``, oldest first: of every attempt, or of
    the attempt with ``generation`` only. None for a store without late outcomes (docs/conformance.md,
    features)."""
    evidence = getattr(store, "evidence", None)
    if evidence is None:
        return []
    return [
        e.remote_id
        for e in evidence(key)
        if e.remote_id is not None and (generation is None or e.generation == generation)
    ]


def late_remote_id(store: object, it: Intent) -> str | None:
    """The platform object id recorded as late evidence for the intent's current attempt (the one its
    unknown send belongs to: same generation), newest first; ``None`` when there is none. An id of an
    earlier attempt or resend epoch is not used: it names another send."""
    ids = [] if it.generation is None else late_remote_ids(store, it.key, it.generation)
    return ids[-1] if ids else None


def _descriptor(transport: Transport, wire: WireRequest) -> dict[str, Any]:
    return {
        "transport": transport.name,
        "transport_version": transport.protocol_version,
        "reconciler": RECONCILER_NAME,
        "reconciler_version": RECONCILER_VERSION,
        "idempotency_key": wire.idempotency_key,
    }


_LEASE_WARNED: weakref.WeakKeyDictionary[Any, set[tuple[float, float]]] = weakref.WeakKeyDictionary()


def _first_lease_warning(transport: Any, lease: float, bound: float) -> bool:
    """Whether the short-lease warning for this transport, lease and bound is the first: the dispatch threads of
    one outbox share a transport, and one warning says it (a transport that cannot be weakly referenced is
    warned about each time)."""
    try:
        seen = _LEASE_WARNED.setdefault(transport, set())
    except TypeError:
        return True
    if (lease, bound) in seen:
        return False
    seen.add((lease, bound))
    return True


@dataclass
class Dispatcher:
    """Runs one dispatch of one intent. ``work(intent)`` is the caller's expensive step
    (runs after ``begin``, before ``authorize_dispatch``); ``crash(point)`` may raise
    :class:`SimulatedCrash` at any of :data:`CRASH_POINTS`. A transport that states how long one send may
    wait (``send_timeout_seconds``, as the HTTP and Matrix transports do) is checked against
    ``config.send_lease_seconds``: a lease not longer than it is logged as a warning on ``atmostonce.runtime``
    (the record's ``send_lease_seconds`` and ``send_timeout_seconds``), since an answer that comes after the
    lease leaves the send unknown."""

    store: WorkerStore
    transport: Transport
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    work: Callable[[Intent], None] | None = None
    crash: Callable[[str], None] | None = None
    credential_version: Callable[[str], str | None] | None = None
    """Returns the credential version the worker will send with for an account (``None``: unversioned)."""
    owner: str = "dispatcher"
    """The name this worker presents when it reserves a target's dispatch claim (recorded, docs/design.md#refusals-are-recorded)."""
    fused: bool | None = None
    """Two commits per send (docs/design.md#two-durable-points-per-send): ``begin`` and
    ``authorize_dispatch`` in one transaction before the bytes, the send's success and its read-back
    in one after. ``None`` (default): fused unless ``work`` or ``crash`` is set (their step
    boundaries exist only when each move commits on its own); ``False``: every move its own commit.
    An approval-gated intent always goes step by step (its claim is reserved between the moves).
    On the fused path a crash hook sees only ``after_authorize`` and ``after_send``."""

    def __post_init__(self) -> None:
        bound = getattr(self.transport, "send_timeout_seconds", None)
        if (
            isinstance(bound, int | float)
            and not isinstance(bound, bool)
            and self.config.send_lease_seconds <= bound
            and _first_lease_warning(self.transport, self.config.send_lease_seconds, bound)
        ):
            # not refused (a test may shorten the lease on purpose), but a surprise in production: an answer
            # that comes after the lease is not recorded as the send's outcome, which stays unknown
            log.warning(
                "send lease of %s s is not longer than the %s transport's send timeouts (%s s): a send answered "
                "after its lease is recorded as unknown, for the reconciler to look up (parked for a person if "
                "its lookups run out before the object shows); raise RuntimeConfig.send_lease_seconds above the "
                "timeouts",
                self.config.send_lease_seconds,
                getattr(self.transport, "name", "?"),
                bound,
                extra={"send_lease_seconds": self.config.send_lease_seconds, "send_timeout_seconds": bound},
            )

    def _point(self, name: str) -> None:
        if self.crash is not None:
            self.crash(name)

    def _before_begin(self, intent: Intent) -> str | None:
        """The gates before ``begin``, which spend nothing: the guards of ``authorize_dispatch`` the table
        marks ``before_begin`` (kill switch, rate window, freshness fence), evaluated by the store without
        writing (``Store.check``, the same predicates and SQL fragments as the move). Returns the outcome
        the table names for the first that refuses (the intent stays queued), or ``None``."""
        gates = self.store.table.before_begin_guards
        refused = self.store.check(EVENT.authorize_dispatch, intent.key, guards=tuple(gates))
        return None if refused is None else gates.get(refused)

    def dispatch(self, key: str | Intent) -> str:
        """Dispatch ``key`` once; returns the outcome name from the table (e.g. ``read_back.match``).

        ``key`` may be the :class:`Intent` itself (as ``submit`` just returned it): the dispatch then
        starts from that snapshot instead of reading the row again. A stale snapshot costs nothing
        unsafe: every move is still the store's conditional write, and an intent that went round since
        (new epochs, another request) is caught after the authorization before any byte is sent.

        Raises :class:`Rejected` when ``begin`` or ``authorize_dispatch`` refuses (nothing was sent),
        :class:`SimulatedCrash` when the crash hook fires.
        """
        before = key if isinstance(key, Intent) else self.store.get(key)
        fused = self.fused if self.fused is not None else (self.work is None and self.crash is None)
        # a store written before the fused moves (no begin_and_authorize / record_sent) goes step by step
        fused = fused and hasattr(self.store, "begin_and_authorize") and hasattr(self.store, "record_sent")
        if fused and not before.requires_approval:
            return self._dispatch_fused(before)
        # the step-by-step path starts from the row as it is now (its pre-checks read the snapshot)
        return self._dispatch_stepwise(self.store.get(before.key) if isinstance(key, Intent) else before)

    def _dispatch_fused(self, before: Intent) -> str:
        """The hot path: one read (none when the caller passed the intent), one commit before the bytes,
        one after (two without read-back)."""
        wire = wire_request(before)
        refusal = retraction_refusal(self.transport, wire.action)
        if refusal is not None:
            return refusal  # nothing begun: a transport that cannot retract must not try
        try:
            with observe.span("authorize", key=before.key):
                lease, intent = self.store.begin_and_authorize(
                    before.key,
                    request_digest=request_digest(wire.body),
                    lease_seconds=self.config.lease_seconds,
                    send_lease_seconds=self.config.send_lease_seconds,
                    descriptor=_descriptor(self.transport, wire),
                    credential_version=self.credential_version(before.account) if self.credential_version else None,
                    platform=self.transport.name,
                    contract_version=getattr(self.transport, "contract_version", None),
                )
        except GuardRefused as exc:
            table = self.store.table
            if exc.event != EVENT.begin and (exc.guard in table.policy_guards or exc.guard in table.waiting_guards):
                # rolled back, nothing begun: the step-by-step path names the stop (paused, rate
                # limited, stale source) or blocks at the gate, exactly as it always has
                return self._dispatch_stepwise(self.store.get(before.key))
            raise
        return self._send_authorized(before, wire, lease, intent)

    def publish(
        self,
        account: str,
        action_kind: str,
        target: str,
        request: Mapping[str, Any],
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_reconciles: int = DEFAULT_MAX_RECONCILES,
        source: tuple[str, str] | None = None,
    ) -> tuple[str, str]:
        """Submit a delivery and dispatch it once: ``Store.submit`` then :meth:`dispatch`, with the intent and
        its authorization committed together where the store can (``submit_and_authorize``): one commit
        before the bytes and one after (docs/design.md#two-durable-points-per-send).

        Returns ``(key, outcome)``: the intent's delivery key and the outcome name from the table. A delivery
        that exists already is dispatched as :meth:`dispatch` would (a settled one is refused). Raises
        :class:`IntakeError` for bad input (nothing stored), :class:`Rejected` as :meth:`dispatch` does.
        """
        intake = cast(IntakeStore, self.store)  # a worker store that also takes submissions (every store here)
        together = getattr(intake, "submit_and_authorize", None)
        fused = self.fused if self.fused is not None else (self.work is None and self.crash is None)
        if together is None or not fused:
            it = intake.submit(
                account,
                action_kind,
                target,
                request,
                max_attempts=max_attempts,
                max_reconciles=max_reconciles,
                source=source,
            )
            return it.key, self.dispatch(it)
        wires: dict[str, WireRequest] = {}

        def authorization(sub: Submission) -> dict[str, Any]:
            # the request a new intent's row gives (wire_request): its stored body, epochs 0; a delivery that
            # exists already under other epochs is caught after the authorization, before any byte
            wire = wires["wire"] = WireRequest(body=dict(sub.request), delivery_key=sub.key)
            return {
                "request_digest": sub.request_digest,  # request_digest(wire.body): the submission's canonical bytes
                "descriptor": _descriptor(self.transport, wire),
                "credential_version": self.credential_version(sub.account) if self.credential_version else None,
                "platform": self.transport.name,
                "contract_version": getattr(self.transport, "contract_version", None),
            }

        it, authorized = together(
            account,
            action_kind,
            target,
            request,
            authorization=authorization,
            lease_seconds=self.config.lease_seconds,
            send_lease_seconds=self.config.send_lease_seconds,
            max_attempts=max_attempts,
            max_reconciles=max_reconciles,
            source=source,
        )
        if authorized is None:
            return it.key, self.dispatch(it)
        lease, intent = authorized
        return it.key, self._send_authorized(it, wires["wire"], lease, intent)

    def _send_authorized(self, before: Intent, wire: WireRequest, lease: Lease, intent: Intent) -> str:
        """The fused path after the authorization: the check that the authorized intent is the request
        ``wire`` was made from, the send, the read-back, and the outcome's one commit."""
        if wire_request(intent) != wire:
            # the intent went round (sent, settled, re-queued under new epochs) between the read and
            # the authorization: nothing was sent, and the recorded descriptor is not this request's
            gone = NotSent("the intent changed between the read and the authorization")
            self._record(gone.outcome, lease, reason=gone.reason)
            return gone.outcome
        self._point("after_authorize")
        result = self._send(wire)
        self._point("after_send")
        if isinstance(result, (NotSent, Unknown)):
            self._record(result.outcome, lease, **_unsent_args(result))
            return result.outcome
        assert isinstance(result, Sent), result
        kw: dict[str, Any] = {}
        if not self.transport.capabilities.read_back:
            outcome = OUTCOME.read_back_unavailable
            kw["reason"] = OUTCOME.read_back_unavailable
        else:
            try:
                with observe.span("read_back", key=before.key, transport=self.transport.name) as sp:
                    rb = self.transport.read_back(result.remote_id)
                    outcome = read_back_outcome(self.transport, wire, rb)
                    observe.set_outcome(sp, outcome)
                if outcome != OUTCOME.read_back_match:
                    kw = {"reason": outcome, "evidence": read_back_evidence(self.transport, wire, rb)}
            except BaseException:
                # the platform took the request: its success and object id are recorded before the read-back's
                # failure (a timeout, a cancellation) goes up, as the step-by-step path has them by now; the lease
                # then lapses into unknown and the reconciler reads the object back by that id
                self._record(result.outcome, lease, remote_id=result.remote_id, response_digest=result.response_digest)
                raise
        try:
            self.store.record_sent(
                lease, remote_id=result.remote_id, response_digest=result.response_digest, read_back=outcome, **kw
            )
        except Rejected as exc:
            # the lease lapsed (the sweeper made the send unknown) or a newer attempt superseded this
            # one: the platform's answer is kept as evidence, its object id not lost
            self.store.record_late_outcome(
                lease,
                outcome=result.outcome,
                refused=exc,
                remote_id=result.remote_id,
                response_digest=result.response_digest,
                worker_time=time.time(),
            )
            raise
        return outcome

    def _dispatch_stepwise(self, before: Intent) -> str:
        """Every move its own commit, with the pre-checks that spend nothing before ``begin``."""
        key = before.key
        stop = self._before_begin(before)
        if stop is not None:
            return stop  # a stop before begin spends nothing: the intent stays queued
        refusal = retraction_refusal(self.transport, wire_request(before).action)
        if refusal is not None:
            return refusal  # nothing begun: a transport that cannot retract must not try
        claim = None
        if before.requires_approval:  # docs/design.md#approvals-and-per-target-dispatch-claims: an approval of these bytes, then the target's claim
            digest = request_digest(wire_request(before).body)
            # the claim table's preflight guards, evaluated by the store against each approval without
            # writing (the same predicates and SQL fragments the reservation then checks again)
            # (and target_version_current after them: an approval at the target's current version is
            # preferred, since one drafted against a version since moved past is refused by the reservation)
            current = CLAIM_GUARD.target_version_current
            guards = [*self.store.claim_table.preflight_guards, current]
            verdicts = self.store.check_approvals(key, request_digest=digest, guards=guards)
            usable = [a for a, refused in verdicts if refused is None]
            usable = usable or [a for a, refused in verdicts if refused == current]
            if usable and self.store.signing_required(before.account):
                # prefer approvals whose signature checks out; the before-byte write re-checks them
                # (approval_signature_verified, docs/design.md#signed-approvals)
                verified = [a for a in usable if self.store.verified_signature_args(a)]
                usable = verified or usable
            if not usable:
                return OUTCOME.gate_awaiting_approval
            try:
                claim = self.store.reserve_claim(
                    key,
                    approval_id=max(usable, key=lambda a: a.expires_at).approval_id,
                    request_digest=digest,
                    owner=self.owner,
                    lease_seconds=self.config.lease_seconds,
                )
            except Rejected as exc:
                return (
                    OUTCOME.claim_busy
                    if exc.guard in (CLAIM_GUARD.claim_lease_expired, SOURCE_STATE)
                    else OUTCOME.claim_refused
                )
        try:
            lease = self.store.begin(key, lease_seconds=self.config.lease_seconds)
        except Rejected:
            self._give_back(claim)  # the reservation must not outlive a dispatch that never began
            raise
        self._point("after_begin")
        intent = self.store.get(key)
        if self.work is not None:
            self.work(intent)
        self._point("after_work")
        wire = wire_request(intent)
        try:
            with observe.span("authorize", key=key):
                self.store.authorize_dispatch(
                    lease,
                    request_digest=request_digest(wire.body),
                    send_lease_seconds=self.config.send_lease_seconds,
                    descriptor=_descriptor(self.transport, wire),
                    credential_version=self.credential_version(intent.account) if self.credential_version else None,
                    platform=self.transport.name,
                    contract_version=getattr(self.transport, "contract_version", None),
                    claim=claim,
                )
        except Rejected as exc:
            machines = set(self.store.claim_table.events) | set(self.store.approval_table.events)
            if claim is not None and exc.event in machines and exc.guard != CLAIM_GUARD.claim_owner:
                # the approval lapsed or was withdrawn, or the target moved on, since the reservation:
                # nothing was sent; the intent stays queued (its attempt is settled by the sweeper)
                self._give_back(claim)
                return OUTCOME.claim_refused
            waits = self.store.table.waiting_guards.get(exc.guard)
            if waits is not None:
                self._give_back(claim)
                return waits  # e.g. lost the rate window's last slot to another send: nothing sent, the
                # attempt is left to the sweeper (abandon_attempt) and the intent stays queued
            if not isinstance(exc, GuardRefused) or exc.guard not in self.store.table.policy_guards:
                self._give_back(claim)
                raise  # a stale worker: nothing to record, the sweeper settles the lease
            # a policy gate refused at publish time: terminal and human-owned (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract)
            self.store.block_at_gate(lease, reason=f"gate.blocked:{exc.guard}")
            return OUTCOME.gate_blocked
        self._point("after_authorize")
        result = self._send(wire)
        self._point("after_send")
        if isinstance(result, (NotSent, Unknown)):
            # the outcome table names the move that records it (send.not_sent -> record_not_sent, ...)
            self._record(result.outcome, lease, **_unsent_args(result))
            return result.outcome
        assert isinstance(result, Sent), result
        self._record(result.outcome, lease, remote_id=result.remote_id, response_digest=result.response_digest)
        self._point("after_record_success")
        if not self.transport.capabilities.read_back:
            # no way to look at the object: the platform's answer alone is not proof, so the send is
            # unknown and reconciliation (a lookup by key) or a person settles it
            self._record(OUTCOME.read_back_unavailable, lease, reason=OUTCOME.read_back_unavailable)
            return OUTCOME.read_back_unavailable
        with observe.span("read_back", key=key, transport=self.transport.name) as sp:
            rb = self.transport.read_back(result.remote_id)
            reason = read_back_outcome(self.transport, wire, rb)
            observe.set_outcome(sp, reason)
        if reason == OUTCOME.read_back_match:
            self._record(reason, lease)
            return reason
        self._record(reason, lease, reason=reason, evidence=read_back_evidence(self.transport, wire, rb))
        return reason

    def _send(self, wire: WireRequest) -> Any:
        """The one send of an authorized attempt, in its span and counted by outcome; the answer as one the
        store can record (:func:`storable_send_result`)."""
        with observe.span("send", key=wire.delivery_key, transport=self.transport.name) as sp:
            result = storable_send_result(self.transport.send(wire))
            observe.set_outcome(sp, result.outcome)
        observe.record_send(result.outcome)
        return result

    def _give_back(self, claim: Any) -> None:
        """Release a reservation this dispatch took and will not use (refused if it is no longer ours)."""
        if claim is None:
            return
        try:
            self.store.release_claim(claim)
        except Rejected:
            pass

    def _record(self, outcome: str, lease: Lease, **kw: Any) -> Intent:
        """Record ``outcome`` with the event the table maps it to. When that move is refused (the lease
        lapsed and the sweeper made the send unknown, or a newer attempt superseded this one), the
        outcome is kept as evidence on the attempt (``record_late_outcome``) and the refusal is
        raised: nothing moves, and a platform object id the worker holds is not lost
        (docs/design.md#late-outcomes-are-evidence)."""
        event = self.store.table.outcomes[outcome].event
        try:
            return getattr(self.store, event)(lease, **kw)  # type: ignore[no-any-return,arg-type]  # every outcome of the table names its event
        except Rejected as exc:
            if outcome in self.store.table.late_outcomes:
                self.store.record_late_outcome(
                    lease,
                    outcome=outcome,
                    refused=exc,
                    remote_id=kw.get("remote_id"),
                    response_digest=kw.get("response_digest"),
                    reason=kw.get("reason"),
                    worker_time=time.time(),
                )
            raise


_OWN_OUTCOME: dict[type, str] = {Sent: Sent("").outcome, NotSent: NotSent("").outcome, Unknown: Unknown("").outcome}
"""Each send result's own outcome (its class's default): a result naming another one is not trusted."""


def storable_send_result(result: Any) -> Sent | NotSent | Unknown:
    """A transport's answer to a send, made one every store records (docs/design.md#late-outcomes-are-evidence):
    its ``reason`` fitted by :func:`~atmostonce.records.storable_reason`; a :class:`Sent` whose ``remote_id`` the
    store cannot keep (:func:`~atmostonce.records.usable_remote_id`: empty, a NUL, too long, not text), a result
    whose ``outcome`` is not its class's own (an :class:`Unknown` naming ``send.not_sent`` would be retried), or
    an answer that is none of the three becomes :class:`Unknown`: the request may have been taken, and only a
    lookup settles it. An int id is kept as its decimal string; a ``response_digest`` that is not storable text is
    dropped. Never raises: after the bytes left, the outcome must be recorded."""
    try:
        return _storable_send_result(result)
    except Exception as exc:  # a field whose reading itself raises: the outcome is still recorded, as unknown
        return Unknown(storable_reason(f"the transport's answer could not be read: {exception_reason(exc)}"))


def _storable_send_result(result: Any) -> Sent | NotSent | Unknown:
    kind = next((cls for cls in (Sent, NotSent, Unknown) if isinstance(result, cls)), None)
    if kind is None:
        return Unknown(f"the transport answered neither sent, not sent nor unknown ({type(result).__name__})")
    if result.outcome != _OWN_OUTCOME[kind]:
        return Unknown(
            storable_reason(f"the transport answered {kind.__name__} naming the outcome {result.outcome!r:.100}")
        )
    if isinstance(result, Sent):
        remote_id = usable_remote_id(result.remote_id)
        if remote_id is None:
            try:
                shown = repr(result.remote_id)
            except Exception:  # an id object whose repr raises
                shown = f"a {type(result.remote_id).__name__}"
            shown = shown if len(shown) <= 100 else shown[:97] + "..."
            return Unknown(storable_reason(f"the transport answered sent with an id the store cannot keep: {shown}"))
        digest = result.response_digest
        if digest is not None and (not isinstance(digest, str) or storable_reason(digest, fallback="") != digest):
            log.warning("a send's response digest is not storable text: left out")
            digest = None
        if remote_id != result.remote_id or digest != result.response_digest:
            return Sent(remote_id, digest)
        return result
    if isinstance(result, NotSent):
        reason = storable_reason(result.reason)
        return result if reason == result.reason else NotSent(reason, retry_after=result.retry_after)
    reason = storable_reason(result.reason)
    return result if reason == result.reason else Unknown(reason)


def _unsent_args(result: NotSent | Unknown) -> dict[str, Any]:
    """The arguments that record a send that took nothing or whose outcome is unknown: its reason, and for a
    not-sent answer the pause the platform asked for (``NotSent.retry_after``). A pause that is not a finite
    number of seconds is left out (and logged): a bad hint must not keep a proven not-sent from being recorded.
    One longer than a year is kept as a year (then held to ``RuntimeConfig.retry_after_max``)."""
    kw: dict[str, Any] = {"reason": result.reason}
    wait = getattr(result, "retry_after", None)
    if isinstance(result, NotSent) and wait is not None:
        try:  # a longer pause is held to the longest one kept; the rest as the store checks it
            kw["retry_after"] = check_retry_after(min(wait, MAX_LEASE_SECONDS))
        except (IntakeError, TypeError):
            log.warning("a not-sent answer asked for a pause of %r seconds, which is not usable: left out", wait)
    return kw


@dataclass
class Sweeper:
    """Maintenance over expired leases and the retry policy. Safe to run twice at once:
    every write moves a row only if it is still as planned (``lease_holder`` guard)."""

    store: MaintenanceStore
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    _pages: dict[str, RoundRobin[Intent]] = field(default_factory=dict, init=False, repr=False)
    _pauses: dict[str, tuple[tuple[float, int, int | None], float, bool]] = field(
        default_factory=dict, init=False, repr=False
    )
    """Failed intents' requested pauses: key -> ((``updated_at``, attempts, generation) of the failing move, seconds, whether a person made that move)."""

    def sweep_leases(self) -> dict[str, int]:
        """Returns counts: ``expired`` (to indeterminate), ``abandoned`` (pre-authorization), ``skipped``."""
        out = {"expired": 0, "abandoned": 0, "skipped": 0}
        table = self.store.table
        moves: list[tuple[str, Intent]] = []
        for it in self.store.due_leases(self.config.sweep_batch):
            # the table names the sweeper's lease-expiry move for the intent's state
            events = [e for e in table.events.values() if e.actor == ACTOR.sweeper and it.state in e.sources]
            if len(events) != 1:
                out["skipped"] += 1
                continue
            moves.append((events[0].name, it))
        # the whole batch in one conditional write per event, each row under its own guards
        # (docs/design.md#the-sweeper-moves-a-batch-per-statement)
        for (event, _), result in zip(moves, self.store.expire_leases(moves) if moves else [], strict=True):
            if isinstance(result, Rejected):
                out["skipped"] += 1
            else:
                out["expired" if table.event(event).target == STATE.indeterminate else "abandoned"] += 1
        return out

    def retry_failed(self, limit: int | None = None) -> dict[str, int]:
        """Re-queue up to ``limit`` (default ``retries_per_tick``) failed intents that are due; park exhausted ones.

        A failed intent (a proven not-sent) is due ``config.retry_backoff`` seconds after the move that failed
        it, doubling with each attempt already made, up to ``config.retry_backoff_max``; and not before the
        pause its platform asked for (``Retry-After``, kept with the not-sent: :meth:`Operations.record_not_sent`),
        up to ``config.retry_after_max``. Both are measured on the store's clock. The failed intents are
        offered in turn (:class:`RoundRobin`), so ones that wait do not hold back the ones behind them.

        Returns counts: ``retried``, ``exhausted`` (parked: no attempt left), ``waiting`` (not due yet),
        ``skipped`` (the move was refused: someone else moved it first)."""
        budget = self.config.retries_per_tick if limit is None else limit
        out = {"retried": 0, "exhausted": 0, "waiting": 0, "skipped": 0}
        now: float | None = None
        # the states the table's retry event may leave (``failed``: the static checks refuse a table that lets an
        # unknown outcome be retried, docs/design.md#static-checks)
        for state in self.store.table.event(EVENT.retry).sources:
            for it in self._failed(state, budget):
                if out["retried"] >= budget:
                    return out
                try:
                    if it.attempt_count < it.max_attempts:
                        now = self.store.now() if now is None else now
                        wait = self.retry_wait(it)
                        if wait > 0 and now < it.updated_at + wait:
                            out["waiting"] += 1
                            continue
                        self.store.retry(it.key)
                        out["retried"] += 1
                    else:
                        self.store.exhaust(it.key)
                        out["exhausted"] += 1
                except Rejected:
                    out["skipped"] += 1
                self._pauses.pop(it.key, None)
        return out

    def retry_wait(self, it: Intent) -> float:
        """Seconds (store clock) after ``it.updated_at`` before the failed intent ``it`` is re-queued: the
        backoff for the attempts it has made, or the pause its platform asked for when that is longer; 0 when a
        person's move left it failed (``resolve_not_sent``: the person decided it goes out again)."""
        c = self.config
        pause, by_person = self._asked_pause(it)
        if by_person:
            return 0.0
        backoff = min(c.retry_backoff_max, c.retry_backoff * 2.0 ** min(max(it.attempt_count - 1, 0), 60))
        return max(backoff, min(c.retry_after_max, pause))

    def _asked_pause(self, it: Intent) -> tuple[float, bool]:
        """The pause the platform asked for when the send that failed ``it`` was refused (``retry_after`` in the
        history row of the move that left it ``failed``), or 0; and whether that move was a person's (a human
        actor's event in the table). Read once per failing move (a store without ``history`` has neither)."""
        seen = self._pauses.get(it.key)
        if seen is not None and seen[0] == (it.updated_at, it.attempt_count, it.generation):
            return seen[1], seen[2]
        history = getattr(self.store, "history", None)
        rows = history(it.key) if history is not None else []
        last = rows[-1] if rows and rows[-1].to_state == it.state else None
        asked = last.detail.get("retry_after") if last is not None else None
        pause = float(asked) if isinstance(asked, (int, float)) and not isinstance(asked, bool) else 0.0
        by_person = last is not None and last.event in self.store.table.events and self.store.table.is_human(last.event)
        if len(self._pauses) > 10_000:  # intents that left the failed state elsewhere (an operator's move)
            self._pauses.clear()
        # a person's park and resolve_not_sent within the store clock's one reading after the failing move leave
        # this key as it was: that person's retry then waits the machine's backoff once (the row is the same)
        self._pauses[it.key] = ((it.updated_at, it.attempt_count, it.generation), pause, by_person)
        return pause, by_person

    def _failed(self, state: str, limit: int) -> list[Intent]:
        pages = self._pages.get(state)
        if pages is None:
            pages = self._pages[state] = RoundRobin(
                lambda n, after: self.store.list_intents(state=state, limit=n, after=after), lambda it: it.key
            )
        return pages(limit)

    def expire_approvals(self) -> dict[str, int]:
        """Move approvals whose deadline passed (database clock) to ``expired`` (docs/design.md#approvals-and-per-target-dispatch-claims: expiry is a
        transition). Returns ``{"approvals_expired": n}``."""
        n = 0
        due = getattr(self.store, "due_approvals", None)
        if due is None:  # a store without approvals (no claims feature, docs/conformance.md) has none to expire
            return {"approvals_expired": 0}
        for a in due(self.config.sweep_batch):
            try:
                self.store.expire_approval(a)
                n += 1
            except Rejected:
                pass
        return {"approvals_expired": n}

    def tick(self) -> dict[str, int]:
        return self.sweep_leases() | self.retry_failed() | self.expire_approvals()


@dataclass
class Reconciler:
    """Settles ``indeterminate`` intents by looking at the platform, at most one lookup each per call."""

    store: MaintenanceStore
    transport: Transport
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    lookup_errors: dict[str, tuple[int, float, str]] = field(default_factory=dict, init=False, repr=False)
    """Intents whose last lookup failed: key -> (failures in a row, store time of the last, the error's text).
    Cleared for a key once a lookup of it succeeds; the reconciler's memory only, nothing is stored."""
    _pages: RoundRobin[Intent] | None = field(default=None, init=False, repr=False)

    def _unknown(self, limit: int) -> list[Intent]:
        """The next ``limit`` unknown intents, in turn (:class:`RoundRobin`)."""
        if self._pages is None:
            self._pages = RoundRobin(
                lambda n, after: self.store.list_intents(state=STATE.indeterminate, limit=n, after=after),
                lambda it: it.key,
            )
        return self._pages(limit)

    def _error_wait(self, key: str, now: float) -> bool:
        """Whether ``key``'s last lookup failed too recently to ask the platform again."""
        failed = self.lookup_errors.get(key)
        if failed is None:
            return False
        failures, at, _ = failed
        wait = min(
            self.config.lookup_error_backoff_max, self.config.lookup_error_backoff * 2.0 ** min(failures - 1, 60)
        )
        return now - at < wait

    def _drifted(self, it: Intent) -> bool:
        d = it.descriptor
        if not d:  # never authorized in this database's view (e.g. fenced by a restore): nothing to drift from
            return False
        return (
            d.get("transport") != self.transport.name
            or d.get("transport_version") != self.transport.protocol_version
            or d.get("reconciler") != RECONCILER_NAME
            or d.get("reconciler_version") != RECONCILER_VERSION
        )

    def _sent_under(self, it: Intent) -> tuple[int, int]:
        """The resend and fence epochs of the platform key the intent's current (newest) attempt was sent
        under, as its attempt row records them; the intent's own epochs when no attempt recorded them."""
        attempts = self.store.attempts(it.key)
        current = attempts[-1] if attempts else None
        if current is None or current.resend_epoch is None:
            return it.resend_epoch, it.fence_epoch
        return current.resend_epoch, current.fence_epoch

    def _look(self, it: Intent) -> tuple[str, dict[str, Any], str]:
        """The lookup (or none) for one intent, writing nothing: ``(event, keywords, outcome)``, the
        reconciler's move that records what it found (:meth:`MaintenanceStore.reconcile_many`'s triple without
        the plan) and the outcome name it reports. A fenced not-found is ``reconcile_absent``; when its write
        is refused by ``absence_provable``, the caller records ``reconcile_unproven`` instead."""
        caps = self.transport.capabilities
        park = EVENT.park_unreconcilable
        if self._drifted(it):
            return park, {"reason": OUTCOME.reconcile_descriptor_drift}, OUTCOME.reconcile_descriptor_drift
        if it.reconcile_count >= it.max_reconciles:
            # the lookups are spent, but an object this send is known to have made (a late success recorded
            # after the last lookup: docs/design.md#late-outcomes-are-evidence) is read back before a person is
            # asked: found needs no lookup left
            named = it.remote_id if it.remote_id is not None else late_remote_id(self.store, it)
            wire = wire_request(it)
            if named is not None and caps.read_back and wire.action == "create":
                if read_back_confirms(self.transport, wire, self.transport.read_back(named)):
                    return EVENT.reconcile_found, {"remote_id": named}, OUTCOME.lookup_found
            return park, {"reason": OUTCOME.reconcile_budget_spent}, OUTCOME.reconcile_budget_spent
        wire = wire_request(it)
        object_id = it.remote_id if it.remote_id is not None else wire.object_id  # a retraction acts on a known object
        if (
            object_id is None
        ):  # the id a late success of this attempt brought (docs/design.md#late-outcomes-are-evidence)
            object_id = late_remote_id(self.store, it)
        if object_id is not None and caps.read_back:
            rb = self.transport.read_back(object_id)
            if read_back_confirms(self.transport, wire, rb):
                return EVENT.reconcile_found, {"remote_id": object_id}, OUTCOME.lookup_found
            other = self._found_under_key(it, wire, object_id) if wire.action == "create" else None
            if other is not None:
                return EVENT.reconcile_found, {"remote_id": other}, OUTCOME.lookup_found
            differs = isinstance(rb, Found) and wire.action != "delete"
            return EVENT.reconcile_not_found, {}, OUTCOME.lookup_differs if differs else OUTCOME.lookup_not_found
        if wire.action != "create":  # a key lookup says nothing about a deletion or a correction
            return park, {"reason": OUTCOME.lookup_unsupported}, OUTCOME.lookup_unsupported
        if not caps.lookup_by_key:
            return park, {"reason": OUTCOME.lookup_unsupported}, OUTCOME.lookup_unsupported
        res = self._by_key(it)
        if isinstance(res, Found):
            if not self._holds_approved(wire, res):
                # an object under this key that does not hold what was approved: not a confirmation
                return EVENT.reconcile_not_found, {}, OUTCOME.lookup_differs
            return EVENT.reconcile_found, {"remote_id": res.remote_id}, OUTCOME.lookup_found
        if isinstance(res, Unsupported):
            return park, {"reason": OUTCOME.lookup_unsupported}, OUTCOME.lookup_unsupported
        if caps.fenced_lookup:
            return EVENT.reconcile_absent, {"fenced": True}, OUTCOME.lookup_not_found_fenced
        return EVENT.reconcile_not_found, {}, OUTCOME.lookup_not_found

    def _found_under_key(self, it: Intent, wire: WireRequest, named: str) -> str | None:
        """After the object the platform named (``named``, from its answer) did not confirm the send: the id of
        another object the key lookup finds holding what was approved (a platform that answered with the id of
        something else), or ``None``. A not-found here proves nothing, fenced or not: the answer said an object
        was made, so this never records an absence."""
        if not self.transport.capabilities.lookup_by_key:
            return None
        res = self._by_key(it)
        if not isinstance(res, Found) or res.remote_id == named:
            return None  # nothing under the key, or the same object the read-back did not confirm
        return res.remote_id if self._holds_approved(wire, res) else None

    def _by_key(self, it: Intent) -> LookupResult:
        """The platform's answer for the key the intent's current attempt was sent under."""
        resend_epoch, fence_epoch = self._sent_under(it)
        return lookup_answer(self.transport, it.key, resend_epoch, fence_epoch)

    def _holds_approved(self, wire: WireRequest, found: Found) -> bool:
        """Whether an object found under the key holds what was approved (one found without a body is taken
        on the key's word)."""
        return found.body is None or _confirmed(self.transport, wire, found)

    def _record(self, looks: list[tuple[Intent, str, dict[str, Any], str]]) -> list[str | Rejected]:
        """Record a batch of lookups, one conditional write per event (``reconcile_many``); returns each one's
        outcome name, or the refusal that stopped it. A fenced not-found whose ``reconcile_absent`` is refused
        by ``absence_provable`` is recorded as ``reconcile_unproven`` in a second batch: the attempt was begun
        before a restore, its key may have been rewound, so the not-found proves nothing (it counts against
        the budget; exhaustion parks for a human), and the key it looked up is now tombstoned, so the fence
        epoch moves on."""
        got = self.store.reconcile_many([(event, it.plan, kw) for it, event, kw, _ in looks]) if looks else []
        out: list[str | Rejected] = []
        unproven: list[int] = []
        for i, ((_, _, _, name), res) in enumerate(zip(looks, got, strict=True)):
            if (
                isinstance(res, GuardRefused)
                and res.event == EVENT.reconcile_absent
                and res.guard == GUARD.absence_provable
            ):
                unproven.append(i)
            out.append(res if isinstance(res, Rejected) else name)
        if unproven:
            again = self.store.reconcile_many([(EVENT.reconcile_unproven, looks[i][0].plan, {}) for i in unproven])
            for i, res in zip(unproven, again, strict=True):
                out[i] = res if isinstance(res, Rejected) else OUTCOME.lookup_not_found_before_restore
        return out

    def reconcile_one(self, it: Intent) -> str:
        """One lookup (or none) for one intent; returns the outcome name it recorded. Raises the
        :class:`Rejected` that refused the record (the intent moved on since ``it`` was read)."""
        event, kw, name = self._look(it)
        [res] = self._record([(it, event, kw, name)])
        if isinstance(res, Rejected):
            raise res
        return res

    def run(self, limit: int | None = None) -> dict[str, int]:
        """Reconcile up to ``limit`` indeterminate intents (default ``config.reconcile_batch``; 0 looks nothing
        up); returns counts per outcome name. The lookups are made one by one; what they found is recorded
        for the whole batch at once, one conditional write per event (docs/design.md#the-reconciler-records-a-batch-per-statement).
        Raises ``IntakeError`` for a negative limit."""
        limit = self.config.reconcile_batch if limit is None else check_limit(limit)
        out: dict[str, int] = {}
        if limit == 0:
            return out
        now = self.store.now()
        looks: list[tuple[Intent, str, dict[str, Any], str]] = []
        for it in self._unknown(limit):
            wait = self.config.reconcile_interval if it.reconcile_count else self.config.first_look_after
            if now - it.updated_at < wait or self._error_wait(it.key, now):
                out["deferred"] = out.get("deferred", 0) + 1
                continue
            try:
                with observe.span("lookup", key=it.key, transport=self.transport.name) as sp:
                    event, kw, name = self._look(it)
                    if "remote_id" in kw:
                        found_id = usable_remote_id(kw["remote_id"])
                        if found_id is None:  # an object found under an id the store cannot keep: no evidence
                            raise ValueError(
                                "the platform named an object whose id the store cannot keep "
                                f"({type(kw['remote_id']).__name__})"
                            )
                        kw = {**kw, "remote_id": found_id}  # an int id as its decimal string, as a send's is
                    observe.set_outcome(sp, name)
            except Exception as exc:  # the lookup itself failed (any transport's error): no evidence, nothing written
                failures = self.lookup_errors.get(it.key, (0, now, ""))[0] + 1
                said = exception_reason(exc)
                self.lookup_errors[it.key] = (failures, now, said)
                log.warning("lookup of %s failed (%d in a row): %s: %s", it.key, failures, type(exc).__name__, exc)
                observe.record_lookup(OUTCOME.lookup_error)
                out[OUTCOME.lookup_error] = out.get(OUTCOME.lookup_error, 0) + 1
                continue
            self.lookup_errors.pop(it.key, None)
            looks.append((it, event, kw, name))
        for res in self._record(looks):
            name = "skipped" if isinstance(res, Rejected) else res
            if name != "skipped":
                observe.record_lookup(name)
            out[name] = out.get(name, 0) + 1
        return out


def backoff_delay(failures: int, base: float, cap: float, rng: random.Random) -> float:
    """Seconds to wait after ``failures`` (>= 1) consecutive failures: a ceiling of ``base * 2 ** (failures - 1)``
    seconds capped at ``cap``, times a jitter factor drawn from ``rng`` uniformly in [0.5, 1), so that
    workers cut off by one outage do not come back in step (:class:`Worker`, ``atmostonce.service.Outbox``)."""
    ceiling = min(cap, base * 2.0 ** min(failures - 1, 60))
    return ceiling * (0.5 + 0.5 * rng.random())


class Worker(threading.Thread):
    """A worker thread: claims pending intents from ``keys()`` and dispatches each until ``stop``.

    ``on_result(key, outcome_or_exception)`` observes each dispatch; ``on_error(exception)`` each failed
    poll. A poll that raises (the database is down, a connection broke) does not end the thread: it
    waits :meth:`backoff_delay` seconds (exponential from ``backoff_base``, at most ``backoff_max``,
    jittered by ``seed``'s generator) and polls again; the store reconnects on its next call. Nothing is
    redispatched by the worker on its own: a dispatch cut off by an outage is left where the store
    last recorded it, for the sweeper and the reconciler (docs/design.md#the-runtime).
    ``poll_failures`` counts consecutive failed polls (0 after a good one), ``outages`` all of them.
    ``wake``: an event that cuts an idle wait short (the outbox sets it when the database notifies that
    an intent became due, and on stop).
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        keys: Callable[[], Iterable[str]],
        *,
        stop: threading.Event,
        on_result: Callable[[str, Any], None] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
        seed: int | None = None,
        idle_sleep: float = 0.02,
        backoff_base: float = 0.05,
        backoff_max: float = 5.0,
        wake: threading.Event | None = None,
    ):
        super().__init__(daemon=True)
        if not 0 < backoff_base <= backoff_max:
            raise ValueError(f"need 0 < backoff_base <= backoff_max, got {backoff_base!r}, {backoff_max!r}")
        self.dispatcher, self.keys, self.stop_event = dispatcher, keys, stop
        self.on_result = on_result or (lambda k, r: None)
        self.on_error = on_error or (lambda exc: None)
        self.rng = random.Random(seed)
        self.idle_sleep = idle_sleep
        self.backoff_base, self.backoff_max = backoff_base, backoff_max
        self.poll_failures = 0
        self.outages = 0
        self.wake = wake

    def backoff_delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` (>= 1) consecutive failed polls: a ceiling of
        ``backoff_base * 2 ** (failures - 1)`` capped at ``backoff_max``, times a jitter factor drawn
        uniformly from [0.5, 1) so that workers cut off by one outage do not come back in step."""
        return backoff_delay(failures, self.backoff_base, self.backoff_max, self.rng)

    def _exhaust(self, key: str) -> None:
        try:
            self.on_result(key, self.dispatcher.store.exhaust(key).state)
        except Exception as exc:  # refused, or the store went away: reported; the next round sees the row
            self.on_result(key, exc)

    def _poll(self) -> list[str] | None:
        """The keys to try this round, or ``None`` after a failed poll (reported, then waited out)."""
        try:
            keys = list(self.keys())
        except Exception as exc:  # the store is unreachable: back off and poll again, never die
            self.poll_failures += 1
            self.outages += 1
            try:
                self.on_error(exc)
            finally:
                self.stop_event.wait(self.backoff_delay(self.poll_failures))
            return None
        self.poll_failures = 0
        return keys

    def run(self) -> None:
        while not self.stop_event.is_set():
            keys = self._poll()
            if keys is None:
                continue
            self.rng.shuffle(keys)
            did = False
            for key in keys:
                if self.stop_event.is_set():
                    return
                try:
                    outcome = self.dispatcher.dispatch(key)
                    self.on_result(key, outcome)
                    did = did or outcome not in default_table().waiting_outcomes
                except Rejected as exc:
                    if exc.event == EVENT.begin and exc.guard == GUARD.attempts_remaining:
                        self._exhaust(key)  # a pending intent out of attempts parks instead of looping
                    elif exc.event != EVENT.begin:
                        self.on_result(key, exc)
                except SimulatedCrash as exc:
                    self.on_result(key, exc)
                    did = True
                except Exception as exc:  # a store or platform failure: report it, keep the worker alive
                    self.on_result(key, exc)
                except BaseException as exc:  # noqa: BLE001 - a transport's cancellation, interrupt or exit raised
                    # in this thread: nothing signals a worker thread but its stop event, so this came out of the
                    # send; its fate is unknown (the lease settles it). Reported; the worker must not die of it
                    self.on_result(key, exc)
            if not did:
                self._idle()

    def _idle(self) -> None:
        """Wait ``idle_sleep`` seconds, or less when ``wake`` is set (a notification that work is due, or a
        stop: whoever sets ``stop`` sets ``wake`` too); the wake is then taken."""
        if self.wake is None:
            self.stop_event.wait(self.idle_sleep)
            return
        self.wake.wait(self.idle_sleep)
        self.wake.clear()
