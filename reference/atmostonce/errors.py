"""Typed errors. A refused move is never a silent ``False`` (design rule: the gate is the conditional write).

Hierarchy::

    AtMostOnceError
      Rejected              a move the table or a guard refused; nothing was written
        IllegalMove         the intent's state is not a source of the event (guard "source_state")
        GuardRefused        a named guard from the table's catalogue refused
        UnknownIntent       no intent has that delivery key (guard "intent_exists")
      IntakeError           bad input at submit; nothing was written (also a ValueError)
      StoreError            the store failed (driver errors are mapped to this)
        AppendOnlyViolation the database refused an UPDATE/DELETE on a history table
"""

from __future__ import annotations

__all__ = [
    "AppendOnlyViolation",
    "AtMostOnceError",
    "GuardRefused",
    "IllegalMove",
    "IntakeError",
    "Rejected",
    "StoreError",
    "UnknownIntent",
]


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

    def as_dict(self) -> dict:
        return {"event": self.event, "key": self.key, "guard": self.guard, "state": self.state}


class IllegalMove(Rejected):
    """The table has no such move from the intent's current state."""


class GuardRefused(Rejected):
    """A catalogued guard refused the move."""


class UnknownIntent(Rejected):
    """No intent has this delivery key."""


class IntakeError(AtMostOnceError, ValueError):
    """Input refused at intake (NUL bytes, lone surrogates, oversize, NaN, naive datetime, bad lease, empty names)."""


class StoreError(AtMostOnceError):
    """A store operation failed for a reason other than a refused move."""


class AppendOnlyViolation(StoreError):
    """The database refused to update or delete an append-only row."""
