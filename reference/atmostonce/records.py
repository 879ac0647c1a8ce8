"""Value types returned by every store, and intake validation shared by all of them.

Times are float seconds since the Unix epoch, as read from the *store's* clock
(design rule: the database clock decides leases; a worker's clock is context).
"""

from __future__ import annotations

import datetime as _dt
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from . import identity
from .canonical import canonical_bytes
from .errors import IntakeCode, IntakeError
from .identity import (
    NORMALIZER_VERSION,
    DeliveryKey,
    IdentityError,
    delivery_key,
    digest_bytes,
    load_canonical,
    platform_idempotency_key,
    text_digest,
)

__all__ = [
    "Approval",
    "Claim",
    "ClaimLease",
    "ClaimEntry",
    "DEFAULT_MAX_ATTEMPTS",
    "DEFAULT_MAX_PAYLOAD_BYTES",
    "DEFAULT_MAX_RECONCILES",
    "Attempt",
    "Evidence",
    "HistoryEntry",
    "Intent",
    "Lease",
    "Plan",
    "PolicyChange",
    "Reconciliation",
    "Refusal",
    "SourceCapture",
    "Submission",
    "check_json_object",
    "check_limit",
    "check_text",
    "person_name",
    "prepare_submission",
    "validate_lease_seconds",
    "check_retry_after",
]

DEFAULT_MAX_PAYLOAD_BYTES = 1 << 20  # 1 MiB of canonical JSON
DEFAULT_MAX_ATTEMPTS = 3
DEFAULT_MAX_RECONCILES = 3


@dataclass(frozen=True)
class Intent:
    """One delivery intent: the row whose state moves; its key never changes (docs/design.md#two-rows-intents-and-attempts)."""

    key: DeliveryKey
    account: str
    action_kind: str
    target: str
    request: Mapping[str, Any]
    request_digest: str
    state: str
    attempt_count: int
    max_attempts: int
    attempt_token: str | None
    generation: int | None
    lease_expires_at: float | None
    remote_id: str | None
    reconcile_count: int
    max_reconciles: int
    resend_epoch: int
    descriptor: Mapping[str, Any] | None
    normalizer_version: int
    created_at: float
    updated_at: float
    epoch: int | None = None
    text_hash: str | None = None
    source_id: str | None = None
    source_version: str | None = None
    requires_approval: bool = False
    fence_epoch: int = 0
    """Fenced absences proven so far (``reconcile_absent`` bumps it); part of the platform key."""
    store_epoch: int | None = None
    """The database's restore epoch when this snapshot was read (``epoch`` is the row's: the epoch
    its latest attempt was begun under)."""

    @property
    def plan(self) -> Plan:
        """What a maintenance pass planned on (the ``plan_unchanged`` guard compares it)."""
        return Plan(self.key, self.generation, self.reconcile_count, self.store_epoch)


@dataclass(frozen=True)
class Lease:
    """What ``begin`` hands a worker: the attempt token and fencing generation it must present."""

    key: DeliveryKey
    attempt_token: str
    generation: int
    expires_at: float
    epoch: int = 1


@dataclass(frozen=True)
class Plan:
    """A maintenance pass's snapshot of a row: it moves the row only if this still matches."""

    key: DeliveryKey
    generation: int | None
    reconcile_count: int
    epoch: int | None = None
    """The restore epoch the snapshot was read under: a restore voids every plan made before it."""


@dataclass(frozen=True)
class Attempt:
    """An immutable attempt fact; ``outcomes`` are appended beside it, never written over it."""

    attempt_token: str
    key: DeliveryKey
    number: int
    generation: int
    opened_at: float
    outcomes: tuple[str, ...] = ()
    resend_epoch: int | None = None
    """The intent's resend epoch when the attempt began (``None``: begun before migration 0005)."""
    fence_epoch: int = 0
    """The intent's fence epoch when the attempt began."""

    @property
    def idempotency_key(self) -> str | None:
        """The platform idempotency key this attempt was sent under
        (:func:`atmostonce.identity.platform_idempotency_key`); ``None`` when not recorded."""
        if self.resend_epoch is None:
            return None
        return platform_idempotency_key(self.key, self.resend_epoch, self.fence_epoch)


@dataclass(frozen=True)
class HistoryEntry:
    """One append-only history row; ``seq`` is assigned by the store and orders history."""

    seq: int
    key: DeliveryKey
    event: str
    actor: str
    from_state: str | None
    to_state: str
    attempt_token: str | None
    generation: int | None
    detail: Mapping[str, Any]
    recorded_at: float


@dataclass(frozen=True)
class Reconciliation:
    """One append-only reconciliation record of an external send (docs/design.md#reconciliation-records): ``unknown`` when the
    send's outcome became unknown, then one row per lookup or resolution, moving to ``confirmed`` or
    ``failed`` only on evidence. ``send_seq`` is the history ``seq`` of the move that made the send's
    outcome unknown (the join key to the audit); the current result of a send is its newest row.
    ``event`` names the move that wrote the row. Rows written before migration 0002 carry neither."""

    seq: int
    key: DeliveryKey
    result: str
    remote_id: str | None
    recorded_at: float
    send_seq: int | None = None
    event: str | None = None


@dataclass(frozen=True)
class PolicyChange:
    """One change of a policy the gates read, as the store recorded it in the transaction of the change
    (append-only; docs/design.md#policy-changes-are-on-the-record). ``seq``: store sequence; ``kind``: the
    policy's key in ``Operations.policies()`` (``kill_switches``, ``rate_limits``, ``credentials``,
    ``contracts``, ``signing``, ``text_window_seconds``); ``name``: the scope, account or platform it is
    for (``global`` for the text window); ``value``: the new value as JSON (``None``: removed);
    ``operator``: who made it (``None``: a program that named no person); ``recorded_at``: the store's clock."""

    seq: int
    kind: str
    name: str
    value: Any
    operator: str | None
    recorded_at: float


@dataclass(frozen=True)
class Refusal:
    """A refused stale write, recorded (docs/design.md#refusals-are-recorded): what was presented, what was current, and the
    sequence of the last history event before the refusal (the one that superseded the presenter).
    ``key``: the intent's delivery key, or ``claim:<target>`` for a refused claim write."""

    seq: int
    key: str
    event: str
    guard: str
    presented: Mapping[str, Any]
    current: Mapping[str, Any]
    superseded_by_seq: int | None
    recorded_at: float


@dataclass(frozen=True)
class Evidence:
    """A worker's outcome that arrived after its move was refused (a late success, not-sent, unknown
    or read-back), kept on the attempt it was for: append-only, it moves no state (design.md, "Late
    outcomes are evidence"). ``seq``: store sequence; ``attempt_token``/``generation``/``epoch``: the
    lease the worker presented; ``outcome``: the table's outcome name (``send.success`` ...);
    ``refused_event``/``refused_by``: the move that was refused and the guard (or ``source_state``)
    that refused it; ``remote_id``/``response_digest``: what the platform answered, if anything;
    ``worker_time``: the worker's wall clock (seconds, context only); ``recorded_at``: the store's clock."""

    seq: int
    key: DeliveryKey
    attempt_token: str
    generation: int
    epoch: int
    outcome: str
    refused_event: str
    refused_by: str
    remote_id: str | None
    response_digest: str | None
    reason: str | None
    worker_time: float | None
    recorded_at: float


@dataclass(frozen=True)
class SourceCapture:
    """The result of capturing a source: its version, whether that minted a new version, and the
    stored head it superseded (``None`` for the first capture)."""

    source_id: str
    version: str
    new_version: bool
    supersedes: str | None
    raw_hash: str | None


@dataclass(frozen=True)
class Submission:
    """Validated intake, ready to insert."""

    key: DeliveryKey
    account: str
    action_kind: str
    target: str
    request: Mapping[str, Any]
    request_json: str
    request_digest: str
    max_attempts: int
    max_reconciles: int
    normalizer_version: int = NORMALIZER_VERSION
    text_hash: str | None = None
    source_id: str | None = None
    source_version: str | None = None
    requires_approval: bool = False
    earlier_keys: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Approval:
    """An approval of one intent's exact bytes (docs/design.md#approvals-and-per-target-dispatch-claims): the request digest, account, target and the
    target version it was drafted against, who approved, and until when (database clock, seconds)."""

    approval_id: str
    key: DeliveryKey
    request_digest: str
    account: str
    target: str
    target_version: int
    approver: str
    expires_at: float
    state: str
    approved_at: float
    used_epoch: int | None = None
    signature: str | None = None
    """Hex Ed25519 signature over :func:`atmostonce.signing.approval_payload` (None: unsigned)."""
    signing_key_id: str | None = None
    """The registered operator key the signature claims (``ed25519:<32 hex>``)."""


@dataclass(frozen=True)
class OperatorKey:
    """An operator's registered Ed25519 public key (docs/design.md#signed-approvals): its id, the operator
    (approver) name it belongs to, the key as 64 hex digits, who registered it and when (database clock)."""

    key_id: str
    operator: str
    public_key: str
    added_by: str
    added_at: float


@dataclass(frozen=True)
class Claim:
    """The dispatch claim of one target (docs/design.md#approvals-and-per-target-dispatch-claims): its state, epoch (fencing token), owner, the intent and
    approval it is bound to, the lease deadline, and the target's version (publication bumps it)."""

    target: str
    state: str
    epoch: int
    target_version: int
    owner: str | None
    owner_token: str | None
    key: DeliveryKey | None
    approval_id: str | None
    lease_expires_at: float | None
    updated_at: float


@dataclass(frozen=True)
class ClaimLease:
    """What ``reserve_claim`` hands a worker: the target, epoch and owner token it must present to use or
    release the claim, and the approval it reserved under."""

    target: str
    epoch: int
    owner_token: str
    owner: str
    key: DeliveryKey
    approval_id: str
    expires_at: float


@dataclass(frozen=True)
class ClaimEntry:
    """One append-only row of a claim's or an approval's history, ordered by the store's ``seq``."""

    seq: int
    machine: str
    subject: str
    event: str
    actor: str
    from_state: str | None
    to_state: str
    epoch: int | None
    key: DeliveryKey | None
    detail: Mapping[str, Any]
    recorded_at: float


def _flag(name: str, v: Any) -> bool:
    if not isinstance(v, bool):
        raise IntakeError(f"{name} must be true or false, got {v!r}", field=name, code=IntakeCode.NOT_BOOL)
    return v


def _reject_datetimes(v: Any, path: str, depth: int = 0) -> None:
    if depth > MAX_DEPTH:
        raise IntakeError(
            f"{path}: nested deeper than {MAX_DEPTH} levels", field=path, code=IntakeCode.TOO_DEEP, limit=MAX_DEPTH
        )
    if isinstance(v, _dt.datetime):
        if v.tzinfo is None or v.utcoffset() is None:
            raise IntakeError(
                f"{path}: naive datetime; give a timezone-aware one", field=path, code=IntakeCode.NAIVE_DATETIME
            )
        raise IntakeError(
            f"{path}: datetimes are not JSON; send an ISO 8601 string", field=path, code=IntakeCode.DATETIME
        )
    if isinstance(v, dict):
        for k, x in v.items():
            _reject_datetimes(x, f"{path}.{k}", depth + 1)
    elif isinstance(v, (list, tuple)):
        for i, x in enumerate(v):
            _reject_datetimes(x, f"{path}[{i}]", depth + 1)


def _positive_int(name: str, v: Any) -> int:
    message = f"{name} must be an integer from 1 to {MAX_CAP}, got {v!r}"
    if isinstance(v, bool) or not isinstance(v, int):
        raise IntakeError(message, field=name, code=IntakeCode.NOT_INTEGER)
    if not 1 <= v <= MAX_CAP:
        raise IntakeError(message, field=name, code=IntakeCode.OUT_OF_RANGE, limit=1 if v < 1 else MAX_CAP)
    return v


def _source_pair(source: Any) -> tuple[Any, Any]:
    """``source`` as the ``(source id, source version)`` pair it must be: a tuple or list of two (a string, whose
    first two characters would otherwise be taken for the pair, is refused). Raises :class:`IntakeError`
    (``WRONG_TYPE``)."""
    if not isinstance(source, (tuple, list)) or len(source) != 2:
        raise IntakeError(
            f"source must be a (source id, source version) pair, got {type(source).__name__}"
            + (f" of {len(source)}" if isinstance(source, (tuple, list)) else ""),
            field="source",
            code=IntakeCode.WRONG_TYPE,
        )
    return source[0], source[1]


def prepare_submission(
    account: str,
    action_kind: str,
    target: str,
    request: Mapping[str, Any],
    *,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    max_reconciles: int = DEFAULT_MAX_RECONCILES,
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES,
    text_field: str = "text",
    source: tuple[str, str] | None = None,
    requires_approval: bool = False,
) -> Submission:
    """Validate intake and compute the delivery key and request digest.

    ``request`` is the canonical request projection (a JSON object). Raises
    :class:`IntakeError` for: empty or non-string account/action kind/target, or one longer than 1024
    characters or :data:`MAX_NAME_BYTES` bytes of UTF-8 (the source id too: 2048 characters);
    NUL bytes or lone surrogates anywhere; a naive datetime; a value that is
    not JSON (NaN, infinities, non-string keys, other types); canonical JSON
    larger than ``max_payload_bytes`` (default 1 MiB); non-positive caps.
    """
    for name, v in (("account", account), ("action_kind", action_kind), ("target", target)):
        check_text(name, v, max_chars=1024, max_bytes=MAX_NAME_BYTES)
    if not isinstance(request, Mapping):
        raise IntakeError(
            f"request must be a JSON object, got {type(request).__name__}", field="request", code=IntakeCode.NOT_OBJECT
        )
    _reject_datetimes(request, "request")
    try:
        raw = canonical_bytes(dict(request))
        key = delivery_key(account, action_kind, target, dict(request))
    except IdentityError as exc:
        raise IntakeError(str(exc), field="request", code=IntakeCode.NOT_CANONICAL) from exc
    if len(raw) > max_payload_bytes:
        raise IntakeError(
            f"request is {len(raw)} bytes of canonical JSON; the limit is {max_payload_bytes}",
            field="request",
            code=IntakeCode.TOO_LARGE,
            limit=max_payload_bytes,
        )
    stored = load_canonical(raw)  # what every store keeps and returns: the canonical form, round-tripped
    return Submission(
        key=key,
        account=account,
        action_kind=action_kind,
        target=target,
        request=stored,
        request_json=raw.decode("utf-8"),
        request_digest=digest_bytes(raw),  # request_digest(stored): the canonical bytes are already in hand
        max_attempts=_positive_int("max_attempts", max_attempts),
        max_reconciles=_positive_int("max_reconciles", max_reconciles),
        text_hash=text_digest(stored[text_field]) if isinstance(stored.get(text_field), str) else None,
        normalizer_version=identity.NORMALIZER_VERSION,
        source_id=None
        if source is None
        else check_text("source id", _source_pair(source)[0], max_chars=2048, max_bytes=MAX_NAME_BYTES),
        source_version=None if source is None else check_text("source version", source[1], max_chars=128),
        requires_approval=_flag("requires_approval", requires_approval),
        # the same delivery under each older normalizer still recognized: found, never duplicated
        earlier_keys=tuple(
            delivery_key(account, action_kind, target, stored, version=v)
            for v in sorted(identity.NORMALIZERS)
            if v < identity.NORMALIZER_VERSION
        ),
    )


HISTORY_DETAIL = (
    "reason",
    "remote_id",
    "response_digest",
    "operator",
    "fenced",
    "result",
    "descriptor",
    "credential_version",
    "platform",
    "contract_version",
    "evidence",
    "retry_after",
)
"""Arguments of a move that its history row keeps as ``detail`` (the same in every store)."""

MAX_LEASE_SECONDS = 366 * 86_400.0
MAX_TEXT_CHARS = 4096
MAX_NAME_BYTES = 2048
"""The most UTF-8 bytes of a name the stores index (account, action kind, target, source id): an index entry
of PostgreSQL's btree holds at most 2,704 bytes, and an account is indexed with a text hash beside it."""
MAX_DETAIL_BYTES = 64 * 1024
MAX_CAP = 10_000
MAX_DEPTH = 100
"""How deep a request or a JSON argument may nest objects and arrays."""


def validate_lease_seconds(name: str, seconds: Any) -> float:
    """A lease length in seconds: finite, > 0 and at most a year, else :class:`IntakeError`."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
        raise IntakeError(
            f"{name} must be a number of seconds, got {seconds!r}", field=name, code=IntakeCode.NOT_NUMBER
        )
    try:
        value = float(seconds)
    except OverflowError as exc:
        raise IntakeError(
            f"{name} is too large", field=name, code=IntakeCode.OUT_OF_RANGE, limit=MAX_LEASE_SECONDS
        ) from exc
    if not math.isfinite(value) or value <= 0 or value > MAX_LEASE_SECONDS:
        raise IntakeError(
            f"{name} must be a positive, finite number of seconds up to {MAX_LEASE_SECONDS:.0f}",
            field=name,
            code=IntakeCode.OUT_OF_RANGE,
            limit=MAX_LEASE_SECONDS,
        )
    return value


def check_retry_after(v: Any) -> int:
    """A platform's requested pause (``retry_after``, seconds) as whole seconds, rounded up: what a not-sent's
    history row keeps. Raises :class:`IntakeError` (field ``retry_after``) unless ``v`` is a finite number from
    0 to :data:`MAX_LEASE_SECONDS`."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise IntakeError(
            f"retry_after must be a number of seconds, got {type(v).__name__}",
            field="retry_after",
            code=IntakeCode.NOT_NUMBER,
        )
    if not 0 <= v <= MAX_LEASE_SECONDS:  # NaN fails both comparisons
        raise IntakeError(
            f"retry_after must be from 0 to {MAX_LEASE_SECONDS:g} seconds, got {v!r}",
            field="retry_after",
            code=IntakeCode.OUT_OF_RANGE,
            limit=0 if not v >= 0 else MAX_LEASE_SECONDS,
        )
    return math.ceil(v)


def check_text(
    name: str, v: Any, *, allow_blank: bool = False, max_chars: int = MAX_TEXT_CHARS, max_bytes: int | None = None
) -> str:
    """A string every store can persist: no NUL, no lone surrogate, at most ``max_chars`` characters and, when
    given, at most ``max_bytes`` bytes of UTF-8 (``TOO_LONG``, ``limit`` the bound crossed); else
    :class:`IntakeError`."""
    if not isinstance(v, str):
        raise IntakeError(f"{name} must be a string, got {type(v).__name__}", field=name, code=IntakeCode.NOT_STRING)
    if not allow_blank and not v.strip():
        raise IntakeError(f"{name} must not be empty", field=name, code=IntakeCode.EMPTY)
    if len(v) > max_chars:
        raise IntakeError(
            f"{name} is longer than {max_chars} characters", field=name, code=IntakeCode.TOO_LONG, limit=max_chars
        )
    if "\x00" in v:
        raise IntakeError(f"{name} contains a NUL byte", field=name, code=IntakeCode.NUL_BYTE)
    try:
        size = len(v.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise IntakeError(f"{name} contains a lone surrogate", field=name, code=IntakeCode.LONE_SURROGATE) from exc
    if max_bytes is not None and size > max_bytes:
        raise IntakeError(
            f"{name} is longer than {max_bytes} bytes of UTF-8", field=name, code=IntakeCode.TOO_LONG, limit=max_bytes
        )
    return v


def usable_remote_id(value: Any) -> str | None:
    """``value`` as a platform object id the stores keep, or ``None`` when it is not one: a non-empty string
    without control characters that passes :func:`check_text` (at most 4,096 characters, no lone surrogate),
    or an int (not a bool), kept as its decimal string. A send answered with an id that is not usable is an
    unknown outcome, settled by lookup: an id taken here that the store then refused would lose the record of
    a send that happened (docs/design.md#late-outcomes-are-evidence)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        try:
            value = str(value)
        except ValueError:  # more digits than int -> str converts (sys.get_int_max_str_digits): far too long anyway
            return None
    if not isinstance(value, str) or not value.strip() or any(ord(c) < 32 for c in value):
        return None
    try:
        return check_text("remote_id", value)
    except IntakeError:
        return None


def storable_reason(v: Any, *, fallback: str = "no reason given", max_chars: int = MAX_TEXT_CHARS) -> str:
    """A reason a transport wrote (an exception's text, a platform's error body), made one every store keeps:
    NUL bytes and lone surrogates escaped as ``\\x00`` and ``\\udcff``, cut to ``max_chars`` characters
    (the cut marked with ``...``); ``fallback`` when ``v`` is not a string or is blank. Never raises: the
    reason is a diagnostic, and a send's outcome must be recorded whatever its text (a proven not-sent
    left unrecorded would wait out its send lease and cost a lookup instead of a retry)."""
    if not isinstance(v, str) or not v.strip():
        return fallback
    text = v.replace("\x00", "\\x00").encode("utf-8", "backslashreplace").decode("utf-8")
    if len(text) > max_chars:
        text = text[: max_chars - 3] + "..."
    return text


def exception_reason(exc: BaseException) -> str:
    """``Class: message`` for an exception, as a storable reason (:func:`storable_reason`); an exception whose
    ``__str__`` itself raises is described by its class alone. Never raises."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:  # an SDK error whose message cannot be rendered: its class still says what it was
        text = f"{type(exc).__name__}: (its message could not be rendered)"
    return storable_reason(text)


def person_name(what: str, v: Any) -> str:
    """A person's name (operator, approver) as every store compares it: a whitespace-only name (any
    Unicode whitespace) becomes ``""``, which the guards refuse. Raises ``IntakeError`` for bad text."""
    text = check_text(what, v, allow_blank=True, max_chars=256)
    return text if text.strip() else ""


def check_json_object(name: str, v: Any, *, max_bytes: int = MAX_DETAIL_BYTES) -> dict[str, Any]:
    """A JSON object with a canonical form (no NaN, no datetimes, string keys), at most ``max_bytes``."""
    if not isinstance(v, Mapping):
        raise IntakeError(
            f"{name} must be a JSON object, got {type(v).__name__}", field=name, code=IntakeCode.NOT_OBJECT
        )
    _reject_datetimes(v, name)
    try:
        raw = canonical_bytes(dict(v))
    except IdentityError as exc:
        raise IntakeError(f"{name}: {exc}", field=name, code=IntakeCode.NOT_CANONICAL) from exc
    if len(raw) > max_bytes:
        raise IntakeError(
            f"{name} is larger than {max_bytes} bytes", field=name, code=IntakeCode.TOO_LARGE, limit=max_bytes
        )
    return load_canonical(raw)  # type: ignore[no-any-return]  # the canonical form of a dict loads as one


def check_limit(limit: Any) -> int:
    message = f"limit must be a non-negative integer, got {limit!r}"
    if isinstance(limit, bool) or not isinstance(limit, int):
        raise IntakeError(message, field="limit", code=IntakeCode.NOT_INTEGER)
    if limit < 0:
        raise IntakeError(message, field="limit", code=IntakeCode.OUT_OF_RANGE, limit=0)
    return limit
