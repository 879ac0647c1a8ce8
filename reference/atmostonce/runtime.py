"""The runtime that drives any store and any transport (seed 004, mechanisms 2 to 4, "Recovery").

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

import random
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from .errors import AtMostOnceError, GuardRefused, Rejected
from .identity import request_digest
from .records import Intent, Lease
from .store import RETRACTION_PREFIX, Store, retraction_of
from .transport import Found, NotFound, NotSent, Sent, Transport, Unknown, Unsupported, WireRequest

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
    "wire_request",
]

RECONCILER_NAME = "atmostonce.runtime.Reconciler"
RECONCILER_VERSION = 1

CRASH_POINTS = ("after_begin", "after_work", "after_authorize", "after_send", "after_record_success")
"""Step boundaries at which a crash hook may kill a dispatch (the worker just stops)."""


WAITING_OUTCOMES = frozenset(
    {
        "gate.paused",
        "gate.stale_source",
        "gate.awaiting_approval",
        "gate.rate_limited",
        "claim.busy",
        "claim.refused",
        "retract.unsupported",
    }
)
"""Dispatch outcomes that began nothing: a worker that saw only these waits before it polls again."""


class SimulatedCrash(Exception):
    """Raised by a crash hook: the worker dies at this point and makes no further store call."""


@dataclass(frozen=True)
class RuntimeConfig:
    """Lease lengths in seconds (store clock); ``retries_per_tick`` bounds how many failed
    intents one sweeper tick re-queues, so raising a cap releases a backlog at a rate;
    ``reconcile_interval`` (seconds, store clock) spaces the lookups of one intent, so a
    platform's read lag does not burn the reconcile budget in one burst."""

    lease_seconds: float = 30.0
    send_lease_seconds: float = 60.0
    retries_per_tick: int = 50
    sweep_batch: int = 100
    reconcile_batch: int = 50
    reconcile_interval: float = 1.0


def wire_request(intent: Intent) -> WireRequest:
    """The exact request for an intent: its body, its delivery key, its resend epoch; for a retraction
    (``Operations.submit_retraction``) also the action (``delete`` / ``correct``) and the object it acts on."""
    retraction = retraction_of(intent) if intent.action_kind.startswith(RETRACTION_PREFIX) else None
    return WireRequest(
        body=dict(intent.request),
        delivery_key=intent.key,
        resend_epoch=intent.resend_epoch,
        action="create" if retraction is None else retraction["mode"],
        object_id=None if retraction is None else retraction["remote_id"],
    )


def read_back_confirms(transport: Transport, wire: WireRequest, rb: Any) -> bool:
    """Whether a read-back proves the request took effect: the object equals what was sent (create,
    correct), or the object is gone (delete)."""
    if wire.action == "delete":
        return isinstance(rb, NotFound)
    return isinstance(rb, Found) and transport.matches(wire, rb)


def _descriptor(transport: Transport, wire: WireRequest) -> dict[str, Any]:
    return {
        "transport": transport.name,
        "transport_version": transport.protocol_version,
        "reconciler": RECONCILER_NAME,
        "reconciler_version": RECONCILER_VERSION,
        "idempotency_key": wire.idempotency_key,
    }


@dataclass
class Dispatcher:
    """Runs one dispatch of one intent. ``work(intent)`` is the caller's expensive step
    (runs after ``begin``, before ``authorize_dispatch``); ``crash(point)`` may raise
    :class:`SimulatedCrash` at any of :data:`CRASH_POINTS`."""

    store: Store
    transport: Transport
    config: RuntimeConfig = field(default_factory=RuntimeConfig)
    work: Callable[[Intent], None] | None = None
    crash: Callable[[str], None] | None = None
    credential_version: Callable[[str], str | None] | None = None
    """Returns the credential version the worker will send with for an account (``None``: unversioned)."""
    owner: str = "dispatcher"
    """The name this worker presents when it reserves a target's dispatch claim (recorded, seed 003)."""

    def _point(self, name: str) -> None:
        if self.crash is not None:
            self.crash(name)

    def dispatch(self, key: str) -> str:
        """Dispatch ``key`` once; returns the outcome name from the table (e.g. ``read_back.match``).

        Raises :class:`Rejected` when ``begin`` or ``authorize_dispatch`` refuses (nothing was sent),
        :class:`SimulatedCrash` when the crash hook fires.
        """
        before = self.store.get(key)
        if self.store.kill_switch_engaged(before.account):
            return "gate.paused"  # a stop before begin spends nothing: the intent stays queued
        if self.store.rate_limited(before.account):
            return "gate.rate_limited"  # the account's window is full: wait for the next one, spend nothing
        if before.source_version is not None and self.store.source_head(before.source_id) != before.source_version:
            return "gate.stale_source"  # the freshness fence: skipped before any expensive work
        if wire_request(before).action != "create" and not self.transport.capabilities.retract:
            return "retract.unsupported"  # nothing begun: a transport that cannot retract must not try
        claim = None
        if before.requires_approval:  # seeds 001-002: an approval of these bytes, then the target's claim
            digest = request_digest(wire_request(before).body)
            live, now = self.store.approval_table.initial, self.store.now()
            usable = [
                a
                for a in self.store.approvals(key)
                if a.state == live and a.request_digest == digest and a.expires_at > now
            ]
            if not usable:
                return "gate.awaiting_approval"
            try:
                claim = self.store.reserve_claim(
                    key,
                    approval_id=max(usable, key=lambda a: a.expires_at).approval_id,
                    request_digest=digest,
                    owner=self.owner,
                    lease_seconds=self.config.lease_seconds,
                )
            except Rejected as exc:
                return "claim.busy" if exc.guard in ("claim_lease_expired", "source_state") else "claim.refused"
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
            if claim is not None and exc.event in machines and exc.guard != "claim_owner":
                # the approval lapsed or was withdrawn, or the target moved on, since the reservation:
                # nothing was sent; the intent stays queued (its attempt is settled by the sweeper)
                self._give_back(claim)
                return "claim.refused"
            waits = self.store.table.waiting_guards.get(exc.guard)
            if waits is not None:
                self._give_back(claim)
                return waits  # e.g. lost the rate window's last slot to another send: nothing sent, the
                # attempt is left to the sweeper (abandon_attempt) and the intent stays queued
            if not isinstance(exc, GuardRefused) or exc.guard not in self.store.table.policy_guards:
                self._give_back(claim)
                raise  # a stale worker: nothing to record, the sweeper settles the lease
            # a policy gate refused at publish time: terminal and human-owned (seed 004, "Recovery")
            self.store.block_at_gate(lease, reason=f"gate.blocked:{exc.guard}")
            return "gate.blocked"
        self._point("after_authorize")
        result = self.transport.send(wire)
        self._point("after_send")
        if isinstance(result, (NotSent, Unknown)):
            # the outcome table names the move that records it (send.not_sent -> record_not_sent, ...)
            self._record(result.outcome, lease, reason=result.reason)
            return result.outcome
        assert isinstance(result, Sent), result
        self._record(result.outcome, lease, remote_id=result.remote_id, response_digest=result.response_digest)
        self._point("after_record_success")
        rb = self.transport.read_back(result.remote_id)
        if read_back_confirms(self.transport, wire, rb):
            self._record("read_back.match", lease)
            return "read_back.match"
        reason = "read_back.differs" if isinstance(rb, Found) else "read_back.not_found"
        self._record(reason, lease, reason=reason)
        return reason

    def _give_back(self, claim: Any) -> None:
        """Release a reservation this dispatch took and will not use (refused if it is no longer ours)."""
        if claim is None:
            return
        try:
            self.store.release_claim(claim)
        except Rejected:
            pass

    def _record(self, outcome: str, lease: Lease, **kw: Any) -> Intent:
        """Record ``outcome`` with the event the table maps it to."""
        event = self.store.table.outcomes[outcome].event
        return getattr(self.store, event)(lease, **kw)


@dataclass
class Sweeper:
    """Maintenance over expired leases and the retry policy. Safe to run twice at once:
    every write moves a row only if it is still as planned (``lease_holder`` guard)."""

    store: Store
    config: RuntimeConfig = field(default_factory=RuntimeConfig)

    def sweep_leases(self) -> dict[str, int]:
        """Returns counts: ``expired`` (to indeterminate), ``abandoned`` (pre-authorization), ``skipped``."""
        out = {"expired": 0, "abandoned": 0, "skipped": 0}
        table = self.store.table
        for it in self.store.due_leases(self.config.sweep_batch):
            # the table names the sweeper's lease-expiry move for the intent's state
            events = [e for e in table.events.values() if e.actor == "sweeper" and it.state in e.sources]
            if len(events) != 1:
                out["skipped"] += 1
                continue
            try:
                getattr(self.store, events[0].name)(it)
                out["expired" if table.states[events[0].target].kind == "unknown" else "abandoned"] += 1
            except Rejected:
                out["skipped"] += 1
        return out

    def retry_failed(self, limit: int | None = None) -> dict[str, int]:
        """Re-queue up to ``limit`` (default ``retries_per_tick``) failed intents; park exhausted ones."""
        budget = self.config.retries_per_tick if limit is None else limit
        out = {"retried": 0, "exhausted": 0, "skipped": 0}
        for state in self.store.table.retryable_states:
            for it in self.store.list_intents(state=state, limit=budget):
                if out["retried"] >= budget:
                    return out
                try:
                    if it.attempt_count < it.max_attempts:
                        self.store.retry(it.key)
                        out["retried"] += 1
                    else:
                        self.store.exhaust(it.key)
                        out["exhausted"] += 1
                except Rejected:
                    out["skipped"] += 1
        return out

    def expire_approvals(self) -> dict[str, int]:
        """Move approvals whose deadline passed (database clock) to ``expired`` (seed 001: expiry is a
        transition). Returns ``{"approvals_expired": n}``."""
        n = 0
        for a in self.store.due_approvals(self.config.sweep_batch):
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

    store: Store
    transport: Transport
    config: RuntimeConfig = field(default_factory=RuntimeConfig)

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

    def reconcile_one(self, it: Intent) -> str:
        """One lookup (or none) for one intent; returns the outcome name it recorded."""
        plan = it.plan
        caps = self.transport.capabilities
        if self._drifted(it):
            self.store.park_unreconcilable(plan, reason="reconcile.descriptor_drift")
            return "reconcile.descriptor_drift"
        if it.reconcile_count >= it.max_reconciles:
            self.store.park_unreconcilable(plan, reason="reconcile.budget_spent")
            return "reconcile.budget_spent"
        wire = wire_request(it)
        object_id = it.remote_id if it.remote_id is not None else wire.object_id  # a retraction acts on a known object
        if object_id is not None and caps.read_back:
            rb = self.transport.read_back(object_id)
            if read_back_confirms(self.transport, wire, rb):
                self.store.reconcile_found(plan, remote_id=object_id)
                return "lookup.found"
            self.store.reconcile_not_found(plan)
            return "lookup.not_found"
        if wire.action != "create":  # a key lookup says nothing about a deletion or a correction
            self.store.park_unreconcilable(plan, reason="lookup.unsupported")
            return "lookup.unsupported"
        if not caps.lookup_by_key:
            self.store.park_unreconcilable(plan, reason="lookup.unsupported")
            return "lookup.unsupported"
        res = self.transport.lookup(it.key, it.resend_epoch)
        if isinstance(res, Found):
            self.store.reconcile_found(plan, remote_id=res.remote_id)
            return "lookup.found"
        if isinstance(res, Unsupported):
            self.store.park_unreconcilable(plan, reason="lookup.unsupported")
            return "lookup.unsupported"
        assert isinstance(res, NotFound), res
        if caps.fenced_lookup:
            try:
                self.store.reconcile_absent(plan, fenced=True)
                return "lookup.not_found_fenced"
            except GuardRefused as exc:
                if exc.guard != "absence_provable":
                    raise
            # the attempt was begun before a restore: its key may have been rewound, so this
            # not-found proves nothing (it counts against the budget; exhaustion parks for a human)
            self.store.reconcile_not_found(plan)
            return "lookup.not_found_before_restore"
        self.store.reconcile_not_found(plan)
        return "lookup.not_found"

    def run(self, limit: int | None = None) -> dict[str, int]:
        """Reconcile up to ``limit`` indeterminate intents; returns counts per outcome name."""
        out: dict[str, int] = {}
        now = self.store.now()
        for state in self.store.table.states_of_kind("unknown"):
            for it in self.store.list_intents(state=state, limit=limit or self.config.reconcile_batch):
                if now - it.updated_at < self.config.reconcile_interval:
                    out["deferred"] = out.get("deferred", 0) + 1
                    continue
                try:
                    name = self.reconcile_one(it)
                except Rejected:
                    name = "skipped"
                except AtMostOnceError:  # the lookup itself failed: no evidence, nothing written
                    name = "lookup.error"
                out[name] = out.get(name, 0) + 1
        return out


class Worker(threading.Thread):
    """A worker thread: claims pending intents from ``keys()`` and dispatches each until ``stop``.

    ``on_result(key, outcome_or_exception)`` observes each dispatch.
    """

    def __init__(
        self,
        dispatcher: Dispatcher,
        keys: Callable[[], Iterable[str]],
        *,
        stop: threading.Event,
        on_result: Callable[[str, Any], None] | None = None,
        seed: int | None = None,
        idle_sleep: float = 0.02,
    ):
        super().__init__(daemon=True)
        self.dispatcher, self.keys, self.stop_event = dispatcher, keys, stop
        self.on_result = on_result or (lambda k, r: None)
        self.rng = random.Random(seed)
        self.idle_sleep = idle_sleep

    def _exhaust(self, key: str) -> None:
        try:
            self.on_result(key, self.dispatcher.store.exhaust(key).state)
        except Rejected as exc:
            self.on_result(key, exc)

    def run(self) -> None:
        while not self.stop_event.is_set():
            keys = list(self.keys())
            self.rng.shuffle(keys)
            did = False
            for key in keys:
                if self.stop_event.is_set():
                    return
                try:
                    outcome = self.dispatcher.dispatch(key)
                    self.on_result(key, outcome)
                    did = did or outcome not in WAITING_OUTCOMES
                except Rejected as exc:
                    if exc.event == "begin" and exc.guard == "attempts_remaining":
                        self._exhaust(key)  # a pending intent out of attempts parks instead of looping
                    elif exc.event != "begin":
                        self.on_result(key, exc)
                except SimulatedCrash as exc:
                    self.on_result(key, exc)
                    did = True
                except Exception as exc:  # a store or platform failure: report it, keep the worker alive
                    self.on_result(key, exc)
            if not did:
                self.stop_event.wait(self.idle_sleep)
