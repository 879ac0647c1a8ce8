"""What every part of the Promela generator shares: the error, the bounds, the template loader, helpers."""

from __future__ import annotations

import dataclasses
import string
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path

from atmostonce.table import Table

__all__ = [
    "TEMPLATES",
    "Binding",
    "DEFAULT_BOUNDS",
    "Bounds",
    "GenerationError",
    "any_of",
    "block",
    "kind_states",
    "one_kind",
    "placeholders",
    "property_doc",
    "property_switches",
    "render",
]

TEMPLATES = Path(__file__).resolve().parent / "templates"


class GenerationError(ValueError):
    """The table names something the generator has no Promela translation for."""


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The model's bounds: one intent, ``workers`` workers, at most ``operator_moves`` operator moves."""

    workers: int = 2
    max_attempts: int = 2
    max_reconciles: int = 1
    operator_moves: int = 2  # the largest OPERATOR_MOVES a configuration may pick with -D

    @property
    def request_slots(self) -> int:
        # every send needs its own authorization, hence its own attempt; attempts are capped by
        # max_attempts plus one per operator grant, so the correct model never needs more slots
        return self.max_attempts + self.operator_moves


DEFAULT_BOUNDS = Bounds()


def render(template: str, **values: object) -> str:
    """``templates/<template>.pml`` with every ``${name}`` replaced by ``values[name]``.

    The templates are Promela text; a placeholder without a value, or a value without a
    placeholder, is a bug in the generator and raises."""
    text = (TEMPLATES / f"{template}.pml").read_text("utf-8")
    tmpl = string.Template(text)
    wanted = set(tmpl.get_identifiers())
    if wanted != set(values):
        raise GenerationError(
            f"template {template}.pml: missing values {sorted(wanted - set(values))}, "
            f"unused values {sorted(set(values) - wanted)}"
        )
    return tmpl.substitute({k: str(v) for k, v in values.items()})


class Binding(dict):
    """What a caller presents to the store, by placeholder; a placeholder it lacks is a generation error."""

    def __init__(self, actor: str, what: str, values: Mapping[str, str]):
        super().__init__(values)
        self.actor, self.what = actor, what

    def __missing__(self, key: str) -> str:
        raise GenerationError(f"{self.what}: actor {self.actor!r} presents no {key!r} (see ACTOR_ARGS)")


def placeholders(template: str) -> set[str]:
    """The ``{names}`` of a translation (a guard or effect template in ``str.format`` syntax)."""
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def block(text: str, n: int) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), " " * n)


def any_of(var: str, values: Iterable[str]) -> str:
    vals = list(values)
    if not vals:
        return "false"
    return "(" + " || ".join(f"{var} == {v}" for v in vals) + ")"


def one_kind(t: Table, kind: str) -> str:
    names = [s.name for s in t.states.values() if s.kind == kind]
    if len(names) != 1:
        raise GenerationError(f"the model expects exactly one state of kind {kind!r}, found {names}")
    return names[0]


def kind_states(t: Table, *kinds: str) -> list[str]:
    return [s.name for s in t.states.values() if s.kind in kinds]


def property_switches(properties: Iterable[str], first: int = 1) -> str:
    """One constant per property: on when ``CHECK`` is 0 (all) or its number."""
    return "\n".join(f"byte {name} = (CHECK == 0 || CHECK == {i});" for i, name in enumerate(properties, start=first))


def property_doc(properties: Mapping[str, str]) -> str:
    """The properties as the model's header comment lists them."""
    return "\n".join(
        f" * {name}:\n" + textwrap.indent(textwrap.fill(doc, 92), " *   ") for name, doc in properties.items()
    )
