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
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .errors import TableCode

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
    "Names",
    "UnknownName",
    "Vocabulary",
    "load_machine",
    "load_table",
    "machine",
    "spec_dir",
    "table",
]

MACHINES = ("approval", "claim")
"""The auxiliary machines beside the intent table: ``spec/<name>.toml``, validated by ``machine.schema.json``."""


class TableError(ValueError):
    """The table file is missing, malformed, or fails its JSON Schema.

    Attributes: ``code`` (a :class:`~atmostonce.errors.TableCode`), ``path`` (the file at fault, or ``None``),
    ``where`` (for a schema violation, the path inside the table of the first one, ``"<root>"`` for the
    table itself; else ``None``) and ``name`` (the event, machine or name at fault, or ``None``)."""

    def __init__(
        self,
        message: str,
        *,
        code: TableCode,
        path: str | None = None,
        where: str | None = None,
        name: str | None = None,
    ):
        self.code, self.path, self.where, self.name = code, path, where, name
        super().__init__(message)

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "path": self.path, "where": self.where, "name": self.name}


class UnknownName(TableError):
    """A name the table does not declare was asked of one of its vocabularies (a typo in code).

    Attributes: ``vocabulary`` (``"state"``, ``"event"``, ``"guard"``, ``"effect"``, ``"outcome"`` or
    ``"actor"``), ``name`` (the attribute asked for), ``table`` (the table's name)."""

    def __init__(self, vocabulary: str, name: str, table: str):
        self.vocabulary, self.table = vocabulary, table
        super().__init__(f"{table} declares no {vocabulary} {name!r}", code=TableCode.UNKNOWN_NAME, name=name)


class Names:
    """One vocabulary of a table (its states, events, guards, effects, outcomes or actors) as attributes, in the
    manner of h11's sentinels: ``names.outcome.gate_rate_limited == "gate.rate_limited"``. Code names a table
    entry through this, never as a string literal, so a typo raises :class:`UnknownName` where it is read
    (at import for a module-level name) instead of comparing unequal for ever. An outcome's dot is spelled
    ``_`` (``send.not_sent`` is ``send_not_sent``); two names spelled alike are refused when the table loads."""

    __slots__ = ("_vocabulary", "_table", "_by_attr")

    def __init__(self, vocabulary: str, table: str, names: Iterable[str]):
        by_attr: dict[str, str] = {}
        for n in names:
            attr = n.replace(".", "_")
            if attr in by_attr:
                raise TableError(
                    f"{table}: {vocabulary}s {by_attr[attr]!r} and {n!r} are both spelled {attr}",
                    code=TableCode.SPELLED_ALIKE,
                    name=n,
                )
            by_attr[attr] = n
        self._vocabulary, self._table, self._by_attr = vocabulary, table, by_attr

    def __getattr__(self, attr: str) -> str:
        if attr.startswith("_"):
            raise AttributeError(attr)  # copy, pickle and hasattr probe dunders: not a vocabulary name
        try:
            return self._by_attr[attr]
        except KeyError:
            raise UnknownName(self._vocabulary, attr, self._table) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_attr.values())

    def __contains__(self, name: object) -> bool:
        return name in self._by_attr.values()

    def __len__(self) -> int:
        return len(self._by_attr)

    def __dir__(self) -> list[str]:
        return sorted(self._by_attr)

    def __repr__(self) -> str:
        return f"<{self._table} {self._vocabulary}s: {', '.join(self._by_attr.values())}>"


@dataclass(frozen=True)
class Vocabulary:
    """A table's names, one :class:`Names` per catalogue (``t.names.state.pending``)."""

    state: Names
    event: Names
    guard: Names
    effect: Names
    outcome: Names
    actor: Names


@dataclass(frozen=True)
class Actor:
    name: str
    human: bool
    meaning: str


@dataclass(frozen=True)
class State:
    """A state. ``terminal``: the machine is finished with it (no machine actor leaves it, a static check).
    ``kind`` groups an auxiliary machine's states (an approval's three spent states); the intent table's
    states have none: code names them (``names.state.indeterminate``), not a second name for each."""

    name: str
    terminal: bool
    meaning: str
    seed: str
    kind: str | None = None


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
    before_begin: str | None = None
    """An outcome the dispatcher reports when this guard of ``authorize_dispatch`` refuses in its check
    before ``begin`` (``Store.check``, no write): nothing begun or spent, the intent still queued."""
    fencing: bool = False
    """The guard catches a writer acting on a stale view (a superseded lease, an older restore epoch, a plan
    the row has moved past): its refusal is recorded with what the writer presented."""
    preflight: bool = False
    """A guard of an auxiliary machine the dispatcher evaluates, without writing, against each candidate it
    could present (every approval of the intent), choosing only among those that pass: the same predicate
    or SQL fragment the move then checks again in its conditional write."""


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
    waiting: bool = False
    """A dispatch outcome that began nothing: a worker that saw only these waits before it polls again."""
    timed: bool = False
    """A waiting outcome that time resolves (a rate window turns, another claim lapses); the other waiting
    outcomes hold until someone acts (approves, releases a kill switch, captures a source)."""


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

    @functools.cached_property
    def names(self) -> Vocabulary:
        """This table's names as attributes (:class:`Names`): ``t.names.guard.lease_holder``."""
        return _vocabulary(self)

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
    def fencing_guards(self) -> tuple[str, ...]:
        """Guards whose refusals are recorded (``fencing = true``): they catch a stale view."""
        return tuple(g.name for g in self.guards.values() if g.fencing)

    @property
    def preflight_guards(self) -> tuple[str, ...]:
        """Guards the dispatcher evaluates against each candidate before the move (``preflight = true``),
        for example the claim machine's ``("approval_usable", "approval_binds_request")``."""
        return tuple(g.name for g in self.guards.values() if g.preflight)

    @property
    def waiting_guards(self) -> Mapping[str, str]:
        """Guards whose refusal is a wait, each with the outcome the runtime reports for it
        (``refusal_outcome``); for example ``{"rate_limit_clear": "gate.rate_limited"}``."""
        return MappingProxyType({g.name: g.refusal_outcome for g in self.guards.values() if g.refusal_outcome})

    @property
    def before_begin_guards(self) -> Mapping[str, str]:
        """Guards the dispatcher checks before ``begin`` (``before_begin``), each with the outcome it reports
        when that guard refuses; for example ``{"kill_switch_off": "gate.paused", ...}``."""
        return MappingProxyType({g.name: g.before_begin for g in self.guards.values() if g.before_begin})

    @property
    def waiting_outcomes(self) -> frozenset[str]:
        """Dispatch outcomes that began nothing (``waiting = true``)."""
        return frozenset(o.name for o in self.outcomes.values() if o.waiting)

    @property
    def timed_outcomes(self) -> frozenset[str]:
        """Waiting outcomes that time resolves (``timed = true``)."""
        return frozenset(o.name for o in self.outcomes.values() if o.timed)

    @property
    def late_outcomes(self) -> tuple[str, ...]:
        """Outcomes a worker may present as evidence after its move was refused: those recorded by a
        worker's move out of the in-flight state (the send's and the read-back's results). Derived from
        the events, so a new send outcome is covered without a list to keep."""
        worker, in_flight = self.names.actor.worker, self.names.state.authorized
        return tuple(
            o.name
            for o in self.outcomes.values()
            if o.event is not None
            and self.events[o.event].actor == worker
            and in_flight in self.events[o.event].sources
        )

    @property
    def outcome_events(self) -> tuple[str, ...]:
        """A worker's moves out of the in-flight state: the send's outcome and its read-back's. Losing one
        leaves the intent in flight under its lease, whose expiry makes the send unknown, which the
        reconciler settles; such a move may commit without waiting for the disk, where the authorization
        before the bytes never may (docs/design.md#two-durable-points-per-send)."""
        worker, in_flight = self.names.actor.worker, self.names.state.authorized
        return tuple(
            e.name for e in self.events.values() if e.actor == worker and e.sources and set(e.sources) == {in_flight}
        )

    @property
    def terminal_states(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states.values() if s.terminal)

    def states_of_kind(self, *kinds: str) -> tuple[str, ...]:
        """An auxiliary machine's states of these kinds (the intent table's states have no kind)."""
        return tuple(s.name for s in self.states.values() if s.kind in kinds)


def _vocabulary(t: Table) -> Vocabulary:
    return Vocabulary(
        state=Names("state", t.name, t.states),
        event=Names("event", t.name, t.events),
        guard=Names("guard", t.name, t.guards),
        effect=Names("effect", t.name, t.effects),
        outcome=Names("outcome", t.name, t.outcomes),
        actor=Names("actor", t.name, t.actors),
    )


class LazyNames:
    """A :class:`Names` of a table loaded on first use (the project's table, or one of its machines), so a
    module may bind ``OUTCOME = LazyNames(...)`` without reading a file at import."""

    __slots__ = ("_resolve",)

    def __init__(self, resolve: Callable[[], Names]):
        self._resolve = resolve

    def __getattr__(self, attr: str) -> str:
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._resolve(), attr)  # type: ignore[no-any-return]  # Names.__getattr__ returns str

    def __iter__(self) -> Iterator[str]:
        return iter(self._resolve())

    def __contains__(self, name: object) -> bool:
        return name in self._resolve()

    def __len__(self) -> int:
        return len(self._resolve())

    def __dir__(self) -> list[str]:
        return dir(self._resolve())

    def __repr__(self) -> str:
        return repr(self._resolve())


def spec_dir() -> Path:
    """Folder holding ``table.toml``: the copy shipped in the wheel, else the repo's ``spec/``."""
    shipped = resources.files("atmostonce").joinpath("_spec")
    if shipped.joinpath("table.toml").is_file():
        return Path(str(shipped))
    repo = Path(__file__).resolve().parents[2] / "spec"
    if (repo / "table.toml").is_file():
        return repo
    raise TableError(
        "spec/table.toml not found in the package or the source tree", code=TableCode.NOT_FOUND, path=str(repo)
    )


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
        raise TableError(f"table does not match its schema at {where}: {e.message}", code=TableCode.SCHEMA, where=where)
    events: dict[str, Event] = {}
    for ev in raw["events"]:
        if ev["name"] in events:
            raise TableError(f"event {ev['name']!r} declared twice", code=TableCode.DUPLICATE_EVENT, name=ev["name"])
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
    t = Table(
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
    t.names  # noqa: B018  # built now: two names spelled alike fail the load, not the first lookup
    return t


def load_table(path: str | Path | None = None, *, schema: str = "table.schema.json") -> Table:
    """Read and validate a table file (default: the shipped ``table.toml``) against ``spec/<schema>``.

    Raises :class:`TableError` for a missing file, bad TOML, or a schema violation.
    """
    p = Path(path) if path is not None else spec_dir() / "table.toml"
    try:
        raw = tomllib.loads(p.read_text("utf-8"))
    except FileNotFoundError as exc:
        raise TableError(f"no table at {p}", code=TableCode.NOT_FOUND, path=str(p)) from exc
    except tomllib.TOMLDecodeError as exc:
        raise TableError(f"{p} is not valid TOML: {exc}", code=TableCode.NOT_TOML, path=str(p)) from exc
    return parse_table(raw, json.loads((spec_dir() / schema).read_text("utf-8")))


def load_machine(name: str, path: str | Path | None = None) -> Table:
    """Read an auxiliary machine (``"approval"`` or ``"claim"``: ``spec/<name>.toml``) with the machine schema.

    Raises :class:`TableError` for an unknown name, a missing file, bad TOML, or a schema violation.
    """
    if name not in MACHINES:
        raise TableError(
            f"unknown machine {name!r}; known: {', '.join(MACHINES)}", code=TableCode.UNKNOWN_MACHINE, name=name
        )
    return load_table(path if path is not None else spec_dir() / f"{name}.toml", schema="machine.schema.json")


@functools.cache
def machine(name: str) -> Table:
    """The project's auxiliary machine ``name`` (docs/design.md#approvals-and-per-target-dispatch-claims: approvals, per-target claims), loaded once."""
    return load_machine(name)


@functools.cache
def table() -> Table:
    """The project's table, loaded once per process."""
    return load_table()
