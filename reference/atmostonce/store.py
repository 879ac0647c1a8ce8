"""The store protocol: one operation set, implemented by the in-memory model and the SQL stores.

Every transition method maps to one table event and is carried out by the
implementation's ``_apply(event, key, args)``: look the event up in the table,
check the source state and the event's named guards, and either make the
move atomically or raise a :class:`~atmostonce.errors.Rejected` naming what
refused, leaving everything unchanged (seed 004, "The state machine").

:class:`Operations` gives every implementation the same public signatures, so
the model and the stores cannot drift in what they accept.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

from . import identity
from .claims import ClaimOperations, claim_args
from .errors import GuardRefused, IntakeError, Rejected
from .records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_PAYLOAD_BYTES,
    DEFAULT_MAX_RECONCILES,
    Attempt,
    ClaimLease,
    HistoryEntry,
    Intent,
    Lease,
    Plan,
    Reconciliation,
    Refusal,
    SourceCapture,
    Submission,
    check_json_object,
    check_text,
    person_name,
    prepare_submission,
    validate_lease_seconds,
)
from .table import Table

__all__ = ["FENCING_GUARDS", "RETRACTION_PREFIX", "Operations", "Store", "retraction_of"]

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


FENCING_GUARDS = ("lease_holder", "restore_epoch_current", "plan_unchanged")
"""Guards whose refusals are recorded: they catch a worker or maintenance pass acting on a stale view."""
_PRESENTED = ("attempt_token", "generation", "epoch", "plan_generation", "plan_reconcile_count", "plan_epoch")


def _need_text(name: str, v: Any) -> str:
    return check_text(name, v)


def _optional_text(name: str, v: Any) -> str | None:
    return None if v is None else check_text(name, v)


def _int(name: str, v: Any, optional: bool = False) -> int | None:
    if v is None and optional:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not -(2**63) <= v < 2**63:
        raise IntakeError(f"{name} must be a 64-bit integer, got {v!r}")
    return v


def _lease_args(lease: Lease) -> dict[str, Any]:
    if not isinstance(lease, Lease):
        raise IntakeError(f"expected a Lease from begin(), got {type(lease).__name__}")
    return {
        "attempt_token": check_text("attempt token", lease.attempt_token, max_chars=128),
        "generation": _int("generation", lease.generation),
        "epoch": _int("epoch", lease.epoch),
    }


def _plan_args(plan: Plan) -> dict[str, Any]:
    if not isinstance(plan, Plan):
        raise IntakeError(f"expected a Plan (Intent.plan), got {type(plan).__name__}")
    return {
        "plan_generation": _int("plan generation", plan.generation, optional=True),
        "plan_reconcile_count": _int("plan reconcile count", plan.reconcile_count),
        "plan_epoch": _int("plan epoch", plan.epoch, optional=True),
    }


class Operations(ClaimOperations):
    """Public operations shared by every store. Subclasses provide the primitives below."""

    table: Table
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    # -- primitives each store implements -------------------------------------------------
    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:  # pragma: no cover
        raise NotImplementedError

    def _create(self, sub: Submission) -> tuple[Intent, bool]:  # pragma: no cover
        raise NotImplementedError

    def _move(self, event: str, key: Any, args: Mapping[str, Any]) -> Intent:
        """Validate the key, then hand the move to the store's ``_apply``; a write refused by a
        fencing guard (a stale token, generation, epoch or plan) is recorded, not silent (seed 003)."""
        key = check_text("key", key, max_chars=256)
        try:
            return self._apply(event, key, args)
        except GuardRefused as exc:
            if exc.guard in FENCING_GUARDS:
                self._record_refusal(exc, {k: args[k] for k in _PRESENTED if k in args})
            raise

    def _record_refusal(self, exc: GuardRefused, presented: Mapping[str, Any]) -> None:  # pragma: no cover
        raise NotImplementedError

    def reconciliation_results(self, key: str) -> dict[int, Reconciliation]:
        """The current reconciliation record of each of the intent's sends, by ``send_seq`` (the
        history ``seq`` of the move that made that send's outcome unknown): its newest row."""
        from .audit import current_reconciliations

        return current_reconciliations(self.reconciliations(key))  # type: ignore[attr-defined]

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
        and its target's dispatch claim (:meth:`approve`, :meth:`reserve_claim`; seeds 001-002).

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
        it, created = self._create(sub)
        if not created and it.requires_approval != sub.requires_approval:
            raise IntakeError(
                f"this delivery exists already with requires_approval={it.requires_approval}; "
                "an approval requirement cannot be added to or dropped from an intent"
            )
        return it

    def _check_retraction(self, sub: Submission) -> None:
        """A retraction names a published intent of the same account and target, its recorded remote id,
        and a mode that matches its action kind; anything else is refused before it is stored."""
        r = retraction_of(sub.request)
        mode = sub.action_kind[len(RETRACTION_PREFIX) :]
        if r is None or r["mode"] != mode:
            raise IntakeError("a retract.* intent needs a request made by submit_retraction")
        orig = self.find(r["retracts"])  # type: ignore[attr-defined]
        if (
            orig is None
            or orig.action_kind.startswith(RETRACTION_PREFIX)
            or self.table.states[orig.state].disposition != "done"
            or orig.remote_id is None
            or orig.remote_id != r.get("remote_id")
            or (orig.account, orig.target) != (sub.account, sub.target)
        ):
            raise IntakeError("a retraction must name a published intent of this account and target and its remote id")
        if mode == "correct" and not isinstance(r.get("correction"), Mapping):
            raise IntakeError("a correction needs a 'correction' object")

    def submit_retraction(
        self, key: str, *, correction: Mapping[str, Any] | None = None, max_attempts: int = DEFAULT_MAX_ATTEMPTS
    ) -> Intent:
        """A retraction of published intent ``key``: its own delivery intent against the recorded remote
        object id (seed 001: local status never undoes a remote effect). Without ``correction`` it
        deletes the object; with it, it replaces the object's body by ``correction`` (a JSON object).
        It is dispatched, read back and reconciled like any intent: a deletion is confirmed when
        read-back finds no object, a correction when the object equals the corrected body. The
        original intent stays ``published``. Submitting the same retraction again returns the same
        intent. Raises ``IntakeError`` when ``key`` is not published with a remote id, or for bad input.
        """
        it = self.get(check_text("key", key, max_chars=256))  # type: ignore[attr-defined]
        if self.table.states[it.state].disposition != "done" or it.remote_id is None:
            raise IntakeError(f"only a published intent with a remote id can be retracted; {key[:12]} is {it.state}")
        if it.action_kind.startswith(RETRACTION_PREFIX):
            raise IntakeError("a retraction is not itself retracted; submit a correction of the original instead")
        mode = "delete" if correction is None else "correct"
        request: dict[str, Any] = {"retracts": it.key, "remote_id": it.remote_id, "mode": mode}
        if correction is not None:
            request["correction"] = check_json_object("correction", correction)
            deletion = {"retracts": it.key, "remote_id": it.remote_id, "mode": "delete"}
            done = self.find(identity.delivery_key(it.account, RETRACTION_PREFIX + "delete", it.target, deletion))  # type: ignore[attr-defined]
            if done is not None and self.table.states[done.state].disposition == "done":
                raise IntakeError(f"the object {it.remote_id} was already deleted by retraction {done.key[:12]}")
        # a correction sends new bytes: it needs the same approval gate as the intent it corrects
        return self.submit(
            it.account,
            RETRACTION_PREFIX + mode,
            it.target,
            request,
            max_attempts=max_attempts,
            requires_approval=it.requires_approval,
        )

    # -- sources (seed 004, "Recovery is the dangerous half") -----------------------------------
    def _store_capture(self, source_id: str, version: str, raw_hash: str | None) -> SourceCapture:  # pragma: no cover
        raise NotImplementedError

    def capture_source(self, source_id: str, body: str, *, raw: bytes | None = None) -> SourceCapture:
        """Record a fetch of a source. A new version is stored only when the normalized visible body
        changed; ``supersedes`` is whatever head the store holds (never a computed predecessor), so a
        skipped or failed earlier capture does not jam the chain. ``raw`` is hashed for forensics only.
        Raises ``IntakeError`` for bad input."""
        check_text("source id", source_id, max_chars=2048)
        if not isinstance(body, str):
            raise IntakeError("body must be the source's visible text (str)")
        try:
            version = identity.source_version(source_id, body)
        except identity.IdentityError as exc:
            raise IntakeError(str(exc)) from exc
        raw_hash = identity.raw_digest(raw) if isinstance(raw, (bytes, bytearray)) else None
        return self._store_capture(source_id, version, raw_hash)

    # -- worker ---------------------------------------------------------------------------
    def begin(self, key: str, *, lease_seconds: float = 30.0) -> Lease:
        """Open the intent's next attempt under a lease of ``lease_seconds`` (store clock).

        The only creator of attempts. Raises ``Rejected`` (no_open_attempt, attempts_remaining, ...).
        """
        secs = validate_lease_seconds("lease_seconds", lease_seconds)
        it = self._move("begin", key, {"lease_seconds": secs})
        assert it.attempt_token is not None and it.generation is not None and it.lease_expires_at is not None
        return Lease(it.key, it.attempt_token, it.generation, it.lease_expires_at, it.epoch or 0)

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
        """The last checkpoint before bytes (seed 004 M2): one conditional write, or nothing sends.

        Re-checks, in that one write, everything checked earlier: the lease (token, generation,
        restore epoch, deadline), the exact request digest, the kill switches, the account's
        credential version, the platform contract version, and the duplicate-text window; for an
        approval-gated intent also, in the same atomic step, the target claim ``claim`` (owner token,
        epoch, lease), its approval (live, binding this digest, account and target) and the target
        version, which it bumps (seed 001). Raises ``GuardRefused`` naming the first condition that failed; ``IntakeError`` for bad input.
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
        return self._move("authorize_dispatch", lease.key, args)

    def block_at_gate(self, lease: Lease, *, reason: str) -> Intent:
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        return self._move("block_at_gate", lease.key, args)

    def record_success(self, lease: Lease, *, remote_id: str, response_digest: str | None = None) -> Intent:
        args = _lease_args(lease) | {
            "remote_id": _need_text("remote_id", remote_id),
            "response_digest": response_digest,
        }
        return self._move("record_success", lease.key, args)

    def confirm_read_back(self, lease: Lease) -> Intent:
        args = _lease_args(lease)
        return self._move("confirm_read_back", lease.key, args)

    def read_back_failed(self, lease: Lease, *, reason: str) -> Intent:
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        return self._move("read_back_failed", lease.key, args)

    def record_not_sent(self, lease: Lease, *, reason: str) -> Intent:
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        return self._move("record_not_sent", lease.key, args)

    def record_unknown(self, lease: Lease, *, reason: str) -> Intent:
        args = _lease_args(lease) | {"reason": _need_text("reason", reason)}
        return self._move("record_unknown", lease.key, args)

    # -- sweeper --------------------------------------------------------------------------
    def expire_lease(self, intent: Intent) -> Intent:
        """Post-authorization lease expired: to ``indeterminate``; moves only the row as planned."""
        args = _stale_args(intent)
        return self._move("expire_lease", intent.key, args)

    def abandon_attempt(self, intent: Intent) -> Intent:
        """Pre-authorization lease expired: close the attempt as abandoned; intent stays ``pending``."""
        args = _stale_args(intent)
        return self._move("abandon_attempt", intent.key, args)

    # -- reconciler -----------------------------------------------------------------------
    def reconcile_found(self, plan: Plan, *, remote_id: str) -> Intent:
        args = _plan_args(plan) | {"remote_id": _need_text("remote_id", remote_id), "result": "confirmed"}
        return self._move("reconcile_found", plan.key, args)

    def reconcile_not_found(self, plan: Plan) -> Intent:
        args = _plan_args(plan) | {"result": "unknown"}
        return self._move("reconcile_not_found", plan.key, args)

    def reconcile_absent(self, plan: Plan, *, fenced: bool) -> Intent:
        args = _plan_args(plan) | {"fenced": fenced, "result": "failed"}
        return self._move("reconcile_absent", plan.key, args)

    def park_unreconcilable(self, plan: Plan, *, reason: str) -> Intent:
        args = _plan_args(plan) | {"reason": _need_text("reason", reason), "result": "unknown"}
        return self._move("park_unreconcilable", plan.key, args)

    # -- retry policy ---------------------------------------------------------------------
    def retry(self, key: str) -> Intent:
        """``failed`` back to ``pending``; creates no attempt (the next ``begin`` does)."""
        return self._move("retry", key, {})

    def exhaust(self, key: str) -> Intent:
        """Attempt cap reached: park instead of looping."""
        return self._move("exhaust", key, {})

    # -- operator -------------------------------------------------------------------------
    def park(self, key: str, *, operator: str, reason: str = "operator stop") -> Intent:
        return self._move("park", key, {"operator": _operator(operator), "reason": _need_text("reason", reason)})

    def resolve_published(self, key: str, *, operator: str, remote_id: str) -> Intent:
        args = {"operator": _operator(operator), "remote_id": _need_text("remote_id", remote_id)}
        return self._move("resolve_published", key, args)

    def resolve_not_sent(self, key: str, *, operator: str, reason: str = "operator: not sent") -> Intent:
        args = {"operator": _operator(operator), "reason": _need_text("reason", reason)}
        return self._move("resolve_not_sent", key, args)

    def resend(self, key: str, *, operator: str) -> Intent:
        return self._move("resend", key, {"operator": _operator(operator)})

    # -- policy layer and restores ------------------------------------------------------------
    def _write_policy(self, kind: str, name: str, value: Any) -> None:  # pragma: no cover
        raise NotImplementedError

    def _bump_epoch(self) -> int:  # pragma: no cover
        raise NotImplementedError

    def set_kill_switch(self, scope: str, engaged: bool, *, operator: str) -> None:
        """Engage or release a kill switch; ``scope`` is ``"global"`` or ``"account:<id>"`` (seed 004 M2)."""
        check_text("operator", operator)
        if scope != "global" and not (isinstance(scope, str) and scope.startswith("account:") and len(scope) > 8):
            raise IntakeError(f"kill switch scope must be 'global' or 'account:<id>', got {scope!r}")
        self._write_policy("kill_switches", check_text("scope", scope), bool(engaged))

    def _write_rate_limit(self, account: str, max_sends: int | None, window_seconds: float) -> None:  # pragma: no cover
        raise NotImplementedError

    def set_rate_limit(self, account: str, max_sends: int | None, *, window_seconds: float = 60.0) -> None:
        """At most ``max_sends`` authorized sends for ``account`` per window of ``window_seconds`` (database
        clock; a fixed window that starts at its first send); ``None`` removes the limit. Every path that
        sends reads it: the worker before it begins, the before-byte gate (``rate_limit_clear``) in its one
        conditional write, so a raised cap releases a backlog at the configured rate, not at once
        (seed 004, "Recovery"). Changing the limit keeps the current window's count. Raises ``IntakeError``."""
        check_text("account", account)
        if max_sends is not None:
            max_sends = _positive(max_sends, "max_sends")
        secs = validate_lease_seconds("window_seconds", window_seconds)
        self._write_rate_limit(account, max_sends, secs)

    def set_credential_version(self, account: str, version: str | None) -> None:
        """The account's current credential version (``None``: no check for this account)."""
        self._write_policy("credentials", check_text("account", account), _optional_text("version", version))

    def set_contract_version(self, platform: str, version: str | None) -> None:
        """The platform contract version workers must have prepared for (``None``: no check)."""
        self._write_policy("contracts", check_text("platform", platform), _optional_text("version", version))

    def declare_restore(self, *, operator: str) -> tuple[int, int]:
        """After restoring the database from a backup: bump the restore epoch, so every lease issued
        before is fenced off, and move every intent that may have been sent after the backup
        (queued, in flight, failed) to ``indeterminate`` for reconciliation (seed 004 M5).

        Returns ``(new epoch, intents fenced)``. Raises ``IntakeError`` without a named operator.
        """
        who = check_text("operator", operator, max_chars=256)
        epoch = self._bump_epoch()
        fenced = 0
        for state in self.table.event("restore_fence").sources:
            while True:
                batch = self.list_intents(state=state, limit=500)
                moved = 0
                for it in batch:
                    try:
                        self._move("restore_fence", it.key, {"operator": who, "reason": f"restore epoch {epoch}"})
                        moved += 1
                    except Rejected:
                        pass
                fenced += moved
                if not batch or moved == 0:
                    break
        return epoch, fenced


def _positive(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not 0 < v <= 10**9:
        raise IntakeError(f"{name} must be a positive integer, got {v!r}")
    return v


def _operator(v: Any) -> str:
    """An operator name every store can persist; a blank one (any Unicode whitespace) becomes ``""`` and is
    left for the ``operator_identified`` guard, so every store refuses it alike."""
    return person_name("operator", v)


def _stale_args(intent: Intent) -> dict[str, Any]:
    if not isinstance(intent, Intent):
        raise IntakeError(f"expected an Intent snapshot, got {type(intent).__name__}")
    return {
        "attempt_token": None if intent.attempt_token is None else check_text("attempt token", intent.attempt_token),
        "generation": _int("generation", intent.generation, optional=True),
    }


@runtime_checkable
class Store(Protocol):
    """What the runtime, CLI and conformance suite need from a store (model or SQL)."""

    table: Table

    def submit(self, account: str, action_kind: str, target: str, request: Mapping[str, Any], **kw: Any) -> Intent: ...
    def begin(self, key: str, *, lease_seconds: float = 30.0) -> Lease: ...
    def authorize_dispatch(self, lease: Lease, *, request_digest: str, **kw: Any) -> Intent: ...
    def record_success(self, lease: Lease, *, remote_id: str, response_digest: str | None = None) -> Intent: ...
    def confirm_read_back(self, lease: Lease) -> Intent: ...
    def read_back_failed(self, lease: Lease, *, reason: str) -> Intent: ...
    def record_not_sent(self, lease: Lease, *, reason: str) -> Intent: ...
    def record_unknown(self, lease: Lease, *, reason: str) -> Intent: ...
    def expire_lease(self, intent: Intent) -> Intent: ...
    def abandon_attempt(self, intent: Intent) -> Intent: ...
    def reconcile_found(self, plan: Plan, *, remote_id: str) -> Intent: ...
    def reconcile_not_found(self, plan: Plan) -> Intent: ...
    def reconcile_absent(self, plan: Plan, *, fenced: bool) -> Intent: ...
    def park_unreconcilable(self, plan: Plan, *, reason: str) -> Intent: ...
    def retry(self, key: str) -> Intent: ...
    def exhaust(self, key: str) -> Intent: ...
    def park(self, key: str, *, operator: str, reason: str = ...) -> Intent: ...
    def resolve_published(self, key: str, *, operator: str, remote_id: str) -> Intent: ...
    def resolve_not_sent(self, key: str, *, operator: str, reason: str = ...) -> Intent: ...
    def resend(self, key: str, *, operator: str) -> Intent: ...

    def get(self, key: str) -> Intent: ...
    def find(self, key: str) -> Intent | None: ...
    def list_intents(self, state: str | None = None, limit: int = 1000) -> list[Intent]: ...
    def count_by_state(self) -> dict[str, int]: ...
    def history(self, key: str) -> list[HistoryEntry]: ...
    def attempts(self, key: str) -> list[Attempt]: ...
    def reconciliations(self, key: str) -> list[Reconciliation]: ...
    def refusals(self, key: str) -> list[Refusal]: ...
    def due_leases(self, limit: int = 100) -> list[Intent]: ...
    def claimable(self, limit: int = 100) -> list[str]: ...
    def kill_switch_engaged(self, account: str) -> bool: ...
    def rate_limited(self, account: str) -> bool: ...
    def set_rate_limit(self, account: str, max_sends: int | None, *, window_seconds: float = ...) -> None: ...
    def current_epoch(self) -> int: ...
    def set_kill_switch(self, scope: str, engaged: bool, *, operator: str) -> None: ...
    def set_credential_version(self, account: str, version: str | None) -> None: ...
    def set_contract_version(self, platform: str, version: str | None) -> None: ...
    def declare_restore(self, *, operator: str) -> tuple[int, int]: ...
    def capture_source(self, source_id: str, body: str, *, raw: bytes | None = None) -> SourceCapture: ...
    def source_head(self, source_id: str) -> str | None: ...
    def now(self) -> float: ...
    def close(self) -> None: ...
