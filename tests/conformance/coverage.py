"""Which cases witness each guard and each outcome mapping of the loaded tables (docs/conformance.md,
"How much the cases cover"). Every name comes from the tables; nothing here lists one.

* A case witnesses a **guard** when one of its steps expects a refusal by that guard alone
  (``"refused": "<guard>"``; a ``refused_by_any`` step names no single guard).
* A case witnesses an **outcome mapping** (an outcome of ``spec/table.toml`` with an ``event``) when
  an accepted step either runs the runtime (``dispatch``, ``dispatch_pending``, ``sweep``,
  ``reconcile``) and expects a result naming the outcome (as the ``outcome``, or as a count above 0),
  runs the mapped event itself and expects the outcome's state, or expects the outcome's state with a
  history that ends in (or contains) the mapped event (an event moved by another operation, such as
  ``restore_fence`` by ``declare_restore``); when several outcomes map to one event, the step must
  also name the outcome in its arguments (its ``reason``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from atmostonce.conformance import RUNTIME_OPS
from atmostonce.conformance.cases import Case
from atmostonce.table import MACHINES, machine, table

__all__ = ["all_guards", "guard_witnesses", "outcome_mappings", "outcome_witnesses"]


def all_guards() -> list[str]:
    """The transition table's guard catalogue, then the approval and claim machines' guards."""
    names = list(table().guards)
    for m in MACHINES:
        names += [g for g in machine(m).guards if g not in names]
    return names


def outcome_mappings() -> dict[str, tuple[str, str]]:
    """outcome name -> (event, state), for every outcome the table maps to an event."""
    return {name: (o.event, o.state) for name, o in table().outcomes.items() if o.event}


def _mentions(value: Any, name: str) -> bool:
    if value == name:
        return True
    if isinstance(value, Mapping):
        for k, v in value.items():
            if k == name and not (isinstance(v, int) and not isinstance(v, bool) and v == 0):
                return True
            if _mentions(v, name):
                return True
    if isinstance(value, list):
        return any(_mentions(v, name) for v in value)
    return False


def _ends_in(expect: Mapping[str, Any], event: str) -> bool:
    events = expect.get("history_events")
    if isinstance(events, list):
        return bool(events) and events[-1] == event
    return isinstance(events, Mapping) and events.get("contains") == event


def _steps(case: Case) -> Iterator[Mapping[str, Any]]:
    return (s for s in case.steps if "op" in s)


def guard_witnesses(cases: Iterable[Case]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for c in cases:
        for s in _steps(c):
            if "refused" in s["expect"]:
                out[s["expect"]["refused"]].add(c.id)
    return {g: out.get(g, set()) for g in all_guards()}


def outcome_witnesses(cases: Iterable[Case]) -> dict[str, set[str]]:
    mappings = outcome_mappings()
    per_event: dict[str, int] = defaultdict(int)
    for event, _ in mappings.values():
        per_event[event] += 1
    out: dict[str, set[str]] = {name: set() for name in mappings}
    for c in cases:
        for s in _steps(c):
            expect = s["expect"]
            if not expect.get("accepted"):
                continue
            for name, (event, state) in mappings.items():
                if s["op"] in RUNTIME_OPS:
                    if _mentions(expect.get("result"), name):
                        out[name].add(c.id)
                elif expect.get("state") == state and (s["op"] == event or _ends_in(expect, event)):
                    if per_event[event] == 1 or _mentions(s.get("args", {}), name):
                        out[name].add(c.id)
    return out
