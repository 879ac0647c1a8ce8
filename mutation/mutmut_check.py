"""Fail when mutmut left a mutant alive that ``mutation/mutmut_explained.json`` does not explain.

``mutmut run`` exits 0 however many mutants survive, so this is the gate. It reads the counts of
``mutmut export-cicd-stats`` (``mutants/mutmut-cicd-stats.json``) and, because that file has no
names, the per-file ``.meta`` results beside it, then requires, for the mutants in scope (the globs
the run was given; all when none):

* every one was checked (a run that stopped early is not a pass);
* every one not detected (survived, no tests, suspicious, ...) has a one-line reason in the
  explained file;
* the names agree with the stats file (as many survivors in the ``.meta`` files as it counts).

    python -m mutation.mutmut_check [--mutants DIR] [--explained FILE] [GLOB ...]

Exit 0 when clean, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "build" / "mutmut" / "mutants"
EXPLAINED = ROOT / "mutation" / "mutmut_explained.json"

# mutmut 3.8's exit-code meanings (mutmut.stats.status_by_exit_code); anything else is "suspicious"
STATUS_BY_EXIT_CODE: dict[int | None, str] = {
    1: "killed",
    3: "killed",
    0: "survived",
    5: "no tests",
    2: "check was interrupted by user",
    None: "not checked",
    33: "no tests",
    34: "skipped",
    35: "suspicious",
    36: "timeout",
    37: "caught by type check",
    -24: "timeout",
    24: "timeout",
    152: "timeout",
    255: "timeout",
    -11: "segfault",
    -9: "segfault",
}
DETECTED = frozenset({"killed", "timeout", "caught by type check"})


def status_of(exit_code: int | None) -> str:
    return STATUS_BY_EXIT_CODE.get(exit_code, "suspicious")


def module_of(name: str) -> str:
    """``atmostonce.identity.x_claim_id__mutmut_3`` -> ``atmostonce.identity``."""
    parts = name.split(".")
    for i in range(len(parts) - 1, -1, -1):
        if parts[i].startswith(("x_", "xǁ")):
            return ".".join(parts[:i])
    return name.rpartition(".")[0]


def load_statuses(mutants: Path) -> dict[str, str]:
    """Mutant name -> status, from every ``.meta`` file under ``mutants``."""
    out: dict[str, str] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        data = json.loads(meta.read_text("utf-8"))
        for name, code in data.get("exit_code_by_key", {}).items():
            out[name] = status_of(code)
    return out


def in_scope(name: str, scope: Iterable[str]) -> bool:
    scope = list(scope)
    return not scope or any(name == g or fnmatch.fnmatch(name, g) for g in scope)


def check(
    stats: Mapping[str, int],
    statuses: Mapping[str, str],
    explained: Mapping[str, str],
    scope: Iterable[str] = (),
) -> list[str]:
    """Problems (empty when clean) for the mutants in ``scope``; see the module docstring."""
    scope = list(scope)
    problems: list[str] = []
    selected = {n: s for n, s in statuses.items() if in_scope(n, scope)}
    if not selected:
        problems.append(f"no mutants match the scope {scope or ['*']}")
    survivors_everywhere = sum(1 for s in statuses.values() if s == "survived")
    if stats.get("survived", 0) != survivors_everywhere:
        problems.append(
            f"export-cicd-stats counts {stats.get('survived', 0)} survivors but the .meta files name "
            f"{survivors_everywhere}: stale stats, run `mutmut export-cicd-stats` again"
        )
    for name, status in sorted(selected.items()):
        if status in DETECTED:
            continue
        if status == "not checked":
            problems.append(f"{name}: not checked (the run stopped before it)")
        elif not str(explained.get(name, "")).strip():
            problems.append(f"{name}: {status}, and not explained in mutation/mutmut_explained.json")
    return problems


def stale_explanations(
    statuses: Mapping[str, str], explained: Mapping[str, str], scope: Iterable[str] = ()
) -> list[str]:
    """Explained mutants in scope that were detected after all (the reason no longer applies)."""
    return sorted(n for n in explained if in_scope(n, scope) and statuses.get(n) in DETECTED)


def load_explained(path: Path = EXPLAINED) -> dict[str, str]:
    if not path.exists():
        return {}
    return dict(json.loads(path.read_text("utf-8")).get("equivalent", {}))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mutation.mutmut_check")
    ap.add_argument("--mutants", type=Path, default=MUTANTS, help="mutmut's mutants/ folder")
    ap.add_argument("--explained", type=Path, default=EXPLAINED)
    ap.add_argument("scope", nargs="*", help="mutant name globs the run covered (default: all)")
    a = ap.parse_args(argv)
    stats_file = a.mutants / "mutmut-cicd-stats.json"
    if not stats_file.exists():
        print(f"{stats_file} is missing: run `mutmut export-cicd-stats` after `mutmut run`")
        return 1
    stats = json.loads(stats_file.read_text("utf-8"))
    statuses = load_statuses(a.mutants)
    explained = load_explained(a.explained)
    problems = check(stats, statuses, explained, a.scope)
    selected = [s for n, s in statuses.items() if in_scope(n, a.scope)]
    detected = sum(1 for s in selected if s in DETECTED)
    print(f"mutmut: {len(selected)} mutants in scope, {detected} detected, {len(problems)} problems")
    for name in stale_explanations(statuses, explained, a.scope):
        print(f"note: {name} is explained as equivalent but was detected; drop it from the explained file")
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
