"""The refusing-set rule (docs/conformance.md, "When several guards refuse"): a step that several
guards refuse accepts any guard of that set, because the table does not order an event's guards.

The reference model is run over every case with each refused move instrumented: besides the guard it
reports, it evaluates every other guard of the event on the same row and arguments. A step whose move
more than one guard refuses must say ``refused_by_any`` with exactly that set (a single ``refused``
would fail a correct implementation that checks the guards in another order), and a ``refused_by_any``
step must list exactly the set the model finds.
"""

from __future__ import annotations

import pytest

from atmostonce.conformance import Implementation, ManualClock, StoreDriver, load_cases, run_case
from atmostonce.conformance.cases import Case
from atmostonce.conformance.runner import PASSED
from atmostonce.guards import GUARDS
from atmostonce.model import MemoryStore
from atmostonce.table import table

pytestmark = pytest.mark.slow

CASES = load_cases()
T = table()


class SetRecordingStore(MemoryStore):
    """The model, recording for every refused table move the whole set of guards that fail."""

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.refusing_sets: list[tuple[str, frozenset[str]]] = []

    def _apply(self, event, key, args):
        ev = self.table.event(event)
        with self._lock:
            row = self._rows.get(key)
            failing = frozenset()
            if row is not None and row["state"] in ev.sources:
                now = self.now()
                failing = frozenset(g for g in ev.guards if not GUARDS[g](row, args, now, self))
        try:
            return super()._apply(event, key, args)
        except Exception:
            if len(failing) > 1:
                self.refusing_sets.append((event, failing))
            raise


def _run(case: Case) -> list[tuple[str, frozenset[str]]]:
    stores: list[SetRecordingStore] = []

    def factory() -> Implementation:
        clock = ManualClock()
        stores.append(SetRecordingStore(clock=clock))
        return Implementation(stores[-1], clock.advance)

    result = run_case(StoreDriver(factory), case)
    assert result.status == PASSED, result.message
    return [s for store in stores for s in store.refusing_sets]


def _declared(case: Case) -> list[tuple[str, frozenset[str]]]:
    return [
        (s["op"], frozenset(s["expect"]["refused_by_any"]))
        for s in case.steps
        if "refused_by_any" in s.get("expect", {})
    ]


def test_the_model_finds_several_refusing_guards_somewhere():
    """The check below is not vacuous: at least one case meets a move that two guards refuse."""
    assert any(_run(c) for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_a_move_several_guards_refuse_accepts_any_of_them(case):
    found = set(_run(case))
    declared = set(_declared(case))
    assert found == declared, (
        f"moves refused by several guards: {sorted((e, sorted(g)) for e, g in found)}; "
        f"declared refused_by_any: {sorted((e, sorted(g)) for e, g in declared)}"
    )
    for op, guards in declared:
        assert guards <= set(T.event(op).guards), (op, guards)
