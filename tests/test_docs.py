"""Generated docs match the table; the docs never claim exactly-once delivery (issue 2)."""

from pathlib import Path

from atmostonce.table import table
from tools.docgen import GENERATED, lint_claims, main, render_state_machine

ROOT = Path(__file__).resolve().parents[1]


def test_committed_generated_docs_match_the_table():
    assert (ROOT / "docs" / GENERATED).read_text("utf-8") == render_state_machine()


def test_generated_docs_name_every_state_event_guard_and_outcome():
    text = render_state_machine()
    t = table()
    for name in [*t.states, *t.events, *t.guards, *t.outcomes]:
        assert f"`{name}`" in text, name


def test_docs_check_passes_on_the_repository():
    assert main(["--root", str(ROOT), "--check"]) == 0


def test_docs_check_fails_on_a_stale_generated_page(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / GENERATED).write_text("old\n")
    assert main(["--root", str(tmp_path), "--check"]) == 1


def test_claim_lint_flags_a_promise_and_passes_a_denial():
    assert lint_claims("We deliver every post exactly once.") != []
    assert lint_claims("Exactly-once delivery guaranteed!") != []
    assert lint_claims("A lease cannot promise exactly-once publication.") == []
    assert lint_claims("This is not an exactly once system.") == []


def test_docs_check_fails_on_an_exactly_once_claim(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / GENERATED).write_text(render_state_machine())
    (tmp_path / "docs" / "bad.md").write_text("Our outbox gives exactly-once delivery.\n")
    assert main(["--root", str(tmp_path), "--check"]) == 1
