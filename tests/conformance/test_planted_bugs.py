"""The suite's own mutation score: every planted bug is caught by at least two cases.

``tests/conformance/planted_bugs.py`` plants each classic bug in the reference model, one at a
time; the suite must fail every such model in at least two cases (different case ids), each
failure naming the rule the bug breaks, and pass the clean model. The score table in
docs/conformance.md is checked here, so it cannot drift (``python -m tests.conformance.planted_bugs``
rewrites it; ``python -m tests.conformance.identity_vectors`` rewrites the identity vectors).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from atmostonce.conformance import load_cases, run_suite
from atmostonce.conformance.runner import FAILED
from tests.conformance import identity_vectors
from tests.conformance.planted_bugs import BUGS, SCORE_BEGIN, SCORE_END, catches, driver, score_markdown

pytestmark = pytest.mark.slow  # the whole suite once per planted bug: `make test`, not `make quick`

CASES = load_cases()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"


@pytest.fixture(scope="module")
def caught():
    return catches(CASES)


def test_the_clean_catalogue_passes_every_case():
    d = driver(None)
    report = run_suite(d, CASES)
    assert report.failed == [], report.summary()
    assert len(report.passed) == len(CASES)


def test_the_catalogue_holds_the_twelve_bugs_of_issue_23():
    assert len(BUGS) >= 12


@pytest.mark.parametrize("bug", list(BUGS))
def test_every_planted_bug_is_caught_by_two_cases_naming_the_rule(bug, caught):
    results = caught[bug]
    ids = {r.case.id for r in results}
    assert len(ids) >= 2, f"{bug} is caught by {sorted(ids) or 'no case'}"
    assert all(r.status == FAILED for r in results), [(r.case.id, r.message) for r in results if r.status != FAILED]
    names = BUGS[bug].names
    for r in results:
        said = f"{r.case.rule}\n{r.case.description}\n{r.message}"
        assert any(n in said for n in names), f"{r.case.id} catches {bug} without naming any of {names}:\n{said}"


def test_the_score_in_the_docs_is_the_measured_one(caught):
    text = DOCS.read_text("utf-8")
    start, end = text.index(SCORE_BEGIN), text.index(SCORE_END) + len(SCORE_END)
    assert text[start:end] == score_markdown(caught, len(CASES)), (
        "docs/conformance.md's score is stale: run python -m tests.conformance.planted_bugs"
    )


def test_the_identity_vectors_are_the_reference_functions_values():
    assert identity_vectors.PATH.read_text("utf-8") == identity_vectors.render(), (
        "spec/conformance/identity_vectors.json is stale: run python -m tests.conformance.identity_vectors"
    )
    ids = {c.id for c in CASES if c.source == "identity_vectors.json"}
    assert len(ids) == len(identity_vectors.DELIVERY) + len(identity_vectors.SOURCE)
