"""Approvals bound to exact bytes and per-target dispatch claims (docs/design.md#approvals-and-per-target-dispatch-claims).

Two auxiliary machines sit beside the intent table: ``spec/approval.toml`` (one row per approval)
and ``spec/claim.toml`` (one row per target). Their states, events and guards come from those
files alone; this module holds

* the model predicates of both guard catalogues (:data:`APPROVAL_GUARDS`, :data:`CLAIM_GUARDS`),
  each ``(row, args, now, world) -> bool`` like :mod:`atmostonce.guards`;
* :class:`ClaimOperations`, the public operations every store shares (approve, reserve, release,
  expire, withdraw, reads), so the model and the SQL stores accept the same input;
* :class:`MemoryClaims`, the in-memory engine the reference model mixes in.

An intent submitted with ``requires_approval=True`` is dispatched only under its target's claim:
intent events name a claim event in ``couples`` and the store makes both moves (and the approval's,
when the claim event couples one) in one atomic step, or neither. Parallel drafting stays allowed:
any number of pending intents and approvals may exist for one target; only dispatch is serialized.

Errors: :class:`~atmostonce.errors.GuardRefused` / :class:`~atmostonce.errors.IllegalMove` naming
the refusing guard (of whichever machine refused), :class:`~atmostonce.errors.UnknownIntent` for
an unknown key, approval or target, :class:`~atmostonce.errors.IntakeError` for bad input.
"""

from __future__ import annotations

import copy
import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from .errors import (
    INTENT_EXISTS,
    SOURCE_STATE,
    GuardRefused,
    IllegalMove,
    IntakeCode,
    IntakeError,
    Rejected,
    UnknownIntent,
)
from .names import APPROVAL_EVENT, CLAIM_EVENT, CLAIM_GUARD
from .protocols import StoreCore
from .records import (
    Approval,
    Claim,
    ClaimEntry,
    ClaimLease,
    OperatorKey,
    Refusal,
    check_limit,
    check_text,
    person_name,
    validate_lease_seconds,
)
from .signing import SIGNED_FIELDS, SignedApproval, key_id, parse_public_key, verify_approval
from .table import Event, Table, machine

__all__ = [
    "APPROVAL_GUARDS",
    "CLAIM_GUARDS",
    "claim_superseding_move",
    "ClaimOperations",
    "MemoryClaims",
    "settled_states",
]

DETAIL_FIELDS = ("owner", "operator", "approver", "reason", "sig_key_id", "sig_signature")
"""Arguments a claim-history row keeps in its detail: who moved it, why, and (a send under a signed
approval) the key id and signature the authorization relied on."""


RESERVE_OR_REPLACE = "<reserve or replace>"
"""What ``reserve_claim`` asks of an engine: ``replace`` when the claim (read under the move's lock) sits in
one of ``replace``'s source states, else ``reserve``."""


CoupledMove = tuple[str, str, str, dict[str, Any], dict[str, Any], dict[str, Any]]
"""One auxiliary move an intent move carries: ``(machine, subject, event, old_row, new_row, args)``."""


def pick_reserve_event(t: Table, state: str | None) -> str:
    return (
        CLAIM_EVENT.replace
        if state is not None and state in t.event(CLAIM_EVENT.replace).sources
        else CLAIM_EVENT.reserve
    )


def claim_refusal_recorded(exc: Rejected, args: Mapping[str, Any]) -> bool:
    """Whether a refused claim move is a stale claim lease's, which is recorded with who presented what, not
    silent (docs/design.md#refusals-are-recorded): the caller presented a claim lease and a ``fencing`` guard of ``spec/claim.toml`` refused
    (a stale epoch or token, a claim bound to another intent), or the claim has moved past where the lease was
    valid (:data:`~atmostonce.errors.SOURCE_STATE`)."""
    return bool(args.get("claim_token")) and (exc.guard in machine("claim").fencing_guards or exc.guard == SOURCE_STATE)


def claim_superseding_move(moves: Sequence[tuple[int, int | None]], epoch: Any) -> int | None:
    """The ``seq`` of the claim move that superseded a refused claim lease of ``epoch``, or ``None``.

    ``moves`` are the target's claim moves as ``(seq, epoch)`` in sequence order. The supersession is
    the move that created the first epoch after the presented one (a ``replace`` or a later
    ``reserve``); while the presented epoch is still the claim's, the first move after the one that
    opened it (the claim moved past the reservation the lease was for). ``None`` when nothing
    superseded it (a forged token on a live reservation). Not the newest move (docs/design.md,
    "Approvals and per-target dispatch claims")."""
    if not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    newer = [seq for seq, e in moves if e is not None and e > epoch]
    if newer:
        return newer[0]
    same = [seq for seq, e in moves if e == epoch]
    return same[1] if len(same) > 1 else None


def settled_states(t: Table) -> tuple[str, ...]:
    """The intent states that settle a send: the object exists (``published``) or the platform or a person
    proved nothing was sent (``failed``)."""
    return (t.names.state.published, t.names.state.failed)


def _named(v: Any) -> bool:
    return isinstance(v, str) and v.strip() != ""


# ------------------------------------------------------------------ approval guards (spec/approval.toml)
class ClaimWorld(Protocol):
    """What the approval and claim guards read besides the row (the model: :class:`MemoryClaims`'s store)."""

    @property
    def table(self) -> Table: ...
    @property
    def approval_table(self) -> Table: ...
    @property
    def signing_policies(self) -> Mapping[str, bool]: ...
    @property
    def operator_keys(self) -> Mapping[str, Mapping[str, Any]]: ...


def approver_identified(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return _named(args.get("approver"))


def intent_awaiting_approval(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    """``args["intent"]``: the intent row being approved; it must sit in the intent table's initial state."""
    it = args.get("intent")
    return it is not None and it["state"] == world.table.initial


def approval_covers_intent_bytes(
    row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld
) -> bool:
    """The digest being approved (``row``: the approval as it would be written) is the intent's own."""
    it = args.get("intent")
    return it is not None and row["request_digest"] == it["request_digest"]


def approval_deadline_passed(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return row["expires_at"] <= now  # type: ignore[no-any-return]  # a row column is Any


def withdrawer_identified(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return _named(args.get("operator"))


def withdrawal_attributable(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    """The approver withdraws their own approval, or another operator states why (docs/design.md#withdrawing-an-approval)."""
    return args.get("operator") == row["approver"] or _named(args.get("reason"))


APPROVAL_GUARDS: dict[str, Callable[..., bool]] = {
    f.__name__: f
    for f in (
        approver_identified,
        intent_awaiting_approval,
        approval_covers_intent_bytes,
        approval_deadline_passed,
        withdrawer_identified,
        withdrawal_attributable,
    )
}


# ------------------------------------------------------------------ claim guards (spec/claim.toml)
# ``args["intent"]`` is the intent row the move is for (after the intent's own move, when coupled);
# ``args["approval"]`` the presented approval's row, or None.
def intent_queued(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    it = args.get("intent")
    return it is not None and it["state"] == world.table.initial


def approval_usable(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    a = args.get("approval")
    return a is not None and a["state"] == world.approval_table.initial and a["expires_at"] > now


def approval_binds_request(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    """The approval's bytes, account and target: the digest presented, the intent's own (not whose
    draft it was: two intents with the same bytes pass alike, which ``approval_for_intent`` tells apart)."""
    a, it = args.get("approval"), args.get("intent")
    return (
        a is not None
        and it is not None
        and a["request_digest"] == args.get("request_digest")
        and a["request_digest"] == it["request_digest"]
        and a["account"] == it["account"]
        and a["target"] == it["target"] == row["target"]
    )


def approval_for_intent(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    """The approval was given for this intent's draft (its key), not for another one with the same bytes."""
    a = args.get("approval")
    return a is not None and a["key"] == args.get("key")


def approval_signature_verified(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    """Signing off for the approval's account, or the approval row is exactly the one the worker verified
    (``args["sig_*"]``, filled by :meth:`ClaimOperations.verified_signature_args`) and its key is registered
    to its approver (docs/design.md#signed-approvals)."""
    a = args.get("approval")
    if a is None:
        return False
    if not world.signing_policies.get(a["account"], False):
        return True
    k = world.operator_keys.get(a.get("signing_key_id")) if a.get("signing_key_id") else None
    return (
        k is not None
        and a.get("signature") is not None
        and k["operator"] == a["approver"]
        and args.get("sig_public_key") == k["public_key"]
        and args.get("sig_approval_id") == a["approval_id"]
        and args.get("sig_signature") == a["signature"]
        and args.get("sig_key_id") == a["signing_key_id"]
        and all(args.get(f"sig_{f}") == a[f] for f in SIGNED_FIELDS)
    )


def target_version_current(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    a = args.get("approval")
    return a is not None and a["target_version"] == row["target_version"]


def claim_owner(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return (
        row["owner_token"] is not None
        and row["owner_token"] == args.get("claim_token")
        and row["epoch"] == args.get("claim_epoch")
    )


def claim_lease_live(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return row["lease_expires_at"] is not None and row["lease_expires_at"] > now


def claim_lease_expired(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return row["lease_expires_at"] is not None and row["lease_expires_at"] <= now


def bound_to_intent(row: Mapping[str, Any], args: Mapping[str, Any], now: float, world: ClaimWorld) -> bool:
    return row["key"] is not None and row["key"] == args.get("key")


CLAIM_GUARDS: dict[str, Callable[..., bool]] = {
    f.__name__: f
    for f in (
        intent_queued,
        approval_usable,
        approval_binds_request,
        approval_for_intent,
        approval_signature_verified,
        target_version_current,
        claim_owner,
        claim_lease_live,
        claim_lease_expired,
        bound_to_intent,
    )
}


# ------------------------------------------------------------------ effects (spec/claim.toml, spec/approval.toml)
# ``(row, args, now)``: the moved copy of the claim or approval row, what the move presents (``args["intent"]``
# the intent row, as for the guards), the store clock; each sets the columns its effect names.
def take_claim(row: dict[str, Any], args: Mapping[str, Any], now: float) -> None:
    row["epoch"] += 1
    row["owner_token"] = args["new_token"]
    row["owner"] = args["owner"]
    row["key"] = args["key"]
    row["approval_id"] = args["approval_id"]
    row["lease_expires_at"] = now + args["claim_lease_seconds"]


def drop_claim(row: dict[str, Any], args: Mapping[str, Any], now: float) -> None:
    row.update(owner_token=None, owner=None, key=None, approval_id=None, lease_expires_at=None)


def bump_target_version(row: dict[str, Any], args: Mapping[str, Any], now: float) -> None:
    row["target_version"] += 1


def extend_claim_lease(row: dict[str, Any], args: Mapping[str, Any], now: float) -> None:
    row["lease_expires_at"] = args["intent"]["lease_expires_at"]  # the intent's send lease: both pass together


def mark_used(row: dict[str, Any], args: Mapping[str, Any], now: float) -> None:
    row["used_epoch"] = args.get("claim_epoch")


def record_approval(row: dict[str, Any], args: Mapping[str, Any], now: float) -> None:
    """The creating event's row is inserted by the store's ``_approve``; no move applies it to a row."""
    raise AssertionError("record_approval creates the approval row; no move applies it")  # pragma: no cover


CLAIM_EFFECTS: dict[str, Callable[[dict[str, Any], Mapping[str, Any], float], None]] = {
    f.__name__: f for f in (take_claim, drop_claim, bump_target_version, extend_claim_lease)
}
APPROVAL_EFFECTS: dict[str, Callable[[dict[str, Any], Mapping[str, Any], float], None]] = {
    f.__name__: f for f in (mark_used, record_approval)
}


def _claim_lease_args(lease: ClaimLease) -> dict[str, Any]:
    if not isinstance(lease, ClaimLease):
        raise IntakeError(
            f"expected a ClaimLease from reserve_claim(), got {type(lease).__name__}",
            field="lease",
            code=IntakeCode.WRONG_TYPE,
        )
    return {
        "claim_token": check_text("claim owner token", lease.owner_token, max_chars=128),
        "claim_epoch": _epoch(lease.epoch),
        "approval_id": check_text("approval id", lease.approval_id, max_chars=128),
        "owner": check_text("claim owner", lease.owner, max_chars=256),
        "key": check_text("key", lease.key, max_chars=256),
    }


def _epoch(v: Any) -> int:
    message = f"a claim epoch must be a non-negative 64-bit integer, got {v!r}"
    if isinstance(v, bool) or not isinstance(v, int):
        raise IntakeError(message, field="epoch", code=IntakeCode.NOT_INTEGER)
    if not 0 <= v < 2**63:
        raise IntakeError(message, field="epoch", code=IntakeCode.OUT_OF_RANGE, limit=0 if v < 0 else 2**63 - 1)
    return v


def claim_args(lease: ClaimLease | None) -> dict[str, Any]:
    """What an intent move carries for its coupled claim move (empty without a claim)."""
    return {} if lease is None else _claim_lease_args(lease)


class ClaimOperations:
    """Public approval and claim operations shared by every store, composed over the store's core
    (:class:`~atmostonce.protocols.StoreCore`: ``_approve``, ``_claim_move``, ``_approval_move``,
    ``_write_operator_key`` and the reads), as :class:`atmostonce.store.Operations` is."""

    table: Table
    core: StoreCore

    @property
    def approval_table(self) -> Table:
        """The approval machine (``spec/approval.toml``), read on first use, not at import."""
        return machine("approval")

    @property
    def claim_table(self) -> Table:
        """The per-target claim machine (``spec/claim.toml``), read on first use, not at import."""
        return machine("claim")

    def claim_log(self, target: str) -> list[ClaimEntry | Refusal]:
        """The target's whole claim log in store sequence order: every move of its claim and of the
        approvals for it (:class:`ClaimEntry`) interleaved with the refused stale claim writes
        (:class:`Refusal`, key ``claim:<target>``). Moves and refusals are numbered by one sequence,
        so a refusal sorts after the supersession it names. Raises ``IntakeError`` for a bad target."""
        target = check_text("target", target, max_chars=1024)
        entries: list[ClaimEntry | Refusal] = [*self.core.claim_history(target), *self.core.refusals(f"claim:{target}")]
        return sorted(entries, key=lambda e: e.seq)

    # -- operations -------------------------------------------------------------------------
    def approve(
        self,
        key: str,
        *,
        approver: str,
        expires_in: float | None = None,
        request_digest: str | None = None,
        target_version: int | None = None,
        signed: SignedApproval | None = None,
    ) -> Approval:
        """Approve intent ``key``'s exact bytes for ``expires_in`` seconds (database clock).

        ``request_digest`` is the digest of the wire bytes the approver saw (default: the intent's);
        ``target_version`` the target version the draft was written against (default: the current one).
        An approval binds digest, account, target and version; editing the draft (new bytes) needs a
        new approval. Raises ``GuardRefused`` naming the approval guard that refused:
        ``approver_identified`` for a blank approver, ``intent_awaiting_approval`` for an intent that is
        not queued (begun, in doubt, settled), ``approval_covers_intent_bytes`` for a ``request_digest``
        other than the intent's; ``UnknownIntent`` for an unknown key, ``IntakeError`` for bad input
        (docs/design.md#approvals-and-per-target-dispatch-claims).

        ``signed`` (from :func:`atmostonce.signing.sign_approval`, made where the approver's private key is)
        stores a signature instead of an ``expires_in``: the approval then expires at the signed absolute
        ``expires_at`` (database-clock seconds) and binds the signed ``target_version``; exactly one of
        ``expires_in`` and ``signed`` is given, else ``IntakeError``. The store does not check the signature
        here; the worker does before every send (docs/design.md#signed-approvals).
        """
        if (expires_in is None) == (signed is None):
            raise IntakeError("give exactly one of expires_in and signed")
        if signed is not None and not isinstance(signed, SignedApproval):
            raise IntakeError(f"signed must be a SignedApproval, got {type(signed).__name__}")
        if signed is not None and target_version is not None and target_version != signed.target_version:
            raise IntakeError("target_version differs from the signed target version")
        args: dict[str, Any] = {
            "key": check_text("key", key, max_chars=256),
            "approver": person_name("approver", approver),
            "expires_in": None if expires_in is None else validate_lease_seconds("expires_in", expires_in),
            "expires_at": None if signed is None else _expiry(signed.expires_at),
            "signature": None if signed is None else check_text("signature", signed.signature, max_chars=256),
            "signing_key_id": None if signed is None else check_text("key id", signed.signing_key_id, max_chars=64),
            "request_digest": None if request_digest is None else check_text("request_digest", request_digest),
            "target_version": _version(target_version if signed is None else signed.target_version),
            "approval_id": "apv_" + secrets.token_hex(12),
        }
        intent = self.core.find(args["key"])
        if intent is not None and not intent.requires_approval:
            raise IntakeError(
                "this intent was submitted without an approval requirement: nothing to approve", field="key"
            )
        return self.core._approve(args)

    def reserve_claim(
        self, key: str, *, approval_id: str, request_digest: str, owner: str, lease_seconds: float = 30.0
    ) -> ClaimLease:
        """Reserve the dispatch claim of intent ``key``'s target under approval ``approval_id`` for
        ``lease_seconds`` (database clock); replaces an expired reservation (epoch + 1, the old token
        is void). ``request_digest`` is the digest of the bytes this worker means to send.

        Raises ``GuardRefused`` naming the refusing claim guard (``approval_usable``,
        ``approval_binds_request`` for other bytes, ``approval_for_intent`` for an approval of another
        intent, even one with the same bytes, ``target_version_current``, ``intent_queued``,
        ``claim_lease_expired``), ``IllegalMove`` while the claim is sending or uncertain. docs/design.md#approvals-and-per-target-dispatch-claims.
        """
        args: dict[str, Any] = {
            "key": check_text("key", key, max_chars=256),
            "approval_id": check_text("approval id", approval_id, max_chars=128),
            "request_digest": check_text("request_digest", request_digest, max_chars=128),
            "owner": check_text("owner", owner, max_chars=256),
            "claim_lease_seconds": validate_lease_seconds("lease_seconds", lease_seconds),
            "new_token": "clm_" + secrets.token_hex(16),
        }
        intent = self.core.get(args["key"])
        if not intent.requires_approval:
            raise IntakeError(
                "this intent was submitted without an approval requirement: it takes no claim", field="key"
            )
        c = self.core._claim_move(RESERVE_OR_REPLACE, intent.target, args)
        assert c.owner_token is not None and c.lease_expires_at is not None and c.key is not None
        return ClaimLease(
            c.target, c.epoch, c.owner_token, args["owner"], c.key, args["approval_id"], c.lease_expires_at
        )

    def check_approvals(
        self, key: str, *, request_digest: str, guards: Sequence[str] | None = None
    ) -> list[tuple[Approval, str | None]]:
        """Evaluate, without writing, the claim guards a reservation of intent ``key`` under each of its
        approvals would check: ``guards`` (default: the claim table's ``preflight`` guards, in table order)
        against the target's claim row, the intent and that approval, with ``request_digest`` the digest
        of the bytes the worker means to send. The same predicates (model) or SQL fragments (one
        ``SELECT`` over the intent's approvals) the reserve's conditional write checks again.

        Returns every approval of ``key`` in :meth:`approvals` order, each with the first guard that
        refuses it or ``None``; the claim's state is the move's to check, not this one's. Raises
        ``UnknownIntent`` for a key with no intent and ``IntakeError`` for bad input or a guard the claim
        table does not have (docs/design.md#approvals-and-per-target-dispatch-claims)."""
        chosen = self.claim_table.preflight_guards if guards is None else tuple(guards)
        stray = [g for g in chosen if not isinstance(g, str) or g not in self.claim_table.guards]
        if stray:
            raise IntakeError(f"{stray} are not guards of the claim table", field="guards")
        args = {
            "key": check_text("key", key, max_chars=256),
            "request_digest": check_text("request_digest", request_digest, max_chars=128),
        }
        return self.core._check_approvals(args["key"], args, chosen)

    def release_claim(self, lease: ClaimLease) -> Claim:
        """Give a reserved claim back before any byte; refused (``claim_owner``) and recorded for a stale
        epoch or token, refused (``IllegalMove``) once sending began. docs/design.md#approvals-and-per-target-dispatch-claims, docs/design.md#refusals-are-recorded."""
        args = _claim_lease_args(lease)  # checks the type first
        return self.core._claim_move(CLAIM_EVENT.release, check_text("target", lease.target, max_chars=1024), args)

    def expire_approval(self, approval: Approval) -> Approval:
        """Sweeper: an approval whose deadline passed (database clock) becomes ``expired``. docs/design.md#approvals-and-per-target-dispatch-claims."""
        if not isinstance(approval, Approval):
            raise IntakeError(
                f"expected an Approval, got {type(approval).__name__}", field="approval", code=IntakeCode.WRONG_TYPE
            )
        return self.core._approval_move(
            APPROVAL_EVENT.expire_approval, check_text("approval id", approval.approval_id, max_chars=128), {}
        )

    # -- signed approvals (docs/design.md#signed-approvals) ------------------------------------------
    def add_operator_key(self, operator: str, public_key: str, *, added_by: str) -> OperatorKey:
        """Register ``public_key`` (PEM or 64 hex digits) as a key of ``operator`` (the approver name its
        signatures must carry); ``added_by`` names the administrator. Returns the :class:`OperatorKey`.
        Registering the same key again for the same operator returns the stored row; for another operator,
        ``IntakeError``, as for a blank name or a malformed key."""
        who = person_name("operator", operator)
        admin = person_name("added_by", added_by)
        if not who or not admin:
            raise IntakeError("an operator key needs a named operator and a named administrator")
        pub = parse_public_key(check_text("public key", public_key, max_chars=4096))
        kid = key_id(pub)
        old = self.core.operator_key(kid)
        if old is not None:
            if old.operator != who:
                raise IntakeError(f"key {kid} is already registered to another operator")
            return old
        return self.core._write_operator_key({"key_id": kid, "operator": who, "public_key": pub, "added_by": admin})

    def approve_signed(
        self, key: str, *, approver: str, expires_in: float, private_key: Any, target_version: int | None = None
    ) -> Approval:
        """Approve intent ``key`` under a signature made here, in the caller's process, with ``private_key``
        (an Ed25519 private key object; it is never stored): the expiry is ``expires_in`` seconds from the
        database clock's now, rounded down to a whole second; the target version is ``target_version`` or the
        target's current one. Raises what :meth:`approve` raises."""
        from .signing import sign_approval

        it = self.core.get(check_text("key", key, max_chars=256))
        secs = validate_lease_seconds("expires_in", expires_in)
        if target_version is None:
            c = self.core.claim(it.target)
            target_version = 0 if c is None else c.target_version
        signed = sign_approval(
            private_key,
            key=it.key,
            request_digest=it.request_digest,
            account=it.account,
            target=it.target,
            target_version=_version(target_version),  # type: ignore[arg-type]  # filled above: _version returns it
            expires_at=self.core.now() + secs,
            approver=person_name("approver", approver),
        )
        return self.approve(it.key, approver=approver, signed=signed)

    def set_signing_required(self, account: str, required: bool, *, operator: str | None = None) -> None:
        """Signing policy of ``account``: when on, an approval-gated send is authorized only under an
        approval signed by a key registered to its approver (guard ``approval_signature_verified``).
        ``operator``: who changed it, in the policy log (docs/design.md#policy-changes-are-on-the-record)."""
        if not isinstance(required, bool):
            raise IntakeError(f"required must be a bool, got {type(required).__name__}")
        who = None if operator is None else check_text("operator", operator, max_chars=256)
        self.core._write_policy("signing_policies", check_text("account", account), True if required else None, who)

    def verified_signature_args(self, claim: Any) -> dict[str, Any]:
        """At the worker, before bytes: the values of the approval under ``claim`` whose Ed25519 signature
        checked out against the approver's registered key, as ``sig_*`` arguments of the authorizing move
        (whose ``approval_signature_verified`` guard requires the row to be unchanged since); empty when
        the account does not require signing, or when the signature is missing, unregistered, another
        operator's or forged (the guard then refuses when signing is required)."""
        if claim is None or not getattr(claim, "approval_id", None):
            return {}
        try:
            a = self.core.approval(claim.approval_id)
        except UnknownIntent:
            return {}
        if not self.core.signing_required(a.account) or not a.signing_key_id:
            return {}
        k = self.core.operator_key(a.signing_key_id)
        if k is None or k.operator != a.approver or not verify_approval(k.public_key, a):
            return {}
        out = {f"sig_{f}": getattr(a, f) for f in SIGNED_FIELDS}
        return out | {
            "sig_approval_id": a.approval_id,
            "sig_signature": a.signature,
            "sig_key_id": a.signing_key_id,
            "sig_public_key": k.public_key,
        }

    def withdraw_approval(self, approval_id: str, *, operator: str, reason: str | None = None) -> Approval:
        """An operator withdraws an approval before its send started; returns the ``withdrawn`` approval.

        The approver may withdraw their own approval; any other operator must give a non-blank ``reason``
        (recorded in the claim history's detail with the operator's name). Raises ``GuardRefused``
        (``withdrawer_identified``, ``withdrawal_attributable``), ``IllegalMove`` once the approval was
        consumed, expired or withdrawn, ``UnknownIntent`` for an unknown id, ``IntakeError`` for bad input
        (docs/design.md#withdrawing-an-approval)."""
        args = {
            "operator": person_name("operator", operator),
            "reason": None if reason is None else _reason(reason),
        }
        return self.core._approval_move(APPROVAL_EVENT.withdraw_approval, check_text("approval id", approval_id), args)


def _expiry(v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < 2**53:
        raise IntakeError(f"a signed expires_at must be a non-negative number of seconds, got {v!r}")
    return float(v)


def _reason(v: Any) -> str:
    """A withdrawal's reason as every store compares it: whitespace-only (any Unicode whitespace) becomes ``""``."""
    text = check_text("reason", v, allow_blank=True, max_chars=1024)
    return text if text.strip() else ""


def _version(v: Any) -> int | None:
    if v is None:
        return None
    message = f"target_version must be a non-negative integer, got {v!r}"
    if isinstance(v, bool) or not isinstance(v, int):
        raise IntakeError(message, field="target_version", code=IntakeCode.NOT_INTEGER)
    if not 0 <= v < 2**62:
        raise IntakeError(
            message, field="target_version", code=IntakeCode.OUT_OF_RANGE, limit=0 if v < 0 else 2**62 - 1
        )
    return v


class MemoryClaims:
    """The in-memory engine for the approval and claim machines (mixed into the reference model).

    Uses the host's lock, clock, intent rows, sequence and guard-evaluation set.
    """

    def _reset_claims(self) -> None:
        self._approvals: dict[str, dict[str, Any]] = {}
        self._claims: dict[str, dict[str, Any]] = {}
        self._claim_history: list[ClaimEntry] = []
        self.operator_keys: dict[str, dict[str, Any]] = {}  # key id -> OperatorKey fields
        self.signing_policies: dict[str, bool] = {}  # account -> signing required

    # -- generic step --------------------------------------------------------------------------
    def _aux_step(
        self, mname: str, event: str, row: dict[str, Any], args: Mapping[str, Any], now: float
    ) -> dict[str, Any]:
        """Check source state and guards of ``event`` of machine ``mname`` on ``row``; return the moved copy.
        Raises ``IllegalMove`` / ``GuardRefused`` (subject = the row's target or approval id)."""
        t: Table = self.approval_table if mname == "approval" else self.claim_table  # type: ignore[attr-defined]
        guards = APPROVAL_GUARDS if mname == "approval" else CLAIM_GUARDS
        ev = t.event(event)
        # every claim row has its target, every approval row its id
        subject: str = row.get("target") if mname == "claim" else row.get("approval_id")  # type: ignore[assignment]
        if row["state"] not in ev.sources:
            raise IllegalMove(event, subject, SOURCE_STATE, row["state"])
        for g in ev.guards:
            if g in self._disabled_guards:  # type: ignore[attr-defined]
                continue
            if not guards[g](row, args, now, self):
                raise GuardRefused(event, subject, g, row["state"])
        new = copy.deepcopy(row)
        for eff in ev.effects:
            (APPROVAL_EFFECTS if mname == "approval" else CLAIM_EFFECTS)[eff](new, args, now)
        new["state"] = ev.target
        new["updated_at"] = now
        return new

    def _claim_entry(
        self,
        mname: str,
        subject: str,
        event: str,
        actor: str,
        old: Mapping[str, Any] | None,
        new: Mapping[str, Any],
        args: Mapping[str, Any],
        now: float,
    ) -> ClaimEntry:
        detail = {k: args[k] for k in DETAIL_FIELDS if args.get(k)}
        return ClaimEntry(
            next(self._seq),  # type: ignore[attr-defined]
            mname,
            subject,
            event,
            actor,
            None if old is None else old["state"],
            new["state"],
            new.get("epoch"),
            new.get("key"),
            detail,
            now,
        )

    def _empty_claim(self, target: str, now: float) -> dict[str, Any]:
        return {
            "target": target,
            "state": self.claim_table.initial,  # type: ignore[attr-defined]
            "epoch": 0,
            "target_version": 0,
            "owner": None,
            "owner_token": None,
            "key": None,
            "approval_id": None,
            "lease_expires_at": None,
            "updated_at": now,
        }

    # -- primitives ------------------------------------------------------------------------------
    def _approve(self, args: Mapping[str, Any]) -> Approval:
        with self._lock:  # type: ignore[attr-defined]
            now = self.now()  # type: ignore[attr-defined]
            intent = self._rows.get(args["key"])  # type: ignore[attr-defined]
            if intent is None:
                raise UnknownIntent(APPROVAL_EVENT.approve, args["key"], INTENT_EXISTS, None)
            claim = self._claims.get(intent["target"]) or self._empty_claim(intent["target"], now)
            row = {
                "approval_id": args["approval_id"],
                "key": intent["key"],
                "request_digest": args["request_digest"] or intent["request_digest"],
                "account": intent["account"],
                "target": intent["target"],
                "target_version": claim["target_version"] if args["target_version"] is None else args["target_version"],
                "approver": args["approver"],
                "expires_at": args["expires_at"] if args["expires_at"] is not None else now + args["expires_in"],
                "state": "<new>",
                "approved_at": now,
                "used_epoch": None,
                "signature": args["signature"],
                "signing_key_id": args["signing_key_id"],
            }
            ev = next(e for e in self.approval_table.events.values() if e.creates)  # type: ignore[attr-defined]
            inputs = dict(args) | {"intent": intent}
            for g in ev.guards:
                if g not in self._disabled_guards and not APPROVAL_GUARDS[g](row, inputs, now, self):  # type: ignore[attr-defined]
                    raise GuardRefused(ev.name, args["key"], g, None)
            row["state"] = ev.target
            self._claims.setdefault(intent["target"], claim)  # the target row exists from its first approval
            self._approvals[row["approval_id"]] = row
            self._claim_history.append(
                self._claim_entry(
                    "approval", row["approval_id"], ev.name, f"approver:{args['approver']}", None, row, args, now
                )
            )
            return _approval(row)

    def _claim_inputs(self, args: Mapping[str, Any], intent: Mapping[str, Any] | None) -> dict[str, Any]:
        out = dict(args)
        out["intent"] = intent
        aid = args.get("approval_id")
        out["approval"] = self._approvals.get(aid) if aid else None
        return out

    def _claim_move(self, event: str, target: str, args: Mapping[str, Any]) -> Claim:
        with self._lock:  # type: ignore[attr-defined]
            now = self.now()  # type: ignore[attr-defined]
            row = self._claims.get(target) or self._empty_claim(target, now)
            if event == RESERVE_OR_REPLACE:
                event = pick_reserve_event(self.claim_table, row["state"])  # type: ignore[attr-defined]
            intent = self._rows.get(args.get("key")) if args.get("key") else None  # type: ignore[attr-defined]
            inputs = self._claim_inputs(args, intent)
            try:
                new = self._aux_step("claim", event, row, inputs, now)
            except Rejected as exc:
                if claim_refusal_recorded(exc, args):
                    self._record_claim_refusal(exc, row, args, now)
                raise
            self._claims[target] = new
            actor = self.claim_table.event(event).actor  # type: ignore[attr-defined]
            self._claim_history.append(self._claim_entry("claim", target, event, actor, row, new, args, now))
            return _claim(new)

    def _record_claim_refusal(self, exc: Rejected, row: Mapping[str, Any], args: Mapping[str, Any], now: float) -> None:
        if row["target"] not in self._claims:  # no claim of that target ever existed to go stale: like the SQL
            return  # stores (whose refused move rolls back the claim row it would have created), record nothing
        moves = [(h.seq, h.epoch) for h in self._claim_history if h.machine == "claim" and h.subject == row["target"]]
        presented = {"owner": args.get("owner"), "claim_epoch": args.get("claim_epoch"), "key": args.get("key")}
        current = {"state": row["state"], "epoch": row["epoch"], "owner": row["owner"], "key": row["key"]}
        self._refusals.append(  # type: ignore[attr-defined]
            Refusal(
                next(self._seq),  # type: ignore[attr-defined]
                f"claim:{row['target']}",
                exc.event,
                exc.guard,
                presented,
                current,
                claim_superseding_move(moves, args.get("claim_epoch")),
                now,
            )
        )

    def _check_approvals(
        self, key: str, args: Mapping[str, Any], guards: tuple[str, ...]
    ) -> list[tuple[Approval, str | None]]:
        with self._lock:  # type: ignore[attr-defined]
            now = self.now()  # type: ignore[attr-defined]
            intent = self._rows.get(key)  # type: ignore[attr-defined]
            if intent is None:
                raise UnknownIntent(CLAIM_EVENT.reserve, key, INTENT_EXISTS, None)
            row = self._claims.get(intent["target"]) or self._empty_claim(intent["target"], now)
            out: list[tuple[Approval, str | None]] = []
            for a in self.approvals(key):
                inputs = self._claim_inputs({**args, "approval_id": a.approval_id}, intent)
                refused = next(
                    (
                        g
                        for g in guards
                        if g not in self._disabled_guards  # type: ignore[attr-defined]
                        and not CLAIM_GUARDS[g](row, inputs, now, self)
                    ),
                    None,
                )
                out.append((a, refused))
            return out

    def _approval_move(self, event: str, approval_id: str, args: Mapping[str, Any]) -> Approval:
        with self._lock:  # type: ignore[attr-defined]
            now = self.now()  # type: ignore[attr-defined]
            row = self._approvals.get(approval_id)
            if row is None:
                raise UnknownIntent(event, approval_id, "approval_exists", None)
            new = self._aux_step("approval", event, row, args, now)
            self._approvals[approval_id] = new
            actor = self.approval_table.event(event).actor  # type: ignore[attr-defined]
            if args.get("operator"):
                actor = f"operator:{args['operator']}"
            self._claim_history.append(self._claim_entry("approval", approval_id, event, actor, row, new, args, now))
            return _approval(new)

    def _coupled(
        self,
        ev: Event,
        intent_before: Mapping[str, Any],
        intent_after: Mapping[str, Any],
        args: Mapping[str, Any],
        now: float,
    ) -> list[CoupledMove]:
        """The claim (and approval) moves an intent move carries, checked but not applied.

        Returns ``[(machine, subject, event, old_row, new_row, args)]``; raises the refusal of a coupled move
        that applies (bound to this intent and in a source state) or is required.
        """
        cev_name = ev.couples.get("claim")
        if cev_name is None or not intent_before.get("requires_approval"):
            return []
        cev = self.claim_table.event(cev_name)  # type: ignore[attr-defined]
        required = "claim" in ev.couples_required
        target = intent_before["target"]
        row = self._claims.get(target) or self._empty_claim(target, now)
        inputs = self._claim_inputs(dict(args) | {"approval_id": row["approval_id"]}, intent_after)
        inputs["key"] = intent_before["key"]
        bound = row["key"] is not None and row["key"] == intent_before["key"]
        if not required and (not bound or row["state"] not in cev.sources):
            return []
        try:
            new = self._aux_step("claim", cev_name, row, inputs, now)
        except Rejected as exc:
            if claim_refusal_recorded(exc, inputs):
                self._record_claim_refusal(exc, row, inputs, now)
            raise
        moves = [("claim", target, cev_name, row, new, inputs)]
        aev = cev.couples.get("approval")
        if aev is not None:
            arow = self._approvals.get(row["approval_id"]) if row["approval_id"] else None
            if arow is None:  # pragma: no cover - approval_usable already refused
                raise GuardRefused(cev_name, target, CLAIM_GUARD.approval_usable, row["state"])
            anew = self._aux_step("approval", aev, arow, inputs | {"claim_epoch": row["epoch"]}, now)
            moves.append(("approval", arow["approval_id"], aev, arow, anew, inputs))
        return moves

    def _commit_coupled(self, moves: Sequence[CoupledMove], now: float) -> None:
        for mname, subject, event, old, new, inputs in moves:
            t = self.claim_table if mname == "claim" else self.approval_table  # type: ignore[attr-defined]
            (self._claims if mname == "claim" else self._approvals)[subject] = new
            actor = t.event(event).actor
            if inputs.get("operator"):
                actor = f"operator:{inputs['operator']}"
            self._claim_history.append(self._claim_entry(mname, subject, event, actor, old, new, inputs, now))

    def _write_operator_key(self, row: Mapping[str, Any]) -> OperatorKey:
        with self._lock:  # type: ignore[attr-defined]
            stored = dict(row) | {"added_at": self.now()}  # type: ignore[attr-defined]
            self.operator_keys[row["key_id"]] = stored
            return OperatorKey(**stored)

    def operator_key(self, key_id: str) -> OperatorKey | None:
        check_text("key id", key_id, max_chars=64)
        with self._lock:  # type: ignore[attr-defined]
            row = self.operator_keys.get(key_id)
            return None if row is None else OperatorKey(**row)

    def signing_required(self, account: str) -> bool:
        check_text("account", account)
        with self._lock:  # type: ignore[attr-defined]
            return bool(self.signing_policies.get(account, False))

    # -- reads -------------------------------------------------------------------------------------
    def claim(self, target: str) -> Claim | None:
        check_text("target", target, max_chars=1024)
        with self._lock:  # type: ignore[attr-defined]
            row = self._claims.get(target)
            return None if row is None else _claim(row)

    def approval(self, approval_id: str) -> Approval:
        check_text("approval id", approval_id, max_chars=128)
        with self._lock:  # type: ignore[attr-defined]
            row = self._approvals.get(check_text("approval id", approval_id, max_chars=128))
            if row is None:
                raise UnknownIntent("approval", approval_id, "approval_exists", None)
            return _approval(row)

    def approvals(self, key: str) -> list[Approval]:
        check_text("key", key, max_chars=256)
        with self._lock:  # type: ignore[attr-defined]
            rows = [r for r in self._approvals.values() if r["key"] == key]
            # as the SQL stores order them: by approval time, then by id
            return [_approval(r) for r in sorted(rows, key=lambda r: (r["approved_at"], r["approval_id"]))]

    def due_approvals(self, limit: int = 100) -> list[Approval]:
        check_limit(limit)
        with self._lock:  # type: ignore[attr-defined]
            now = self.now()  # type: ignore[attr-defined]
            live = self.approval_table.initial  # type: ignore[attr-defined]
            rows = [r for r in self._approvals.values() if r["state"] == live and r["expires_at"] <= now]
            return [_approval(r) for r in sorted(rows, key=lambda r: (r["expires_at"], r["approval_id"]))[:limit]]

    def claim_history(self, target: str) -> list[ClaimEntry]:
        """Every move of ``target``'s claim and of the approvals for it, in store sequence order."""
        check_text("target", target, max_chars=1024)
        with self._lock:  # type: ignore[attr-defined]
            ids = {a for a, r in self._approvals.items() if r["target"] == target}
            return [
                copy.deepcopy(h)
                for h in self._claim_history
                if (h.machine == "claim" and h.subject == target) or (h.machine == "approval" and h.subject in ids)
            ]


def _approval(row: Mapping[str, Any]) -> Approval:
    return Approval(**{k: row[k] for k in Approval.__dataclass_fields__})


def _claim(row: Mapping[str, Any]) -> Claim:
    return Claim(**{k: row[k] for k in Claim.__dataclass_fields__})
