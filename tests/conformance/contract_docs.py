"""The generated parts of docs/conformance.md: every outcome name of the table, and how many cases
witness each guard and each outcome mapping (``python -m tests.conformance.contract_docs`` rewrites
them; ``tests/conformance/test_coverage.py`` fails while they are stale)."""

from __future__ import annotations

from pathlib import Path

from atmostonce.conformance import load_cases
from atmostonce.table import table
from tests.conformance.coverage import guard_witnesses, outcome_witnesses

DOCS = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
OUTCOMES_BEGIN, OUTCOMES_END = "<!-- outcomes:begin -->", "<!-- outcomes:end -->"
COVERAGE_BEGIN, COVERAGE_END = "<!-- coverage:begin -->", "<!-- coverage:end -->"


def outcomes_markdown() -> str:
    lines = [OUTCOMES_BEGIN, "| outcome | recorded by | lands in | meaning |", "|---|---|---|---|"]
    for name, o in table().outcomes.items():
        by = f"`{o.event}`" if o.event else "nothing (a runtime report; no move)"
        lines.append(f"| `{name}` | {by} | `{o.state}` | {o.meaning} |")
    lines.append(OUTCOMES_END)
    return "\n".join(lines)


def coverage_markdown(cases=None) -> str:
    cases = load_cases() if cases is None else cases
    guards, outcomes = guard_witnesses(cases), outcome_witnesses(cases)
    lines = [
        COVERAGE_BEGIN,
        f"Every one of the {len(guards)} guards is seen refusing alone in at least "
        f"{min(len(v) for v in guards.values())} cases, and every one of the {len(outcomes)} outcome mappings "
        f"is exercised by at least {min(len(v) for v in outcomes.values())} ({len(cases)} cases).",
        "",
        "| guard or outcome | cases |",
        "|---|---|",
    ]
    lines += [f"| guard `{g}` | {len(ids)} |" for g, ids in guards.items()]
    lines += [f"| outcome `{o}` | {len(ids)} |" for o, ids in outcomes.items()]
    lines.append(COVERAGE_END)
    return "\n".join(lines)


def _splice(text: str, begin: str, end: str, block: str) -> str:
    start, stop = text.index(begin), text.index(end) + len(end)
    return text[:start] + block + text[stop:]


def render(text: str) -> str:
    text = _splice(text, OUTCOMES_BEGIN, OUTCOMES_END, outcomes_markdown())
    return _splice(text, COVERAGE_BEGIN, COVERAGE_END, coverage_markdown())


if __name__ == "__main__":
    DOCS.write_text(render(DOCS.read_text("utf-8")), "utf-8")
