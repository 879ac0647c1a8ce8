"""The store operations: one operation set, composed over a small core that each store implements.

Every transition method maps to one table event and is carried out by the store's core
(:class:`~atmostonce.protocols.StoreCore`): ``core._apply(event, key, args)`` looks the event up in the
table, checks the source state and the event's named guards, and either makes the move atomically or
raises a :class:`~atmostonce.errors.Rejected` naming what refused, leaving everything unchanged
(docs/design.md#one-table-read-by-everything).

:class:`Operations` gives every implementation the same public signatures and the same input checks, so
the model and the stores cannot drift in what they accept. What each caller needs of a store is one of
the role protocols of :mod:`atmostonce.protocols` (re-exported here); :class:`Store` is their union.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from . import identity, observe
from .claims import ClaimOperations, claim_args
from .errors import GuardRefused, IntakeCode, IntakeError, Rejected
from .names import EFFECT, EVENT, GUARD, OUTCOME, STATE
from .protocols import (
    AuditStore,
    IntakeStore,
    MaintenanceStore,
    OperatorStore,
    OutboxStore,
    Store,
    StoreCore,
    WorkerStore,
)
from .records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RECONCILES,
    MAX_NAME_BYTES,
    ClaimLease,
    Evidence,
    Intent,
    Lease,
    Plan,
    Reconciliation,
    SourceCapture,
    Submission,
    check_json_object,
    check_retry_after,
    check_text,
    person_name,
    prepare_submission,
    validate_lease_seconds,
)
from .table import Table

__all__ = [
    "RETRACTION_PREFIX",
    "AuditStore",
    "IntakeStore",
    "MaintenanceStore",
    "Operations",
    "OperatorStore",
    "OutboxStore",
    "Store",
    "StoreCore",
    "WorkerStore",
    "retraction_of",
    "superseding_move",
]

RETRACTION_PREFIX = "retract."
"""Action kinds of retraction intents: ``retract.delete`` and ``retract.correct``."""


def retraction_of(intent_or_body: Any) -> dict[str, Any] | None:
    """The retraction request (``retracts``, ``remote_id``, ``mode``, optional ``correction``) of a retraction
    intent or its wire body, else ``None``."""
    body = getattr(intent_or_body, "request", intent_or_body)
    if (
        isinstance(body, Mapping)
        and isinstance(body.get("retracts"), str)
        and body.get("mode") in ("delete", "correct")
    ):
        return dict(body)
    return None


_PRESENTED = ("attempt_token", "generation", "epoch", "plan_generation", "plan_reconcile_count", "plan_epoch")


def superseding_move(
    t: Table, moves: Iterable[tuple[int, str, str | None, int | None]], presented: Mapping[str, Any]
) -> int | None:
    """The history ``seq`` of the move that superseded what a refused writer presented, or ``None``.

    ``moves`` are the intent's history rows as ``(seq, event, attempt_token, generation)`` in sequence
    order; ``presented`` the refused write's fencing arguments. For a plan (``plan_reconcile_count``):
    the first move after which the plan no longer held, i.e. the lookup that counted past the planned
    count or the ``begin`` of a newer generation. For a lease: the ``begin`` of the first newer
    generation, else the move that closed the presented attempt (the sweeper's expiry, say). ``None``
    when nothing superseded it (a forged token, a restore declared with no move since). Not the
    newest move: later moves say nothing about why this writer was stale (docs/design.md, "The audit").
    """
    moves = list(moves)
    effects = {name: set(ev.effects) for name, ev in t.events.items()}
    if "plan_reconcile_count" in presented:
        planned, gen, counted = presented["plan_reconcile_count"], presented.get("plan_generation"), 0
        for seq, event, _tok, g in moves:
            if EFFECT.count_reconcile in effects[event]:
                counted += 1
                if counted > planned:
                    return seq
            if EFFECT.open_attempt in effects[event] and g is not None and (gen is None or g > gen):
                return seq
        return None
    token, gen = presented.get("attempt_token"), presented.get("generation")
    if gen is not None:
        for seq, event, _tok, g in moves:
            if EFFECT.open_attempt in effects[event] and g is not None and g > gen:
                return seq
    if token is not None:
        for seq, event, tok, _g in moves:
            if effects[event] & {EFFECT.close_attempt, EFFECT.fence_restore} and tok == token:
                return seq
    return None


def step_args(args: Any, previous: Intent | None) -> Mapping[str, Any]:
    """A step's arguments in :meth:`Operations._apply_sequence`: ``args`` itself, or ``args(previous)``."""
    out: Mapping[str, Any] = args(previous) if callable(args) else args
    return out


def lease_of(begun: Intent) -> Lease:
    """The lease a ``begin`` opened, from the row it left: its attempt token, generation, lease deadline
    (store-clock seconds) and restore epoch (0 when the row has none)."""
    assert begun.attempt_token is not None and begun.generation is not None and begun.lease_expires_at is not None
    return Lease(begun.key, begun.attempt_token, begun.generation, begun.lease_expires_at, begun.epoch or 0)


@dataclass(frozen=True)
class UnderNewLease:
    """A step's arguments (:meth:`Operations._apply_sequence`): ``fixed``, held to the lease the previous move
    opened (:func:`lease_of` of its row: attempt token, generation, epoch). Called with that row it returns
    the arguments; a store that runs both moves in one statement reads the lease from the first move's row
    there instead (``atmostonce_sql``). ``seen`` is told the arguments each time they are built."""

    fixed: Mapping[str, Any]
    seen: Callable[[Mapping[str, Any]], None] | None = None

    def __call__(self, previous: Intent | None) -> Mapping[str, Any]:
        assert previous is not None, "a step under a new lease follows the move that opened it"
        args = _lease_args(lease_of(previous)) | dict(self.fixed)
        if self.seen is not None:
            self.seen(args)
        return args


def _authorization_steps(
    lease_seconds: float,
    send_lease_seconds: float,
    *,
    request_digest: str,
    descriptor: Mapping[str, Any] | None = None,
    credential_version: str | None = None,
    platform: str | None = None,
    contract_version: str | None = None,
) -> list[tuple[str, Any]]:
    """``begin`` and ``authorize_dispatch`` as the steps of one transaction, their arguments validated
    (``IntakeError`` for bad input)."""
    begin_args = {"lease_seconds": validate_lease_seconds("lease_seconds", lease_seconds)}
    auth_args = {
        "request_digest": check_text("request_digest", request_digest, max_chars=128),
        "lease_seconds": validate_lease_seconds("send_lease_seconds", send_lease_seconds),
        "descriptor": check_json_object("descriptor", descriptor or {}),
        "credential_version": _optional_text("credential_version", credential_version),
        "platform": _optional_text("platform", platform),
        "contract_version": _optional_text("contract_version", contract_version),
    }
    return [(EVENT.begin, begin_args), (EVENT.authorize_dispatch, UnderNewLease(auth_args))]


def _need_text(name: str, v: Any) -> str:
    return check_text(name, v)


def _optional_text(name: str, v: Any) -> str | None:
    return None if v is None else check_text(name, v)


def _int(name: str, v: Any, optional: bool = False) -> int | None:
    if v is None and optional:
        return None
    message = f"{name} must be a 64-bit integer, got {v!r}"
    if isinstance(v, bool) or not isinstance(v, int):
        raise IntakeError(message, field=name, code=IntakeCode.NOT_INTEGER)
    if not -(2**63) <= v < 2**63:
        raise IntakeError(message, field=name, code=IntakeCode.OUT_OF_RANGE, limit=-(2**63) if v < 0 else 2**63 - 1)
    return v


def _lease_args(lease: Lease) -> dict[str, Any]:
    if not isinstance(lease, Lease):
        raise IntakeError(
            f"expected a Lease from begin(), got {type(lease).__name__}", field="lease", code=IntakeCode.WRONG_TYPE
        )
    return {
        "attempt_token": check_text("attempt token", lease.attempt_token, max_chars=128),
        "generation": _int("generation", lease.generation),
        "epoch": _int("epoch", lease.epoch),
    }


def _plan_args(plan: Plan) -> dict[str, Any]:
    if not isinstance(plan, Plan):
        raise IntakeError(
            f"expected a Plan (Intent.plan), got {type(plan).__name__}", field="plan", code=IntakeCode.WRONG_TYPE
        )
    count = _int("plan reconcile count", plan.reconcile_count)
    assert count is not None  # not optional
    if not -(2**31) <= count < 2**31:  # a reconcile count is a 32-bit column (PostgreSQL would fail to cast it)
        raise IntakeError(
            f"plan reconcile count must be a 32-bit integer, got {count!r}",
            field="plan reconcile count",
            code=IntakeCode.OUT_OF_RANGE,
            limit=-(2**31) if count < 0 else 2**31 - 1,
        )
    return {
        "plan_generation": _int("plan generation", plan.generation, optional=True),
        "plan_reconcile_count": count,
        "plan_epoch": _int("plan epoch", plan.epoch, optional=True),
    }


class Operations(ClaimOperations):
    """Public operations shared by every store, composed over ``core``: the store's
    :class:`~atmostonce.protocols.StoreCore` (apply an event, create, append, write a policy, read).

    Operations defines no primitive for a store to override: it validates the input, builds each event's
    arguments and calls ``self.core``. A store assigns its core in its constructor (``self.core = self``
    for the shipped stores, which implement the core themselves; the assignment is where the type checker
    holds the store to :class:`~atmostonce.protocols.StoreCore`) and implements the reads of
    :class:`~atmostonce.protocols.Store` that are not operations (``history``, ``attempts``, ...)."""

    table: Table
    core: StoreCore
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def __init__(self, core: StoreCore, table: Table, *, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES):
        """The operations over ``core``, a separate object: ``Operations(core, table)`` is a working set of
        every operation of :class:`~atmostonce.protocols.Store` whose moves, appends and policy writes are the
        core's. The shipped stores do not call this: each is its own core (``self.core = self``)."""
        self.core, self.table, self.max_payload_bytes = core, table, max_payload_bytes

    def check(
        self, event: str, key: str, args: Mapping[str, Any] | None = None, *, guards: Sequence[str] | None = None
    ) -> str | None:
        """Evaluate, without writing, what the move ``event`` of intent ``key`` checks: its source state,
        then its guards (or only ``guards``, some of the event's, in the order given) against ``args``,
        the arguments the move would present, with the same predicates (model) or SQL fragments (SQL
        stores) the move's conditional write uses. Returns the name of the first that refuses
        (``source_state`` for the state), or ``None`` when the move's checks pass now; a later move may
        still be refused, since the row can change in between (docs/design.md#the-gate-is-the-conditional-write).
        Raises ``UnknownIntent`` for a key with no intent and ``IntakeError`` for an event the table does
        not have or a guard that is not one of the event's."""
        key = check_text("key", key, max_chars=256)
        if event not in self.table.events or self.table.events[event].creates:
            raise IntakeError(f"{event!r} is not a move of the table")
        ev = self.table.events[event]
        chosen = ev.guards if guards is None else tuple(guards)
        stray = [g for g in chosen if g not in ev.guards]
        if stray:
            raise IntakeError(f"{stray} are not guards of {event}; it checks {list(ev.guards)}")
        return self.core._check(event, key, dict(args or {}), chosen)

    def _move(self, event: str, key: Any, args: Mapping[str, Any]) -> Intent:
        """Validate the key, then hand the move to the core's ``_apply``; a write refused by a
        fencing guard (a stale token, generation, epoch or plan) is recorded, not silent (docs/design.md#refusals-are-recorded)."""
        key = check_text("key", key, max_chars=256)
        try:
            it = self.core._apply(event, key, args)
        except Rejected as exc:
            observe.log_refusal(exc)  # one record per refused move, counted by guard (docs/operations.md)
            if isinstance(exc, GuardRefused) and exc.guard in self.table.fencing_guards:
                self.core._record_refusal(exc, {k: args[k] for k in _PRESENTED if k in args})
            raise
        observe.log_move(event, it, args, self.table)  # one record per move: key, event, outcome, attempt, generation
        return it

    def _one_by_one(self, event: str, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Intent | Rejected]:
        out: list[Intent | Rejected] = []
        for key, args in items:
            try:
                out.append(self.core._apply(event, key, args))
            except Rejected as exc:
                out.append(exc)
        return out

    def _batch(self, moves: Sequence[tuple[str, str, Mapping[str, Any]]]) -> list[Intent | Rejected]:
        """:meth:`_move` for many intents: ``moves`` are ``(event, key, args)``; each event's moves go to the core's
        ``_apply_batch``, one batch per event, as many as a key occurs (its n-th move in the n-th batch, after its
        earlier ones). A core without ``_apply_batch`` (it is optional: a first store's core need not batch) gets
        each move through ``_apply``, one transaction each, with the same results. Each move is logged, and each
        fencing refusal recorded, as :meth:`_move` does; returns the moved intent or the refusal of each move, in
        order."""
        apply_batch = getattr(self.core, "_apply_batch", None) or self._one_by_one
        rounds: dict[tuple[int, str], list[int]] = {}
        seen: dict[str, int] = {}
        for i, (event, key, _) in enumerate(moves):
            n = seen[key] = seen.get(key, -1) + 1
            rounds.setdefault((n, event), []).append(i)
        results: dict[int, Intent | Rejected] = {}
        for (_, event), idx in sorted(rounds.items(), key=lambda r: r[0][0]):
            got = apply_batch(event, [(moves[i][1], moves[i][2]) for i in idx])
            results.update(zip(idx, got, strict=True))
        out = [results[i] for i in range(len(moves))]
        for (event, _, args), res in zip(moves, out, strict=True):
            if isinstance(res, Rejected):
                observe.log_refusal(res)
                if isinstance(res, GuardRefused) and res.guard in self.table.fencing_guards:
                    self.core._record_refusal(res, {k: args[k] for k in _PRESENTED if k in args})
            else:
                observe.log_move(event, res, args, self.table)
        return out

    def _moves(self, key: Any, steps: list[tuple[str, Any]]) -> list[Intent]:
        """:meth:`_move` for several moves in one transaction; a fencing refusal is recorded after the
        rollback, with what the refused move presented."""
        key = check_text("key", key, max_chars=256)
        presented: dict[str, Mapping[str, Any]] = {}

        def remember(event: str, args: Any) -> Any:
            if isinstance(args, UnderNewLease):
                return replace(args, seen=lambda built: presented.__setitem__(event, built))
            if not callable(args):
                presented[event] = args
                return args

            def build(prev: Intent | None) -> Mapping[str, Any]:
                presented[event] = args(prev)
                return presented[event]

            return build

        try:
            moved = self.core._apply_sequence(key, [(event, remember(event, args)) for event, args in steps])
        except Rejected as exc:
            observe.log_refusal(exc)
            if isinstance(exc, GuardRefused) and exc.guard in self.table.fencing_guards and exc.event in presented:
                args = presented[exc.event]
                self.core._record_refusal(exc, {k: args[k] for k in _PRESENTED if k in args})
            raise
        for (event, _), it in zip(steps, moved, strict=True):
            observe.log_move(event, it, presented.get(event, {}), self.table)
        return moved

    def reconciliation_results(self, key: str) -> dict[int, Reconciliation]:
        """The current reconciliation record of each of the intent's sends, by ``send_seq`` (the
        history ``seq`` of the move that made that send's outcome unknown): its newest row."""
        from .audit import current_reconciliations

        return current_reconciliations(self.core.reconciliations(key))

    # -- intake ---------------------------------------------------------------------------
    def submit(
        self,
        account: str,
        action_kind: str,
        target: str,
        request: Mapping[str, Any],
        *,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_reconciles: int = DEFAULT_MAX_RECONCILES,
        source: tuple[str, str] | None = None,
        requires_approval: bool = False,
    ) -> Intent:
        """Create the intent for this delivery, or return the existing one with the same key.

        ``requires_approval=True``: the intent is dispatched only under an approval of its exact bytes
        and its target's dispatch claim (:meth:`approve`, :meth:`reserve_claim`; docs/design.md#approvals-and-per-target-dispatch-claims).

        ``source`` is ``(source_id, version)`` when the intent rests on a captured source version
        (see :meth:`capture_source`); it is then skipped before any spend, and refused at publish
        time, once that version is no longer the head.

        Raises :class:`IntakeError` for bad input (see ``prepare_submission``); writes nothing then.
        """
        sub = prepare_submission(
            account,
            action_kind,
            target,
            request,
            max_attempts=max_attempts,
            max_reconciles=max_reconciles,
            max_payload_bytes=self.max_payload_bytes,
            source=source,
            requires_approval=requires_approval,
        )
        if sub.action_kind.startswith(RETRACTION_PREFIX):
            self._check_retraction(sub)
        it, created = self.core._create(sub)
        return self._submitted(sub, it, created)

    def _submitted(self, sub: Submission, it: Intent, created: bool) -> Intent:
        """The intent a submission created (logged) or found (its approval requirement must match)."""
        if created:
            observe.log_move(EVENT.submit, it, {}, self.table)
        if not created and it.requires_approval != sub.requires_approval:
            raise IntakeError(
                f"this delivery exists already with requires_approval={it.requires_approval}; "
                "an approval requirement cannot be added to or dropped from an intent",
                field="requires_approval",
            )
        return it

    def _check_retraction(self, sub: Submission) -> None:
        """A retraction names a published intent of the same account and target, its recorded remote id,
        and a mode that matches its action kind; anything else is refused before it is stored."""
        r = retraction_of(sub.request)
        mode = sub.action_kind[len(RETRACTION_PREFIX) :]
        if r is None or r["mode"] != mode:
            raise IntakeError("a retract.* intent needs a request made by submit_retraction", field="request")
        orig = self.core.find(r["retracts"])
        if (
            orig is None
            or orig.action_kind.startswith(RETRACTION_PREFIX)
            or orig.state != STATE.published
            or orig.remote_id is None
            or orig.remote_id != r.get("remote_id")
            or (orig.account, orig.target) != (sub.account, sub.target)
        ):
            raise IntakeError(
                "a retraction must name a published intent of this account and target and its remote id",
                field="retracts",
            )
        if mode == "correct" and not isinstance(r.get("correction"), Mapping):
            raise IntakeError(
                "a correction needs a 'correction' object", field="correction", code=IntakeCode.NOT_OBJECT
            )

    def submit_retraction(
        self, key: str, *, correction: Mapping[str, Any] | None = None, max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> Intent:
        """A retraction of published intent ``key``: its own delivery intent against the recorded remote
        object id (docs/design.md#approvals-and-per-target-dispatch-claims: local status never undoes a remote effect). Without ``correction`` it
        deletes the object; with it, it replaces the object's body by ``correction`` (a JSON object).
        It is dispatched, read back and reconciled like any intent: a deletion is confirmed when
        read-back finds no object, a correction when the object equals the corrected body. The
        original intent stays ``published``. Submitting the same retraction again returns the same
        intent. Raises ``IntakeError`` when ``key`` is not published with a remote id, or for bad input.
        """
        it = self.core.get(check_text("key", key, max_chars=256))
        if it.state != STATE.published or it.remote_id is None:
            raise IntakeError(
                f"only a published intent with a remote id can be retracted; {key[:12]} is {it.state}", field="key"
            )
        if it.action_kind.startswith(RETRACTION_PREFIX):
            raise IntakeError(
                "a retraction is not itself retracted; submit a correction of the original instead", field="key"
            )
        mode = "delete" if correction is None else "correct"
        request: dict[str, Any] = {"retracts": it.key, "remote_id": it.remote_id, "mode": mode}
        if correction is not None:
            request["correction"] = check_json_object("correction", correction)
            deletion = {"retracts": it.key, "remote_id": it.remote_id, "mode": "delete"}
            done = self.core.find(identity.delivery_key(it.account, RETRACTION_PREFIX + "delete", it.target, deletion))
            if done is not None and done.state == STATE.published:
                raise IntakeError(
                    f"the object {it.remote_id} was already deleted by retraction {done.key[:12]}", field="correction"
                )
        # a correction sends new bytes: it needs the same approval gate as the intent it corrects
        return self.submit(
            it.account,
            RETRACTION_PREFIX + mode,
            it.target,
            request,
            max_attempts=max_attempts,
            requires_approval=it.requires_approval,
        )

    # -- sources (docs/design.md#sources-and-the-freshness-fence) -----------------------------------
    def capture_source(self, source_id: str, body: str, *, raw: bytes | None = None) -> SourceCapture:
        """Record a fetch of a source. A new version is stored only when the normalized visible body
        changed; ``supersedes`` is whatever head the store holds (never a computed predecessor), so a
        skipped or failed earlier capture does not jam the chain. ``raw`` is hashed for forensics only.
        Raises ``IntakeError`` for bad input."""
        check_text("source id", source_id, max_chars=2048, max_bytes=MAX_NAME_BYTES)
        if not isinstance(body, str):
            raise IntakeError("body must be the source's visible text (str)", field="body", code=IntakeCode.NOT_STRING)
        try:
            version = identity.source_version(source_id, body)
        except identity.IdentityError as exc:
            same = exc.code.value in {c.value for c in IntakeCode}
            code = IntakeCode(exc.code.value) if same else IntakeCode.NOT_CANONICAL
            raise IntakeError(str(exc), field="body", code=code) from exc
        raw_hash = identity.raw_digest(raw) if isinstance(raw, (bytes, bytearray)) else None
        return self.core._store_capture(source_id, version, raw_hash)

    # -- worker ---------------------------------------------------------------------------
    def begin(self, key: str, *, lease_seconds: float = 30.0) -> Lease:
        """Open the intent's next attempt under a lease of ``lease_seconds`` (store clock).

        The only creator of attempts. Raises ``Rejected`` (no_open_attempt, attempts_remaining, ...).
        """
        secs = validate_lease_seconds("lease_seconds", lease_seconds)
        return lease_of(self._move(EVENT.begin, key, {"lease_seconds": secs}))

    def authorize_dispatch(
        self,
        lease: Lease,
        *,
        request_digest: str,
        send_lease_seconds: float = 60.0,
        descriptor: Mapping[str, Any] | None = None,
        credential_version: str | None = None,
        platform: str | None = None,
        contract_version: str | None = None,
        claim: ClaimLease | None = None,
    ) -> Intent:
        """The last checkpoint before bytes (docs/design.md#the-gate-is-the-conditional-write): one conditional write, or nothing sends.

        Re-checks, in that one write, everything checked earlier: the lease (token, generation,
        restore epoch, deadline), the exact request digest, the kill switches, the account's
        credential version, the platform contract version, and the duplicate-text window; for an
        approval-gated intent also, in the same atomic step, the target claim ``claim`` (owner token,
        epoch, lease), its approval (live, binding this digest, account and target) and the target
        version, which it bumps (docs/design.md#approvals-and-per-target-dispatch-claims); when the account requires signed approvals, the approval's
        Ed25519 signature by its approver's registered key (``approval_signature_verified``,
        docs/design.md#signed-approvals). Raises ``GuardRefused`` naming the first condition that failed;
        ``IntakeError`` for bad input.
        """
        secs = validate_lease_seconds("send_lease_seconds", send_lease_seconds)
        args = (
            _lease_args(lease)
            | {
                "request_digest": check_text("request_digest", request_digest, max_chars=128),
                "lease_seconds": secs,
                "descriptor": check_json_object("descriptor", descriptor or {}),
                "credential_version": _optional_text("credential_version", credential_version),
                "platform": _optional_text("platform", platform),
                "contract_version": _optional_text("contract_version", contract_version),
            }
            | claim_args(claim)
        )
        # signed approvals: the signature is verified here, in the worker's process, before the one write
        # whose approval_signature_verified guard holds the row to what was verified (docs/design.md#signed-approvals)
        args |= self.verified_signature_args(claim)
        return self._move(EVENT.authorize_dispatch, lease.key, args)

    def begin_and_authorize(
        self,
        key: str,
        *,
        request_digest: str,
        lease_seconds: float = 30.0,
        send_lease_seconds: float = 60.0,
        descriptor: Mapping[str, Any] | None = None,
        credential_version: str | None = None,
        platform: str | None = None,
        contract_version: str | None = None,
    ) -> tuple[Lease, Intent]:
        """:meth:`begin` and :meth:`authorize_dispatch` in one transaction: the before-byte durable
        point of a send as one commit (docs/design.md#two-durable-points-per-send). Each move is its own
        conditional write with the table's guards, as when they are called one by one; the two are
        committed together or not at all, so a refused authorization leaves no attempt behind and
        spends nothing (the intent stays as it was).

        Returns the lease (``lease_seconds`` until the authorization, then ``send_lease_seconds``,
        both store-clock seconds) and the authorized intent. Raises ``Rejected`` as ``begin`` or
        ``authorize_dispatch`` would (``exc.event`` names which move refused), ``IntakeError`` for bad
        input. For an approval-gated intent use ``begin``, ``reserve_claim`` and ``authorize_dispatch``.
        """
        steps = _authorization_steps(
            lease_seconds,
            send_lease_seconds,
            request_digest=request_digest,
            descriptor=descriptor,
            credential_version=credential_version,
            platform=platform,
            contract_version=contract_version,
        )
        begun, authorized = self._moves(key, steps)
        return lease_of(begun), authorized

    def submit_and_authorize(
        self,
        account: str,
        action_kind: str,
        target: str,
        request: Mapping[str, Any],
        *,
        authorization: Callable[[Submission], Mapping[str, Any]],
        lease_seconds: float = 30.0,
        send_lease_seconds: float = 60.0,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        max_reconciles: int = DEFAULT_MAX_RECONCILES,
        source: tuple[str, str] | None = None,
    ) -> tuple[Intent, tuple[Lease, Intent] | None]:
        """:meth:`submit` and :meth:`begin_and_authorize` in one transaction where the store can: the intent
        and its authorization reach the disk in one commit, before the bytes (docs/design.md#two-durable-points-per-send).

        ``authorization(sub)`` gets the validated :class:`~atmostonce.records.Submission` (its key and request
        as they will be stored) and returns :meth:`begin_and_authorize`'s keyword arguments other than the
        leases: ``request_digest`` (required), and optionally ``descriptor``, ``credential_version``,
        ``platform``, ``contract_version``. Every move is still the table's conditional write.

        Returns ``(intent, authorized)``: the intent as submitted (or as found, when this delivery exists), and
        ``(lease, authorized intent)`` when the authorization was made in that transaction, else ``None``: the
        store cannot make both in one transaction, the intent needs an approval or is a retraction, or the
        authorization's gates refused (the intent is then stored and queued as :meth:`submit` leaves it, and
        the caller dispatches it the usual way, which names the refusal). Raises :class:`IntakeError` as
        :meth:`submit` does, for bad input or for arguments ``authorization`` returns."""
        sub = prepare_submission(
            account,
            action_kind,
            target,
            request,
            max_attempts=max_attempts,
            max_reconciles=max_reconciles,
            max_payload_bytes=self.max_payload_bytes,
            source=source,
        )
        together = getattr(self.core, "_create_and_apply", None)
        got = None
        if together is not None and not sub.action_kind.startswith(RETRACTION_PREFIX):
            steps = _authorization_steps(lease_seconds, send_lease_seconds, **authorization(sub))
            got = together(sub, steps)
        if got is None:  # the usual way: submit (its own commit); the caller dispatches the intent
            if sub.action_kind.startswith(RETRACTION_PREFIX):
                self._check_retraction(sub)
            return self._submitted(sub, *self.core._create(sub)), None
        it, (begun, authorized) = got
        self._submitted(sub, it, True)
        observe.log_move(EVENT.begin, begun, {}, self.table)
        observe.log_move(EVENT.authorize_dispatch, authorized, {}, self.table)
        return it, (lease_of(begun), authorized)

    def record_sent(
        self,
        lease: Lease,
        *,
        remote_id: str,
        read_back: str,
        response_digest: str | None = None,
        reason: str | None = None,
        evidence: Mapping[str, Any] | None = None,
    ) -> Intent:
        """:meth:`record_success` and the read-back's move in one transaction: the outcome of a send
        as one commit (docs/design.md#two-durable-points-per-send). ``read_back`` is the read-back's
        outcome name from the table (``read_back.match`` moves by ``confirm_read_back``; ``read_back.differs``,
        ``read_back.not_found`` or ``read_back.unavailable`` by ``read_back_failed``, with ``reason``,
        required, and optional ``evidence``, a JSON object). Both moves or neither: a refusal (the lease lapsed,
        a newer attempt) is raised with nothing written. Raises ``Rejected``, ``IntakeError``."""
        success = _lease_args(lease) | {
            "remote_id": _need_text("remote_id", remote_id),
            "response_digest": response_digest,
        }
        outcome = self.table.outcomes.get(read_back)
        # a read-back's move is one that needs the remote id record_success sets, by the same actor
        actor = self.table.event(EVENT.record_success).actor
        if (
            outcome is None
            or outcome.event is None
            or self.table.event(outcome.event).actor != actor
            or GUARD.remote_id_known not in self.table.event(outcome.event).guards
        ):
            raise IntakeError(f"{read_back!r} is not a read-back outcome")
        second = _lease_args(lease)
        if (
            reason is not None or outcome.event != EVENT.confirm_read_back
        ):  # a failed read-back says why, as read_back_failed does
            second["reason"] = _need_text("reason", reason)
        if evidence is not None:
            second["evidence"] = check_json_object("evidence", evidence)
        moved = self._moves(lease.key, [(EVENT.record_success, success), (outcome.event, second)])
        return moved[-1]

    def block_at_gate(self, lease: Lease, *, reason: str) -> Intent:
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        return self._move(EVENT.block_at_gate, lease.key, args)

    def record_success(self, lease: Lease, *, remote_id: str, response_digest: str | None = None) -> Intent:
        args = _lease_args(lease) | {
            "remote_id": _need_text("remote_id", remote_id),
            "response_digest": response_digest,
        }
        return self._move(EVENT.record_success, lease.key, args)

    def confirm_read_back(self, lease: Lease) -> Intent:
        args = _lease_args(lease)
        return self._move(EVENT.confirm_read_back, lease.key, args)

    def read_back_failed(self, lease: Lease, *, reason: str, evidence: Mapping[str, Any] | None = None) -> Intent:
        """The read-back did not confirm the send: ``indeterminate``. ``evidence`` (a JSON object, e.g.
        ``atmostonce.projection.Comparison.evidence()``: the field that differed and both projections) is
        kept in the move's history row. Raises ``Rejected`` (fencing guards), ``IntakeError`` for bad input."""
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        if evidence is not None:
            args["evidence"] = check_json_object("evidence", evidence)
        return self._move(EVENT.read_back_failed, lease.key, args)

    def record_not_sent(self, lease: Lease, *, reason: str, retry_after: float | None = None) -> Intent:
        """Record that the send of ``lease``'s attempt took nothing (``reason``: why). ``retry_after``: the
        seconds the platform asked to wait before the request comes again (``NotSent.retry_after``), kept in
        the move's history row as whole seconds, rounded up (``detail["retry_after"]``); the sweeper does not
        re-queue the intent before then (:meth:`~atmostonce.runtime.Sweeper.retry_failed`). Raises
        ``Rejected`` (fencing guards), ``IntakeError`` for bad input (a negative, infinite or non-numeric
        ``retry_after``, or one over a year)."""
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        if retry_after is not None:
            args["retry_after"] = check_retry_after(retry_after)
        return self._move(EVENT.record_not_sent, lease.key, args)

    def record_unknown(self, lease: Lease, *, reason: str) -> Intent:
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        return self._move(EVENT.record_unknown, lease.key, args)

    # -- late outcomes (docs/design.md#late-outcomes-are-evidence) ---------------------------------
    def record_late_outcome(
        self,
        lease: Lease,
        *,
        outcome: str,
        refused: Rejected,
        remote_id: str | None = None,
        response_digest: str | None = None,
        reason: str | None = None,
        worker_time: float | None = None,
    ) -> Evidence:
        """Keep the outcome of a send whose move was refused (``refused``: the refusal the store raised)
        as evidence on the attempt ``lease`` names. It moves no state and closes nothing: an unknown
        send stays unknown, and the reconciler may use a recorded ``remote_id`` for its one read-back.

        ``outcome`` is one of the table's late outcomes (``Table.late_outcomes``: ``send.success``,
        ``send.not_sent``, ``send.unknown``, ``read_back.*``); ``send.success`` needs ``remote_id``.
        ``worker_time`` is the worker's wall clock in seconds (context only; the store stamps its own
        clock as ``recorded_at``). Returns the appended :class:`Evidence`.

        Raises ``IntakeError`` for bad input or an outcome that is not a late outcome,
        ``UnknownIntent`` (guard ``attempt_exists``) when the lease names no attempt of its intent
        with that token and generation; writes nothing then.
        """
        args = _lease_args(lease)
        if outcome not in self.table.late_outcomes:
            raise IntakeError(f"{outcome!r} is not a late outcome; one of {self.table.late_outcomes}")
        if not isinstance(refused, Rejected) or refused.key != lease.key:
            raise IntakeError("refused must be the Rejected the store raised for this lease's intent")
        if outcome == OUTCOME.send_success and remote_id is None:
            raise IntakeError("a late send.success carries the platform's remote id")
        if worker_time is not None and (
            isinstance(worker_time, bool) or not isinstance(worker_time, (int, float)) or worker_time != worker_time
        ):
            raise IntakeError(f"worker_time must be seconds since the epoch, got {worker_time!r}")
        args |= {
            "key": check_text("key", lease.key, max_chars=256),
            "outcome": outcome,
            "refused_event": check_text("refused event", refused.event, max_chars=128),
            "refused_by": check_text("refusing guard", refused.guard, max_chars=128),
            "remote_id": _optional_text("remote_id", remote_id),
            "response_digest": _optional_text("response_digest", response_digest),
            "reason": _optional_text("reason", reason),
            "worker_time": None if worker_time is None else float(worker_time),
        }
        return self.core._record_evidence(args)

    # -- sweeper --------------------------------------------------------------------------
    def expire_lease(self, intent: Intent) -> Intent:
        """Post-authorization lease expired: to ``indeterminate``; moves only the row as planned."""
        args = _stale_args(intent)
        return self._move(EVENT.expire_lease, intent.key, args)

    def abandon_attempt(self, intent: Intent) -> Intent:
        """Pre-authorization lease expired: close the attempt as abandoned; intent stays ``pending``."""
        args = _stale_args(intent)
        return self._move(EVENT.abandon_attempt, intent.key, args)

    def expire_leases(self, moves: Iterable[tuple[str, Intent]]) -> list[Intent | Rejected]:
        """The sweeper's moves for a batch of due leases, one conditional write per event for the whole batch
        (docs/design.md#the-sweeper-moves-a-batch-per-statement). ``moves``: ``(event, intent)`` pairs, the event
        one of the table's ``sweeper`` moves (``expire_lease``, ``abandon_attempt``) and the intent the snapshot
        ``due_leases`` listed; each is checked as :meth:`expire_lease` checks it (source state, ``lease_holder``
        on the snapshot's token and generation, ``lease_expired``) and written as it writes it (history row,
        attempt outcome, reconciliation record, the claim's move of an approval-gated intent).

        Returns one result per pair, in order: the moved :class:`Intent`, or the :class:`Rejected` naming what
        refused that one (a fencing refusal is recorded); a refusal moves nothing and leaves the rest of the
        batch as it would be without it. A key given twice is moved at most once: its second move is refused
        as one made after the first. Raises ``IntakeError`` (writing nothing) for an event the sweeper does not
        make or a snapshot that is not an ``Intent``."""
        sweeper = {e.name for e in self.table.events.values() if e.actor == self.table.names.actor.sweeper}
        batch: list[tuple[str, str, Mapping[str, Any]]] = []
        for pair in moves:
            if not (isinstance(pair, tuple) and len(pair) == 2):
                raise IntakeError(
                    f"expected (event, intent) pairs, got {pair!r}", field="moves", code=IntakeCode.WRONG_TYPE
                )
            event, intent = pair
            if event not in sweeper:
                raise IntakeError(f"{event!r} is not a sweeper move; one of {sorted(sweeper)}", field="moves")
            args = _stale_args(intent)
            batch.append((event, check_text("key", intent.key, max_chars=256), args))
        return self._batch(batch)

    # -- reconciler -----------------------------------------------------------------------
    def _reconciler_args(self, event: str, plan: Plan, kw: Mapping[str, Any]) -> dict[str, Any]:
        """What the reconciler's move ``event`` presents for ``plan`` and its keywords (``remote_id`` for
        ``reconcile_found``, ``fenced`` for ``reconcile_absent``, ``reason`` for ``park_unreconcilable``)."""
        args = _plan_args(plan)
        if event == EVENT.reconcile_found:
            return args | {"remote_id": _need_text("remote_id", kw.get("remote_id")), "result": "confirmed"}
        if event == EVENT.reconcile_absent:
            return args | {"fenced": bool(kw.get("fenced")), "result": "failed"}
        if event == EVENT.park_unreconcilable:
            return args | {"reason": _need_text("reason", kw.get("reason")), "result": "unknown"}
        return args | {"result": "unknown"}  # reconcile_not_found, reconcile_unproven: the send stays unknown

    def _reconcile(self, event: str, plan: Plan, kw: Mapping[str, Any]) -> Intent:
        args = self._reconciler_args(event, plan, kw)  # the plan is checked before its key is read
        return self._move(event, plan.key, args)

    def reconcile_found(self, plan: Plan, *, remote_id: str) -> Intent:
        return self._reconcile(EVENT.reconcile_found, plan, {"remote_id": remote_id})

    def reconcile_not_found(self, plan: Plan) -> Intent:
        return self._reconcile(EVENT.reconcile_not_found, plan, {})

    def reconcile_unproven(self, plan: Plan) -> Intent:
        """A fenced lookup found nothing, but absence is not provable (an attempt begun before a
        restore): stays ``indeterminate``, counts a look, and moves the fence epoch on, because the
        platform now refuses the looked-up key (docs/design.md#a-fence-is-a-tombstone)."""
        return self._reconcile(EVENT.reconcile_unproven, plan, {})

    def reconcile_absent(self, plan: Plan, *, fenced: bool) -> Intent:
        return self._reconcile(EVENT.reconcile_absent, plan, {"fenced": fenced})

    def park_unreconcilable(self, plan: Plan, *, reason: str) -> Intent:
        return self._reconcile(EVENT.park_unreconcilable, plan, {"reason": reason})

    def reconcile_many(self, moves: Iterable[tuple[str, Plan, Mapping[str, Any]]]) -> list[Intent | Rejected]:
        """The reconciler's moves for a batch of lookups, one conditional write per event for the whole batch
        (docs/design.md#the-reconciler-records-a-batch-per-statement). ``moves``: ``(event, plan, keywords)``
        triples, the event one of the table's ``reconciler`` moves, ``plan`` the ``Intent.plan`` the lookup
        was made for and ``keywords`` what that move's method takes (``{"remote_id": ...}`` for
        ``reconcile_found``, ``{"fenced": True}`` for ``reconcile_absent``, ``{"reason": ...}`` for
        ``park_unreconcilable``, ``{}`` otherwise). Each is checked and written as its single method does it
        (``plan_unchanged`` and the event's other guards, history row, reconciliation record).

        Returns one result per triple, in order: the moved :class:`Intent`, or the :class:`Rejected` naming
        what refused that one (a fencing refusal is recorded); a refusal leaves the rest of the batch as it
        would be without it. Raises ``IntakeError`` (writing nothing) for an event the reconciler does not
        make or bad keywords."""
        reconciler = {e.name for e in self.table.events.values() if e.actor == self.table.names.actor.reconciler}
        batch: list[tuple[str, str, Mapping[str, Any]]] = []
        for move in moves:
            if not (isinstance(move, tuple) and len(move) == 3 and isinstance(move[2], Mapping)):
                raise IntakeError(
                    f"expected (event, plan, keywords) triples, got {move!r}", field="moves", code=IntakeCode.WRONG_TYPE
                )
            event, plan, kw = move
            if event not in reconciler:
                raise IntakeError(f"{event!r} is not a reconciler move; one of {sorted(reconciler)}", field="moves")
            args = self._reconciler_args(event, plan, kw)
            batch.append((event, check_text("key", plan.key, max_chars=256), args))
        return self._batch(batch)

    # -- retry policy ---------------------------------------------------------------------
    def retry(self, key: str, *, operator: str | None = None) -> Intent:
        """``failed`` back to ``pending``; creates no attempt (the next ``begin`` does). ``operator``: the
        person who asked for it (console, CLI), kept as the history row's actor and detail; ``None`` for the
        worker's retry policy. The table's ``retry`` has no ``operator_identified`` guard, so a named but
        blank operator is refused here, at intake (``IntakeError``)."""
        if operator is None:
            return self._move(EVENT.retry, key, {})
        return self._move(EVENT.retry, key, {"operator": _policy_operator(operator)})

    def exhaust(self, key: str) -> Intent:
        """Attempt cap reached: park instead of looping."""
        return self._move(EVENT.exhaust, key, {})

    # -- operator -------------------------------------------------------------------------
    def park(self, key: str, *, operator: str, reason: str = "operator stop") -> Intent:
        return self._move(EVENT.park, key, {"operator": _operator(operator), "reason": _need_text("reason", reason)})

    def resolve_published(
        self, key: str, *, operator: str, remote_id: str, evidence: Mapping[str, Any] | None = None
    ) -> Intent:
        """A person found the object ``remote_id`` on the platform. ``evidence`` (a JSON object) says how
        they know, kept in the move's history row: the read-back that verified it
        (``atmostonce.runtime.verify_remote_object``) or ``{"verified": false, ...}`` for an id the operator
        asserts without a read-back."""
        args: dict[str, Any] = {"operator": _operator(operator), "remote_id": _need_text("remote_id", remote_id)}
        if evidence is not None:
            args["evidence"] = check_json_object("evidence", evidence)
        return self._move(EVENT.resolve_published, key, args)

    def resolve_not_sent(
        self, key: str, *, operator: str, reason: str = "operator: not sent", plan: Plan | None = None
    ) -> Intent:
        """A person says the parked intent ``key`` was not sent: ``failed``, with one more attempt granted.
        ``plan``: as :meth:`resend`'s. Raises :class:`Rejected` (``plan_unchanged`` among the table's guards)."""
        args = {"operator": _operator(operator), "reason": _need_text("reason", reason)}
        return self._move(EVENT.resolve_not_sent, key, args | self._person_plan(key, plan))

    def resend(self, key: str, *, operator: str, plan: Plan | None = None) -> Intent:
        """A person sends the parked intent ``key`` again: ``pending`` under a new resend epoch.

        ``plan``: the ``Intent.plan`` of the read the person decided on (what they looked up on the platform and
        in the store was for that read); the move is refused (``plan_unchanged``) if the intent has had another
        attempt or lookup since, or a restore came between (docs/design.md#a-lookup-must-answer-for-its-key).
        ``None``: the plan of the intent as this call reads it, just before its conditional write, for a caller
        that looked at nothing first (another move between that read and the write refuses it all the same:
        ``plan_unchanged``, recorded; call again).
        Raises :class:`Rejected` naming the guard that refused; ``IntakeError`` for a ``plan`` of another key."""
        return self._move(EVENT.resend, key, {"operator": _operator(operator)} | self._person_plan(key, plan))

    def _person_plan(self, key: str, plan: Plan | None) -> dict[str, Any]:
        if plan is None:
            found = self.core.find(check_text("key", key, max_chars=256))
            return {} if found is None else _plan_args(found.plan)  # an unknown key: refused by the move
        if isinstance(plan, Plan) and plan.key != key:
            raise IntakeError(f"the plan is for {plan.key!r}, not {key!r}", field="plan")
        return _plan_args(plan)

    # -- policy layer and restores ------------------------------------------------------------
    # Every setter writes the policy and its row of the policy log in one transaction
    # (docs/design.md#policy-changes-are-on-the-record). ``operator`` names the person; it is required
    # where only a person acts (kill switch, text window) and optional (``None``: a program named no one)
    # on the setters programs and test harnesses call; the CLI and the console always pass one.
    def set_kill_switch(self, scope: str, engaged: bool, *, operator: str) -> None:
        """Engage or release a kill switch; ``scope`` is ``"global"`` or ``"account:<id>"`` (docs/design.md#the-gate-is-the-conditional-write)."""
        who = _policy_operator(operator)
        if scope != "global" and not (isinstance(scope, str) and scope.startswith("account:") and len(scope) > 8):
            raise IntakeError(f"kill switch scope must be 'global' or 'account:<id>', got {scope!r}", field="scope")
        self.core._write_policy("kill_switches", check_text("scope", scope), bool(engaged), who)

    def set_rate_limit(
        self, account: str, max_sends: int | None, *, window_seconds: float = 60.0, operator: str | None = None
    ) -> None:
        """At most ``max_sends`` authorized sends for ``account`` per window of ``window_seconds`` (database
        clock; a fixed window that starts at its first send); ``None`` removes the limit. Every path that
        sends reads it: the worker before it begins, the before-byte gate (``rate_limit_clear``) in its one
        conditional write, so a raised cap releases a backlog at the configured rate, not at once
        (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract). Changing the limit keeps the current window's count. Raises ``IntakeError``."""
        check_text("account", account)
        who = _optional_operator(operator)
        if max_sends is not None:
            max_sends = _positive(max_sends, "max_sends")
        secs = validate_lease_seconds("window_seconds", window_seconds)
        self.core._write_rate_limit(account, max_sends, secs, who)

    def set_text_window(self, seconds: float, *, operator: str) -> None:
        """The duplicate-text window (seconds, finite, > 0, at most a year): how far apart two authorized
        sends of the same normalized text on the same account must be. The ``text_window_clear`` guard reads
        the stored value in its conditional write; until one is stored, the store's configured default
        (``text_window_seconds=`` of its constructor, 86400 s). Raises ``IntakeError``."""
        who = _policy_operator(operator)
        secs = validate_lease_seconds("text window seconds", seconds)
        self.core._write_policy("text_window_seconds", "global", secs, who)

    def set_credential_version(self, account: str, version: str | None, *, operator: str | None = None) -> None:
        """The account's current credential version (``None``: no check for this account)."""
        name, who = check_text("account", account), _optional_operator(operator)
        self.core._write_policy("credentials", name, _optional_text("version", version), who)

    def set_contract_version(self, platform: str, version: str | None, *, operator: str | None = None) -> None:
        """The platform contract version workers must have prepared for (``None``: no check)."""
        name, who = check_text("platform", platform), _optional_operator(operator)
        self.core._write_policy("contracts", name, _optional_text("version", version), who)

    def declare_restore(self, *, operator: str) -> tuple[int, int]:
        """After restoring the database from a backup: move every store sequence past the data it
        holds, bump the restore epoch, so every lease issued before is fenced off, and move every intent
        that may have been sent after the backup (queued, in flight, failed) to ``indeterminate`` for
        reconciliation (docs/design.md#fencing-that-survives-a-restore), all in one transaction: all of it or none (docs/design.md,
        "Declaring a restore is atomic").

        Returns ``(new epoch, intents fenced)``. Raises ``IntakeError`` without a named operator,
        ``StoreError`` when the store fails (nothing is then changed).
        """
        who = check_text("operator", operator, max_chars=256)
        return self.core._declare_restore(who)


def _positive(v: Any, name: str) -> int:
    message = f"{name} must be a positive integer, got {v!r}"
    if isinstance(v, bool) or not isinstance(v, int):
        raise IntakeError(message, field=name, code=IntakeCode.NOT_INTEGER)
    if not 0 < v <= 10**9:
        raise IntakeError(message, field=name, code=IntakeCode.OUT_OF_RANGE, limit=1 if v < 1 else 10**9)
    return v


def policy_log_row(kind: str, value: Any) -> tuple[str, Any]:
    """A policy write's ``(kind, value)`` as its policy-log row holds them: the kind is the policy's key in
    ``policies()``, a switch (kill switch, signing) is logged as its new boolean."""
    if kind == "signing_policies":
        return "signing", bool(value)
    if kind == "kill_switches":
        return kind, bool(value)
    return kind, value


def _policy_operator(v: Any) -> str:
    """The person who changes a policy: a name every store can persist, not blank; else ``IntakeError``."""
    return check_text("operator", v, max_chars=256)


def _optional_operator(v: Any) -> str | None:
    return None if v is None else _policy_operator(v)


def _operator(v: Any) -> str:
    """An operator name every store can persist; a blank one (any Unicode whitespace) becomes ``""`` and is
    left for the ``operator_identified`` guard, so every store refuses it alike."""
    return person_name("operator", v)


def _stale_args(intent: Intent) -> dict[str, Any]:
    if not isinstance(intent, Intent):
        raise IntakeError(
            f"expected an Intent snapshot, got {type(intent).__name__}", field="intent", code=IntakeCode.WRONG_TYPE
        )
    return {
        "attempt_token": None if intent.attempt_token is None else check_text("attempt token", intent.attempt_token),
        "generation": _int("generation", intent.generation, optional=True),
    }
