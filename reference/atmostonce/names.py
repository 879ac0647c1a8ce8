"""The project's table vocabulary as attributes: ``OUTCOME.gate_rate_limited``, ``GUARD.lease_holder``.

Code names a state, event, guard, effect, outcome or actor of ``spec/table.toml`` through these (and the target
claim's through ``CLAIM_*``), never as a string literal: a misspelt name raises
:class:`~atmostonce.table.UnknownName` where it is read, instead of comparing unequal for ever. The table is
read on first use, not at import. A store carrying another table has its own: ``store.table.names``.
"""

from __future__ import annotations

from .table import LazyNames, machine, table

__all__ = [
    "ACTOR",
    "APPROVAL_EVENT",
    "CLAIM_EVENT",
    "CLAIM_GUARD",
    "CLAIM_STATE",
    "EFFECT",
    "EVENT",
    "GUARD",
    "OUTCOME",
    "STATE",
]

STATE = LazyNames(lambda: table().names.state)
EVENT = LazyNames(lambda: table().names.event)
GUARD = LazyNames(lambda: table().names.guard)
EFFECT = LazyNames(lambda: table().names.effect)
OUTCOME = LazyNames(lambda: table().names.outcome)
ACTOR = LazyNames(lambda: table().names.actor)

CLAIM_STATE = LazyNames(lambda: machine("claim").names.state)
CLAIM_EVENT = LazyNames(lambda: machine("claim").names.event)
CLAIM_GUARD = LazyNames(lambda: machine("claim").names.guard)

APPROVAL_EVENT = LazyNames(lambda: machine("approval").names.event)
