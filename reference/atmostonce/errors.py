"""Typed errors. A refused move is never a silent ``False`` (design rule: the gate is the conditional write).

Hierarchy::

    AtMostOnceError
      Rejected              a move the table or a guard refused; nothing was written
        IllegalMove         the intent's state is not a source of the event (guard "source_state")
        GuardRefused        a named guard from the table's catalogue refused
        UnknownIntent       no intent has that delivery key (guard "intent_exists")
      NotVerified           a remote object a person named was read back and does not confirm the intent
      RetractionUnsupported a retraction for a transport that cannot retract; nothing was queued
      IntakeError           bad input at submit; nothing was written (also a ValueError)

The reasons a caller tells apart are enums a script or a test reads: :class:`IntakeCode`
(``IntakeError.code``), :class:`IdentityCode` (``atmostonce.identity.IdentityError.code``) and
:class:`TableCode` (``atmostonce.table.TableError.code``); the message is for a person.
      StoreError            the store failed (driver errors are mapped to this)
        AppendOnlyViolation the database refused an UPDATE/DELETE on a history table
        SequenceBehind      a store sequence is at or below a value already stored (a partial restore)
        NoSynchronousStandby  HA mode is declared and no synchronous standby would hold the authorization
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = [
    "INTENT_EXISTS",
    "LOST_RACE",
    "SOURCE_STATE",
    "AppendOnlyViolation",
    "AtMostOnceError",
    "GuardRefused",
    "IdentityCode",
    "IllegalMove",
    "IntakeCode",
    "IntakeError",
    "NoSynchronousStandby",
    "FoundOnPlatform",
    "ObjectOnRecord",
    "NotVerified",
    "Rejected",
    "RetractionUnsupported",
    "SchemaNewer",
    "SequenceBehind",
    "StoreError",
    "TableCode",
    "UnknownIntent",
]


SOURCE_STATE = "source_state"
"""The refusal of a move the table does not allow from the row's state (:class:`IllegalMove`): structural, not a
catalogue guard, so it is named here and not in ``spec/table.toml``."""
INTENT_EXISTS = "intent_exists"
"""The refusal of a move on a key no row has (:class:`UnknownIntent`): structural, like :data:`SOURCE_STATE`."""
LOST_RACE = "lost_race"
"""A SQL store's refusal of a move whose conditional write moved no row, when the read that diagnoses it finds
every guard passing twice (the row or the database clock changed between the write and that read, after the
write was tried once more): structural, like :data:`SOURCE_STATE`."""


class AtMostOnceError(Exception):
    """Base of every error this library raises on purpose."""


class Rejected(AtMostOnceError):
    """A move was refused and left the intent unchanged.

    Attributes: ``event`` (table event name), ``key`` (delivery key), ``guard``
    (the refusing guard's catalogue name, or ``source_state`` / ``intent_exists``
    / ``lost_race``), ``state`` (the intent's state when refused, or ``None``).
    """

    def __init__(self, event: str, key: str, guard: str, state: str | None, detail: str = ""):
        self.event, self.key, self.guard, self.state, self.detail = event, key, guard, state, detail
        msg = f"{event} refused for {key[:12]}… by {guard}" + (f" (state {state})" if state else "")
        super().__init__(msg + (f": {detail}" if detail else ""))

    def as_dict(self) -> dict[str, Any]:
        return {"event": self.event, "key": self.key, "guard": self.guard, "state": self.state}


class IllegalMove(Rejected):
    """The table has no such move from the intent's current state."""


class GuardRefused(Rejected):
    """A catalogued guard refused the move."""


class UnknownIntent(Rejected):
    """No intent has this delivery key."""


class FoundOnPlatform(AtMostOnceError):
    """A person asked to send an intent again (``resend``, ``resolve --not-sent``), and the platform's lookup by
    key found an object under a key one of its attempts was sent under: sending again would post a second
    copy. Nothing was written.

    Attributes: ``key`` (delivery key), ``remote_id`` (the object found) and ``platform_key`` (the idempotency
    key it was found under).
    """

    def __init__(self, key: str, remote_id: str, platform_key: str):
        self.key, self.remote_id, self.platform_key = key, remote_id, platform_key
        super().__init__(f"{key[:12]}… is on the platform: object {remote_id!r} under key {platform_key!r}")

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "remote_id": self.remote_id, "platform_key": self.platform_key}


class LookupAnswerError(AtMostOnceError, TypeError):
    """A transport's lookup answered something that is none of ``Found``, ``NotFound`` and ``Unsupported``: a
    failed lookup, which decides nothing (``atmostonce.runtime.lookup_answer``). A ``TypeError`` as well."""


class ObjectOnRecord(AtMostOnceError):
    """A person asked to send an intent again (``resend``, ``resolve --not-sent``, bulk settle), and the store
    already records an object one of its sends made: the intent's remote id, or the id a late success brought
    (docs/design.md#late-outcomes-are-evidence). Sending again would make a second copy. Nothing was written;
    nothing was asked of the platform.

    Attributes: ``key`` (delivery key), ``remote_id`` (the newest such object) and ``recorded_as``
    (``"remote_id"``: the intent's; ``"late_outcome"``: a late success's).
    """

    def __init__(self, key: str, remote_id: str, recorded_as: str):
        self.key, self.remote_id, self.recorded_as = key, remote_id, recorded_as
        super().__init__(
            f"{key[:12]}… already made object {remote_id!r} (recorded as its {recorded_as.replace('_', ' ')})"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "remote_id": self.remote_id, "recorded_as": self.recorded_as}


class NotVerified(AtMostOnceError):
    """A remote object id a person gave (``resolve --published``) was read back and does not confirm the
    intent: the platform has no such object, it does not hold what was approved, or the transport cannot
    read objects back. Nothing was written.

    Attributes: ``key`` (delivery key), ``remote_id``, ``outcome`` (the read-back outcome from the table,
    as the runtime names it) and ``evidence`` (the first field that differed and both projections, or
    ``None``).
    """

    def __init__(self, key: str, remote_id: str, outcome: str, evidence: dict[str, Any] | None = None):
        self.key, self.remote_id, self.outcome, self.evidence = key, remote_id, outcome, evidence
        super().__init__(f"remote object {remote_id!r} does not confirm {key[:12]}…: {outcome}")

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "remote_id": self.remote_id, "outcome": self.outcome, "evidence": self.evidence}


class RetractionUnsupported(AtMostOnceError):
    """A retraction (``delete`` or ``correct``) was asked of a transport that declares it cannot retract: the
    dispatcher would never begin it (outcome ``retract.unsupported``) and it would wait in the queue for
    ever, so it is refused before it is queued. Nothing was written.

    Attributes: ``key`` (the published intent), ``action`` (``delete`` / ``correct``), ``transport`` (its
    name) and ``outcome`` (the table's outcome for it, as the runtime names it).
    """

    def __init__(self, key: str, action: str, transport: str, outcome: str):
        self.key, self.action, self.transport, self.outcome = key, action, transport, outcome
        super().__init__(f"the {transport} transport cannot {action} a published object ({outcome}); nothing queued")

    def as_dict(self) -> dict[str, Any]:
        return {"key": self.key, "action": self.action, "transport": self.transport, "outcome": self.outcome}


class IntakeCode(enum.StrEnum):
    """Why an input was refused at intake: :attr:`IntakeError.code`. A script or a test reads the code, a
    person reads the message."""

    NOT_STRING = "not_string"
    """text was expected and something else was given"""
    EMPTY = "empty"
    """blank text (empty, or only whitespace) where a name or a reason is required"""
    TOO_LONG = "too_long"
    """text longer than :attr:`IntakeError.limit` characters"""
    NUL_BYTE = "nul_byte"
    """text with a NUL byte, which no store can persist"""
    LONE_SURROGATE = "lone_surrogate"
    """text with a lone surrogate, which has no UTF-8 form"""
    NOT_OBJECT = "not_object"
    """a JSON object (a mapping) was expected"""
    NAIVE_DATETIME = "naive_datetime"
    """a datetime without a UTC offset inside a JSON value"""
    DATETIME = "datetime"
    """a datetime inside a JSON value: JSON has none; send an ISO 8601 string"""
    TOO_DEEP = "too_deep"
    """a JSON value nested deeper than :attr:`IntakeError.limit` levels"""
    NOT_CANONICAL = "not_canonical"
    """a value with no canonical JSON form (NaN, an infinity, a key that is not a string, a set, ...)"""
    TOO_LARGE = "too_large"
    """canonical JSON larger than :attr:`IntakeError.limit` bytes"""
    NOT_BOOL = "not_bool"
    """a flag that is not ``True`` or ``False``"""
    NOT_INTEGER = "not_integer"
    """an integer was expected (``bool`` and ``float`` are not integers here)"""
    NOT_NUMBER = "not_number"
    """a number of seconds was expected"""
    OUT_OF_RANGE = "out_of_range"
    """a number outside its range; :attr:`IntakeError.limit` is the bound it crossed"""
    WRONG_TYPE = "wrong_type"
    """an object of another type than the one a call hands back (a ``Lease``, a ``Plan``, an ``Intent``), or
    than the shape an argument takes (``source``: a ``(source id, source version)`` pair)"""


class IntakeError(AtMostOnceError, ValueError):
    """Input refused at intake (NUL bytes, lone surrogates, oversize, NaN, naive datetime, bad lease, empty
    names); nothing was written.

    Attributes: ``field`` (the argument refused, or the path inside it, e.g. ``"target"`` or
    ``"request.at[0]"``; ``None`` when no one argument is at fault), ``code`` (an :class:`IntakeCode`, or
    ``None`` for a refusal of a combination of arguments, which only the message describes) and ``limit``
    (the bound crossed: the most characters, bytes or levels, or the end of a range the value is outside;
    ``None`` when the refusal has no bound).
    """

    def __init__(
        self,
        message: str,
        *,
        field: str | None = None,
        code: IntakeCode | None = None,
        limit: int | float | None = None,
    ):
        self.field, self.code, self.limit = field, code, limit
        super().__init__(message)

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "code": self.code, "limit": self.limit}


class IdentityCode(enum.StrEnum):
    """Why a value has no canonical form and cannot take part in an identity:
    ``atmostonce.identity.IdentityError.code``, beside ``field`` (the part or the path inside the value)."""

    NOT_STRING = "not_string"
    """text was expected and something else was given"""
    EMPTY = "empty"
    """a required part (account, action kind, target, key) is empty or only whitespace"""
    NUL_BYTE = "nul_byte"
    """text with a NUL byte"""
    LONE_SURROGATE = "lone_surrogate"
    """text with a lone surrogate, which has no UTF-8 form"""
    UNKNOWN_VERSION = "unknown_version"
    """a normalizer version this library does not have"""
    NOT_FINITE = "not_finite"
    """NaN or an infinity"""
    KEY_NOT_STRING = "key_not_string"
    """an object key that is not a string"""
    NOT_JSON = "not_json"
    """a value of a type JSON does not have (a set, a datetime, bytes, ...)"""
    TOO_DEEP = "too_deep"
    """a value nested deeper than the interpreter can walk"""
    NOT_CANONICAL = "not_canonical"
    """a value RFC 8785 refuses (e.g. an integer outside the range it writes exactly)"""
    NOT_EPOCH = "not_epoch"
    """an epoch that is not a non-negative integer"""


class TableCode(enum.StrEnum):
    """Why a table (``spec/table.toml`` or an auxiliary machine) could not be read:
    ``atmostonce.table.TableError.code``."""

    NOT_FOUND = "not_found"
    """no table file where one was looked for"""
    NOT_TOML = "not_toml"
    """the file is not valid TOML"""
    SCHEMA = "schema"
    """the parsed table fails its JSON Schema; ``where`` is the first violation's path"""
    DUPLICATE_EVENT = "duplicate_event"
    """an event declared twice; ``name`` is the event"""
    SPELLED_ALIKE = "spelled_alike"
    """two names of one vocabulary with the same attribute spelling (``a.b`` and ``a_b``)"""
    UNKNOWN_MACHINE = "unknown_machine"
    """an auxiliary machine name that is not one of ``atmostonce.table.MACHINES``"""
    UNKNOWN_NAME = "unknown_name"
    """a name a vocabulary does not declare (``atmostonce.table.UnknownName``)"""


class StoreError(AtMostOnceError):
    """A store operation failed for a reason other than a refused move."""


class AppendOnlyViolation(StoreError):
    """The database refused to update or delete an append-only row."""


class StoreNotFound(StoreError):
    """The database to open does not exist and the caller asked not to create it (``open_store(url,
    create=False)``): a SQLite file missing at ``path``. Waiting does not make it appear, so a worker refuses
    it at once instead of retrying as it does for a database that does not answer."""

    def __init__(self, path: str, message: str):
        super().__init__(message)
        self.path = path


class SchemaNewer(StoreError):
    """The database's schema was migrated by a newer atmostonce than this one: its revision is not among the
    migrations this version knows. This version's statements and guards may not match that schema (a column, a
    trigger or a guard it does not know), so it neither migrates nor uses the database; waiting does not mend it.
    Upgrade atmostonce on this host (docs/operations.md, "Upgrading").

    Attributes: ``found`` (the database's revision), ``known`` (the newest revision this version knows) and
    ``repair`` (what to do)."""

    REPAIR = "upgrade atmostonce here to the version that migrated the database (or newer)"

    def __init__(self, found: str, known: str | None):
        self.found, self.known, self.repair = found, known, self.REPAIR
        super().__init__(
            f"the database's schema is at revision {found}, newer than this atmostonce knows "
            f"(its newest is {known}): {self.repair}"
        )

    def as_dict(self) -> dict[str, Any]:
        return {"found": self.found, "known": self.known, "repair": self.repair}


class SequenceBehind(StoreError):
    """A sequence the store draws identities from would hand out a value already stored: the
    database was restored without its sequence positions (a schema-only or partial restore).
    The store refuses to open until ``atmostonce db declare-restore`` moves every sequence past
    the stored maximum (docs/design.md, "Sequences after a restore").

    Attributes: ``sequence`` (the first sequence behind, e.g. ``"aom_history.seq"`` or
    ``"generation"``), ``value`` (its current position, 0 when never used), ``stored_max`` (the
    highest value stored where it is used), ``repair`` (the command that repairs it) and
    ``behind`` (every ``(sequence, value, stored_max)`` found behind, in a fixed order).
    """

    REPAIR = "atmostonce db declare-restore --operator NAME"

    def __init__(self, behind: tuple[tuple[str, int, int], ...]):
        self.behind = tuple(behind)
        self.sequence, self.value, self.stored_max = self.behind[0]
        self.repair = self.REPAIR
        names = ", ".join(f"{n} at {v} (stored max {m})" for n, v, m in self.behind)
        super().__init__(f"sequences behind the stored data: {names}; run {self.repair}")

    def as_dict(self) -> dict[str, Any]:
        return {
            "sequence": self.sequence,
            "value": self.value,
            "stored_max": self.stored_max,
            "repair": self.repair,
            "behind": [list(b) for b in self.behind],
        }


class NoSynchronousStandby(StoreError):
    """The store was opened in HA mode (``atmostonce_ha=sync``) and the primary cannot acknowledge the
    before-byte authorization only once a standby has it: no synchronous standby is named or none is
    streaming as one. The authorization is refused and nothing was written; the intent stays queued and
    every other move keeps working (docs/design.md, "Failover and synchronous replication").

    Attributes: ``event`` (the refused authorizing event), ``key`` (delivery key), ``standby_names`` (the
    primary's ``synchronous_standby_names``, ``""`` when none is named) and ``sync_standbys`` (how many
    standbys ``pg_stat_replication`` shows streaming as ``sync`` or ``quorum``).
    """

    def __init__(self, event: str, key: str, standby_names: str, sync_standbys: int):
        self.event, self.key = event, key
        self.standby_names, self.sync_standbys = standby_names, int(sync_standbys)
        super().__init__(
            f"{event} refused for {key[:12]}…: no synchronous standby (synchronous_standby_names="
            f"{standby_names!r}, {self.sync_standbys} streaming as sync); nothing was written"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "event": self.event,
            "key": self.key,
            "standby_names": self.standby_names,
            "sync_standbys": self.sync_standbys,
        }
