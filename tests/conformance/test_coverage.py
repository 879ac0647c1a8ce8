"""No catch rests on one case: at least two independent cases witness every guard and every outcome
mapping of the tables (docs/conformance.md, "How much the cases cover"). The names come from the
loaded tables, so a new guard or outcome without two cases fails here."""

from __future__ import annotations

import pytest

from atmostonce.conformance import load_cases
from tests.conformance.coverage import all_guards, guard_witnesses, outcome_mappings, outcome_witnesses

CASES = load_cases()
GUARDS = guard_witnesses(CASES)
OUTCOMES = outcome_witnesses(CASES)


def test_the_names_come_from_the_tables():
    assert set(GUARDS) == set(all_guards()) and len(GUARDS) > 30
    assert set(OUTCOMES) == set(outcome_mappings()) and len(OUTCOMES) > 20


@pytest.mark.parametrize("guard", list(GUARDS))
def test_every_guard_is_seen_refusing_in_two_cases(guard):
    assert len(GUARDS[guard]) >= 2, f"{guard} refuses only in {sorted(GUARDS[guard]) or 'no case'}"


@pytest.mark.parametrize("outcome", list(OUTCOMES))
def test_every_outcome_mapping_is_exercised_by_two_cases(outcome):
    assert len(OUTCOMES[outcome]) >= 2, f"{outcome} is exercised only by {sorted(OUTCOMES[outcome]) or 'no case'}"


def test_the_outcome_list_and_the_coverage_in_the_docs_are_current():
    from tests.conformance.contract_docs import DOCS, render

    text = DOCS.read_text("utf-8")
    assert text == render(text), "docs/conformance.md is stale: run python -m tests.conformance.contract_docs"
