"""Generated docs match the table; the docs never claim exactly-once delivery (docs/design.md#one-table-read-by-everything)."""

import shutil
from pathlib import Path

from atmostonce.table import table
from tools.docgen import GENERATED, anchors, lint_claims, lint_links, main, render_state_machine

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


def _repo_with(tmp_path, design: str):
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "design.md").write_text(design)
    return tmp_path


def test_anchors_are_headings_named_as_github_does_and_explicit_ids():
    text = '# The model and `transitions`\n\n## Leases, fencing: the clock\n\n## Limits\n\n## Limits\n\n<a id="rule-x"></a>\n'
    assert anchors(text) == {"the-model-and-transitions", "leases-fencing-the-clock", "limits", "limits-1", "rule-x"}


def test_a_heading_inside_a_code_block_is_no_anchor():
    assert anchors("```sh\n# not a heading\n```\n") == set()


def test_a_link_to_a_missing_anchor_is_named(tmp_path):
    root = _repo_with(tmp_path, "# Design\n\n## Leases\n\nSee [leases](#leases) and [gone](#the-gate).\n")
    assert lint_links(root) == [f"{root / 'docs' / 'design.md'}: link to a missing anchor: #the-gate"]


def test_a_link_to_a_missing_page_is_named(tmp_path):
    root = _repo_with(tmp_path, "# Design\n\nSee [the runbook](runbook.md).\n")
    assert lint_links(root) == [f"{root / 'docs' / 'design.md'}: link to a missing file: runbook.md"]


def test_a_code_citation_of_a_missing_section_is_named(tmp_path):
    root = _repo_with(tmp_path, '# Design\n\n## Leases\n\n<a id="asymmetric-lease-expiry"></a>Text.\n')
    cite = "docs/design.md#"  # split, so that this file cites nothing itself
    (root / "reference").mkdir()
    (root / "reference" / "core.py").write_text(
        f'"""Cites {cite}leases and {cite}asymmetric-lease-expiry."""\n# {cite}seed-004\n'
    )
    assert lint_links(root) == [f"{root / 'reference' / 'core.py'}: cites a missing section: {cite}seed-004"]


def test_docs_check_fails_on_a_broken_link(tmp_path, capsys):
    root = tmp_path
    shutil.copytree(ROOT / "docs", root / "docs")
    with (root / "docs" / "design.md").open("a", encoding="utf-8") as f:
        f.write("\nSee [gone](#no-such-section).\n")
    assert main(["--root", str(root), "--check"]) == 1
    assert capsys.readouterr().err == f"{root / 'docs' / 'design.md'}: link to a missing anchor: #no-such-section\n"
