"""Load the transition table (``spec/table.toml``) into an immutable, typed value.

The table is the single source of states, events, guards, effects and outcome
mappings (docs/design.md#one-table-read-by-everything; h11-style: a move not in the table is
the only illegal move). Everything else reads it from here.

Shapes: :class:`Table` holds tuples and read-only mappings of frozen
dataclasses. Errors: :class:`TableError` when the file is missing, is not
valid TOML, or does not validate against ``spec/table.schema.json``.
"""

from __future__ import annotations

import functools
import json
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

__all__ = [
    "Actor",
    "Effect",
    "Event",
    "Guard",
    "Outcome",
    "State",
    "Table",
    "TableError",
    "MACHINES",
    "load_machine",
    "load_table",
    "machine",
    "spec_dir",
    "table",
]

MACHINES = ("approval", "claim")
"""The auxiliary machines beside the intent table: ``spec/<name>.toml``, validated by ``machine.schema.json``."""


class TableError(ValueError):
    """The table file is missing, malformed, or fails its JSON Schema."""


@dataclass(frozen=True)
class Actor:
    name: str
    human: bool
    meaning: str


@dataclass(frozen=True)
class State:
    name: str
    kind: str
    disposition: str
    retryable: bool
    terminal: bool
    meaning: str
    seed: str


@dataclass(frozen=True)
class Guard:
    name: str
    meaning: str
    seed: str
    proof_of_absence: bool = False
    policy: bool = False
    refusal_outcome: str | None = None
    """An outcome (in ``outcomes``) the runtime reports when this guard refuses ``authorize_dispatch``: a
    wait (nothing sent, the lease given back, the intent still queued), not a policy block."""


@dataclass(frozen=True)
class Effect:
    name: str
    meaning: str


@dataclass(frozen=True)
class Event:
    name: str
    actor: str
    sources: tuple[str, ...]
    target: str
    guards: tuple[str, ...]
    effects: tuple[str, ...]
    seed: str
    couples: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    couples_required: tuple[str, ...] = ()

    @property
    def creates(self) -> bool:
        """True for the event that creates an intent (no source state)."""
        return not self.sources


@dataclass(frozen=True)
class Outcome:
    """An outcome name the code can produce. ``event`` is the move that records it, or ``None`` for an
    outcome that moves nothing (the intent stays in ``state``)."""

    name: str
    state: str
    meaning: str
    event: str | None = None


@dataclass(frozen=True)
class Table:
    name: str
    version: str
    initial: str
    actors: Mapping[str, Actor]
    states: Mapping[str, State]
    guards: Mapping[str, Guard]
    effects: Mapping[str, Effect]
    events: Mapping[str, Event]
    outcomes: Mapping[str, Outcome]

    def event(self, name: str) -> Event:
        """The event called ``name``; raises ``KeyError`` for an unknown event."""
        return self.events[name]

    def sources(self, event: str) -> tuple[str, ...]:
        """Allowed source states of ``event`` (the SQL ``state IN (...)`` list)."""
        return self.events[event].sources

    def is_human(self, event: str) -> bool:
        return self.actors[self.events[event].actor].human

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(self.states)

    @property
    def policy_guards(self) -> tuple[str, ...]:
        """Guards whose refusal is a policy block (the worker parks the intent), not a stale worker."""
        return tuple(g.name for g in self.guards.values() if g.policy)

    @property
    def waiting_guards(self) -> Mapping[str, str]:
        """Guards whose refusal is a wait, each with the outcome the runtime reports for it
        (``refusal_outcome``); for example ``{"rate_limit_clear": "gate.rate_limited"}``."""
        return MappingProxyType({g.name: g.refusal_outcome for g in self.guards.values() if g.refusal_outcome})

    @property
    def late_outcomes(self) -> tuple[str, ...]:
        """Outcomes a worker may present as evidence after its move was refused: those recorded by a
        worker's move out of an in-flight state (the send's and the read-back's results). Derived from
        the events and states, so a new send outcome is covered without a list to keep."""
        return tuple(
            o.name
            for o in self.outcomes.values()
            if o.event is not None
            and self.events[o.event].actor == "worker"
            and any(self.states[s].kind == "in_flight" for s in self.events[o.event].sources)
        )

    @property
    def outcome_events(self) -> tuple[str, ...]:
        """A worker's moves out of an in-flight state: the send's outcome and its read-back's. Losing one
        leaves the intent in flight under its lease, whose expiry makes the send unknown, which the
        reconciler settles; such a move may commit without waiting for the disk, where the authorization
        before the bytes never may (docs/design.md#two-durable-points-per-send)."""
        return tuple(
            e.name
            for e in self.events.values()
            if e.actor == "worker" and e.sources and all(self.states[s].kind == "in_flight" for s in e.sources)
        )

    @property
    def retryable_states(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states.values() if s.retryable)

    @property
    def terminal_states(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states.values() if s.terminal)

    def states_of_kind(self, *kinds: str) -> tuple[str, ...]:
        return tuple(s.name for s in self.states.values() if s.kind in kinds)


def spec_dir() -> Path:
    """Folder holding ``table.toml``: the copy shipped in the wheel, else the repo's ``spec/``."""
    shipped = resources.files("atmostonce").joinpath("_spec")
    if shipped.joinpath("table.toml").is_file():
        return Path(str(shipped))
    repo = Path(__file__).resolve().parents[2] / "spec"
    if (repo / "table.toml").is_file():
        return repo
    raise TableError("spec/table.toml not found in the package or the source tree")


def _freeze(d: dict[str, Any]) -> Mapping[str, Any]:
    return MappingProxyType(dict(d))


def parse_table(raw: Mapping[str, Any], schema: Mapping[str, Any] | None = None) -> Table:
    """Validate ``raw`` (the parsed TOML) against the schema and build a :class:`Table`.

    Raises :class:`TableError` naming the first schema violation.
    """
    import jsonschema

    if schema is None:
        schema = json.loads((spec_dir() / "table.schema.json").read_text("utf-8"))
    errors = sorted(jsonschema.Draft202012Validator(schema).iter_errors(raw), key=lambda e: list(e.path))
    if errors:
        e = errors[0]
        where = "/".join(str(p) for p in e.path) or "<root>"
        raise TableError(f"table does not match its schema at {where}: {e.message}")
    events: dict[str, Event] = {}
    for ev in raw["events"]:
        if ev["name"] in events:
            raise TableError(f"event {ev['name']!r} declared twice")
        events[ev["name"]] = Event(
            name=ev["name"],
            actor=ev["actor"],
            sources=tuple(ev["from"]),
            target=ev["to"],
            guards=tuple(ev["guards"]),
            effects=tuple(ev["effects"]),
            seed=ev["seed"],
            couples=MappingProxyType(dict(ev.get("couples", {}))),
            couples_required=tuple(ev.get("couples_required", ())),
        )
    return Table(
        name=raw["name"],
        version=raw["version"],
        initial=raw["initial"],
        actors=_freeze({k: Actor(k, v["human"], v["meaning"]) for k, v in raw["actors"].items()}),
        states=_freeze({k: State(name=k, **v) for k, v in raw["states"].items()}),
        guards=_freeze({k: Guard(name=k, **v) for k, v in raw["guards"].items()}),
        effects=_freeze({k: Effect(k, v["meaning"]) for k, v in raw["effects"].items()}),
        events=_freeze(events),
        outcomes=_freeze({k: Outcome(name=k, **v) for k, v in raw.get("outcomes", {}).items()}),
    )


def load_table(path: str | Path | None = None, *, schema: str = "table.schema.json") -> Table:
    """Read and validate a table file (default: the shipped ``table.toml``) against ``spec/<schema>``.

    Raises :class:`TableError` for a missing file, bad TOML, or a schema violation.
    """
    p = Path(path) if path is not None else spec_dir() / "table.toml"
    try:
        raw = tomllib.loads(p.read_text("utf-8"))
    except FileNotFoundError as exc:
        raise TableError(f"no table at {p}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise TableError(f"{p} is not valid TOML: {exc}") from exc
    return parse_table(raw, json.loads((spec_dir() / schema).read_text("utf-8")))


def load_machine(name: str, path: str | Path | None = None) -> Table:
    """Read an auxiliary machine (``"approval"`` or ``"claim"``: ``spec/<name>.toml``) with the machine schema.

    Raises :class:`TableError` for an unknown name, a missing file, bad TOML, or a schema violation.
    """
    if name not in MACHINES:
        raise TableError(f"unknown machine {name!r}; known: {', '.join(MACHINES)}")
    return load_table(path if path is not None else spec_dir() / f"{name}.toml", schema="machine.schema.json")


@functools.cache
def machine(name: str) -> Table:
    """The project's auxiliary machine ``name`` (docs/design.md#approvals-and-per-target-dispatch-claims: approvals, per-target claims), loaded once."""
    return load_machine(name)


@functools.cache
def table() -> Table:
    """The project's table, loaded once per process."""
    return load_table()
