"""The docgen command line in detail: arguments, --write and --check, exit codes, messages, encodings,
and the exactly-once lint's sentence splitting and report text."""

import re
import shutil
from pathlib import Path

import pytest

from tools import docgen
from tools.docgen import GENERATED, lint_claims, main, render_state_machine

ROOT = Path(__file__).resolve().parents[1]

# A page and a doc with text outside ASCII: the spec's meanings are free text and may gain such characters.
_NON_ASCII_PAGE = "# Zustände — état «parked»\n"
_NON_ASCII_DOC = "Café notes — exactly-once delivery is not something a lease can promise.\n"


def _repo(tmp_path: Path, page: str | None = None) -> Path:
    """A repository root whose generated page is current (or holds `page`)."""
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # the pages the generated one links to
    (tmp_path / "docs" / GENERATED).write_text(render_state_machine() if page is None else page, "utf-8")
    return tmp_path


# --- arguments -------------------------------------------------------------------------------------------


def test_help_names_the_module_command_and_describes_root(monkeypatch, capsys):
    monkeypatch.setenv("COLUMNS", "100")  # argparse wraps help to the terminal width
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: python -m tools.docgen ")
    assert re.search(r"^  --root ROOT +repository root holding docs/$", out, re.MULTILINE), out


def test_a_mode_is_required(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--root", "."])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m tools.docgen ")
    assert "one of the arguments --write --check is required" in err


def test_write_is_a_flag_taking_no_value(tmp_path, capsys):
    # --write directly followed by another option: a flag, so --root still parses as --root
    assert main(["--write", "--root", str(tmp_path)]) == 0
    assert (tmp_path / "docs" / GENERATED).read_text("utf-8") == render_state_machine()


def test_root_defaults_to_the_current_directory(tmp_path, monkeypatch, capsys):
    shutil.copytree(ROOT / "docs", tmp_path / "docs")  # the pages the generated one links to
    (tmp_path / "docs" / GENERATED).unlink()
    monkeypatch.chdir(tmp_path)
    assert main(["--write"]) == 0
    assert (tmp_path / "docs" / GENERATED).read_text("utf-8") == render_state_machine()
    assert capsys.readouterr().out == f"wrote {Path('docs') / GENERATED}\n"
    assert main(["--check"]) == 0


# --- --write ---------------------------------------------------------------------------------------------


def test_write_creates_missing_directories_writes_the_page_and_says_so(tmp_path, capsys):
    root = tmp_path / "new" / "repo"  # neither the root nor docs/ exists yet
    assert main(["--root", str(root), "--write"]) == 0
    target = root / "docs" / GENERATED
    assert target.read_text("utf-8") == render_state_machine()
    captured = capsys.readouterr()
    assert captured.out == f"wrote {target}\n"
    assert captured.err == ""
    # the pages the generated one links to
    shutil.copytree(ROOT / "docs", root / "docs", dirs_exist_ok=True, ignore=shutil.ignore_patterns(GENERATED))
    assert main(["--root", str(root), "--check"]) == 0


def test_write_replaces_a_stale_page_in_an_existing_docs_folder(tmp_path, capsys):
    root = _repo(tmp_path, page="old\n")
    (root / "docs" / "other.md").write_text("kept\n", "utf-8")
    assert main(["--root", str(root), "--write"]) == 0
    assert (root / "docs" / GENERATED).read_text("utf-8") == render_state_machine()
    assert (root / "docs" / "other.md").read_text("utf-8") == "kept\n"
    assert capsys.readouterr().out == f"wrote {root / 'docs' / GENERATED}\n"


def test_write_and_check_use_utf8_whatever_the_locale(tmp_path, monkeypatch, ascii_locale, capsys):
    monkeypatch.setattr(docgen, "render_state_machine", lambda t=None: _NON_ASCII_PAGE)
    assert main(["--root", str(tmp_path), "--write"]) == 0
    assert (tmp_path / "docs" / GENERATED).read_bytes() == _NON_ASCII_PAGE.encode("utf-8")
    assert main(["--root", str(tmp_path), "--check"]) == 0
    assert capsys.readouterr().err == ""


def test_check_reads_docs_as_utf8_whatever_the_locale(tmp_path, ascii_locale, capsys):
    root = _repo(tmp_path)
    (root / "docs" / "notes.md").write_bytes(_NON_ASCII_DOC.encode("utf-8"))
    assert main(["--root", str(root), "--check"]) == 0
    (root / "docs" / "claims.md").write_bytes("Zustellung — we deliver exactly once.\n".encode())
    assert main(["--root", str(root), "--check"]) == 1
    assert capsys.readouterr().err == (
        f"{root / 'docs' / 'claims.md'}: exactly-once claim: 'Zustellung — we deliver exactly once.'\n"
    )


# --- --check messages ------------------------------------------------------------------------------------


def test_a_stale_page_is_reported_on_stderr_with_the_fix(tmp_path, capsys):
    root = _repo(tmp_path, page="old\n")
    assert main(["--root", str(root), "--check"]) == 1
    captured = capsys.readouterr()
    # first the stale page; then the links of design.md into the sections the stale page lacks
    assert captured.err.splitlines()[0] == f"{root / 'docs' / GENERATED} is stale: run `make docs`"
    assert captured.out == ""


def test_a_missing_page_is_reported_as_stale(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--check"]) == 1
    assert capsys.readouterr().err == f"{tmp_path / 'docs' / GENERATED} is stale: run `make docs`\n"


def test_a_claim_is_reported_on_stderr_with_file_and_sentence(tmp_path, capsys):
    root = _repo(tmp_path)
    (root / "docs" / "bad.md").write_text("Intro is fine.\nOur outbox gives exactly-once delivery.\n", "utf-8")
    assert main(["--root", str(root), "--check"]) == 1
    captured = capsys.readouterr()
    assert (
        captured.err == f"{root / 'docs' / 'bad.md'}: exactly-once claim: 'Our outbox gives exactly-once delivery.'\n"
    )
    assert captured.out == ""


def test_the_readme_is_linted_too(tmp_path, capsys):
    root = _repo(tmp_path)
    (root / "README.md").write_text("# atmostonce\n\nEvery post is delivered exactly once.\n", "utf-8")
    assert main(["--root", str(root), "--check"]) == 1
    assert capsys.readouterr().err == (
        f"{root / 'README.md'}: exactly-once claim: 'Every post is delivered exactly once.'\n"
    )
    (root / "README.md").write_text("# atmostonce\n\nAt most once, never exactly once.\n", "utf-8")
    assert main(["--root", str(root), "--check"]) == 0


# --- the lint itself -------------------------------------------------------------------------------------


def test_lint_judges_each_sentence_on_its_own():
    # the denial in the first sentence does not excuse the claim in the second
    assert lint_claims("Exactly-once is not offered. Each post goes out exactly once!") == [
        "Each post goes out exactly once!"
    ]
    assert lint_claims("Is it exactly once? No, never.") == ["Is it exactly once?"]


def test_lint_judges_each_paragraph_on_its_own():
    # a heading without a full stop is its own sentence when a blank line follows it
    assert lint_claims("## Never lose a post\n\nWe deliver exactly-once") == ["We deliver exactly-once"]


def test_lint_reports_a_sentence_with_its_whitespace_collapsed():
    assert lint_claims("We  deliver\n   every post\texactly once.") == ["We deliver every post exactly once."]


def test_lint_cuts_a_long_sentence_to_160_characters():
    sentence = "We deliver exactly once " + "and on time " * 20 + "forever."
    assert len(sentence) > 161
    (reported,) = lint_claims(sentence)
    assert reported == sentence[:160]
    assert len(reported) == 160
