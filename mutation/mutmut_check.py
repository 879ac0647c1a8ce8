"""Fail when mutmut left a mutant alive that ``mutation/mutmut_explained.json`` does not explain, or when
recorded mutation evidence describes a function body that is no longer the one in the tree.

``mutmut run`` exits 0 however many mutants survive, so this is the gate. It reads the counts of
``mutmut export-cicd-stats`` (``mutants/mutmut-cicd-stats.json``) and, because that file has no
names, the per-file ``.meta`` results beside it, then requires, for the mutants in scope (the globs
the run was given; all when none):

* every one was checked (a run that stopped early is not a pass);
* every one not detected (survived, no tests, suspicious, ...) has a one-line reason in the
  explained file, and that reason was not written for another body of the function;
* the run's mutants were generated from the function bodies now in the tree;
* the names agree with the stats file (as many survivors in the ``.meta`` files as it counts).

Mutant names are positions: ``x_f__mutmut_9`` is the ninth mutation mutmut makes in the body of
``f``, so an edit of ``f`` renumbers them and an old verdict or explanation would silently describe
another mutation. Every verdict in ``mutation/mutmut_results.json`` and every explanation therefore
carries ``function_hash``, mutmut's own hash of the function it mutated (sha256 of the function's
``ast.dump``, first 12 hex digits: the original body, decorators and signature, not its line
numbers; ``hash_by_function_name`` in mutmut's ``.meta`` files). An entry whose hash differs from the
function's hash in the tree now is **stale**: inside the scope that fails, outside it is listed as a
warning (a slice run re-ran only its own functions, so it cannot vouch for the rest; a full check
has everything in scope and so fails on any stale entry). Entries recorded before hashes existed
carry the hash of the body at migration and ``unverified_hash``: nobody knows that the verdict was
given on that body, so they are counted and reported, never taken as fresh, and they become stale as
soon as the function changes.

    python -m mutation.mutmut_check [--mutants DIR] [--explained FILE] [--results FILE] [GLOB ...]
    python -m mutation.mutmut_check --confirm NAME ...   # a person re-read these survivors on this body
    python -m mutation.mutmut_check --explain FILE       # reasons (JSON: name -> reason) for recorded survivors
    python -m mutation.mutmut_check --prune              # drop reasons for gone or detected mutants

Exit 0 when clean, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import argparse
import ast
import fnmatch
import hashlib
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
MUTANTS = ROOT / "build" / "mutmut" / "mutants"
EXPLAINED = ROOT / "mutation" / "mutmut_explained.json"
RESULTS = ROOT / "mutation" / "mutmut_results.json"
# import name -> source root in this repository (the staging folder's links, mutation/mutmut_run.py)
SOURCE_ROOT_OF = {"atmostonce": "reference", "atmostonce_sql": "adapters"}
# mutmut's separator in a method's mangled name: xǁClassǁmethod
SEP = "ǁ"

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


def function_of(name: str) -> str:
    """``atmostonce.errors.xǁRejectedǁ__init____mutmut_2`` -> ``xǁRejectedǁ__init__`` (mutmut's key in
    ``hash_by_function_name``)."""
    module = module_of(name)
    return name[len(module) + 1 :].partition("__mutmut_")[0] if "__mutmut_" in name else name[len(module) + 1 :]


def function_hashes(source: str) -> dict[str, str]:
    """Mangled function name -> hash, for every function and method in ``source``; the same hash as
    mutmut 3.8's ``compute_function_hashes`` (tests/test_mutmut_gate.py holds the two equal)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return {}
    out: dict[str, str] = {}

    def visit(stmts: list[ast.stmt], cls: str = "") -> None:
        for node in stmts:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                key = f"x{SEP}{cls}{SEP}{node.name}" if cls else f"x_{node.name}"
                out[key] = hashlib.sha256(ast.dump(node, annotate_fields=False).encode()).hexdigest()[:12]
            elif isinstance(node, ast.ClassDef):
                visit(node.body, f"{cls}.{node.name}" if cls else node.name)

    visit(tree.body)
    return out


def source_file(module: str, root: Path = ROOT) -> Path | None:
    """The file in this checkout that mutmut mutated for ``module`` (``atmostonce.identity`` ->
    ``reference/atmostonce/identity.py``; mutmut drops ``__init__`` from the names)."""
    top, _, rest = module.partition(".")
    if top not in SOURCE_ROOT_OF:
        return None
    base = root / SOURCE_ROOT_OF[top] / top
    for part in filter(None, rest.split(".")):
        base = base / part
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


class TreeHashes:
    """The hash of each function as it is in the tree now, read once per module."""

    def __init__(self, root: Path = ROOT) -> None:
        self.root = root
        self._by_module: dict[str, dict[str, str]] = {}

    def of(self, name: str) -> str | None:
        """The current hash of the function mutant ``name`` mutates; None when that function is gone."""
        return self.function(module_of(name), function_of(name))

    def function(self, module: str, func: str) -> str | None:
        if module not in self._by_module:
            path = source_file(module, self.root)
            self._by_module[module] = function_hashes(path.read_text("utf-8")) if path else {}
        return self._by_module[module].get(func)


def head_commit(root: Path = ROOT) -> str:
    """The short commit of the checkout, with ``-dirty`` when its source roots have uncommitted changes
    (then only the function hashes say which bodies the verdicts describe)."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return ""

    commit = git("rev-parse", "--short=12", "HEAD") or "unknown"
    return commit + ("-dirty" if git("status", "--porcelain", "--", *SOURCE_ROOT_OF.values()) else "")


FRESH, STALE, UNVERIFIED = "fresh", "stale", "unverified hash"


def freshness(entry: Mapping[str, Any], current: str | None) -> str:
    """``fresh`` when the entry was recorded on the body now in the tree; ``stale`` when the function
    changed (or is gone) since; ``unverified hash`` when the entry predates hashes and its function has
    not changed since the hashes were introduced."""
    recorded = entry.get("function_hash")
    if recorded is None:
        return UNVERIFIED
    if recorded != current:
        return STALE
    return UNVERIFIED if entry.get("unverified_hash") else FRESH


@dataclass
class Evidence:
    """What the check found about the recorded verdicts and explanations."""

    stale_in_scope: list[str] = field(default_factory=list)
    stale_outside: list[str] = field(default_factory=list)
    unverified: Counter[str] = field(default_factory=Counter)  # "verdicts" / "explanations" -> count
    unverified_by_module: Counter[str] = field(default_factory=Counter)


def stale_line(kind: str, name: str, entry: Mapping[str, Any], current: str | None) -> str:
    func = f"{module_of(name)}.{function_of(name)}"
    since = entry.get("commit") or "before hashes were recorded"
    now = "is gone" if current is None else f"is now {current}"
    return (
        f"{name}: stale {kind}: function {func} changed since it was recorded "
        f"(recorded on {entry.get('function_hash')} at {since}; the function {now})"
    )


def check_evidence(
    verdicts: Mapping[str, Mapping[str, Any]],
    explained: Mapping[str, Mapping[str, Any]],
    scope: Iterable[str] = (),
    hashes: TreeHashes | None = None,
) -> Evidence:
    """Sort every recorded verdict and explanation by freshness against the tree (see the docstring)."""
    scope = list(scope)
    hashes = TreeHashes() if hashes is None else hashes
    ev = Evidence()
    for kind, entries in (("verdict", verdicts), ("explanation", explained)):
        for name, entry in sorted(entries.items()):
            current = hashes.of(name)
            state = freshness(entry, current)
            if state == STALE:
                line = stale_line(kind, name, entry, current)
                (ev.stale_in_scope if in_scope(name, scope) else ev.stale_outside).append(line)
            elif state == UNVERIFIED:
                ev.unverified[kind + "s"] += 1
                ev.unverified_by_module[module_of(name)] += 1
    return ev


def stale_functions(
    verdicts: Mapping[str, Mapping[str, Any]],
    explained: Mapping[str, Mapping[str, Any]],
    hashes: TreeHashes | None = None,
) -> list[str]:
    """One mutant-name glob per function that still exists and has a stale verdict or explanation
    (``atmostonce.store.xǁOperationsǁcheck__mutmut_*``), sorted: what ``mutmut_run --stale`` re-runs. A
    gone function needs no run: the next record drops its verdicts, since mutmut no longer generates them."""
    hashes = TreeHashes() if hashes is None else hashes
    out: set[str] = set()
    for entries in (verdicts, explained):
        for name, entry in entries.items():
            current = hashes.of(name)
            if current is not None and freshness(entry, current) == STALE:
                out.add(f"{module_of(name)}.{function_of(name)}__mutmut_*")
    return sorted(out)


def load_meta_hashes(mutants: Path) -> dict[str, str]:
    """Qualified function name (``atmostonce.identity.x_claim_id``) -> the hash of the body mutmut generated
    the mutants in ``mutants`` from."""
    out: dict[str, str] = {}
    for meta in sorted(mutants.rglob("*.py.meta")):
        data = json.loads(meta.read_text("utf-8"))
        names = list(data.get("exit_code_by_key", {}))
        module = module_of(names[0]) if names else None
        if module is None:
            continue
        for func, h in data.get("hash_by_function_name", {}).items():
            out[f"{module}.{func}"] = h
    return out


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
    explained: Mapping[str, Mapping[str, Any] | str],
    scope: Iterable[str] = (),
    run_hashes: Mapping[str, str] | None = None,
    hashes: TreeHashes | None = None,
) -> list[str]:
    """Problems (empty when clean) for the mutants of this run in ``scope``; see the module docstring.
    ``run_hashes`` (from the ``.meta`` files) and ``hashes`` (the tree) tie the run to the tree when given."""
    scope = list(scope)
    problems: list[str] = []
    reasons = {n: str(as_explanation(e).get("why", "")).strip() for n, e in explained.items()}
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
        elif not reasons.get(name):
            problems.append(f"{name}: {status}, and not explained in mutation/mutmut_explained.json")
    if run_hashes is not None and hashes is not None:
        for module, func in sorted({(module_of(n), function_of(n)) for n in selected}):
            ran_on, now = run_hashes.get(f"{module}.{func}"), hashes.function(module, func)
            if ran_on is not None and ran_on != now:
                problems.append(
                    f"{module}.{func}: the run's mutants were generated from body {ran_on}, the tree has "
                    f"{now or 'no such function'}: run mutmut again"
                )
    return problems


def explained_but_detected(
    statuses: Mapping[str, str], explained: Mapping[str, Any], scope: Iterable[str] = ()
) -> list[str]:
    """Explained mutants in scope that were detected after all (the reason no longer applies)."""
    return sorted(n for n in explained if in_scope(n, scope) and statuses.get(n) in DETECTED)


def as_explanation(entry: Mapping[str, Any] | str) -> dict[str, Any]:
    """An explanation as a record; a bare string (the format before hashes) has no hash, so it is unverified."""
    return {"why": entry} if isinstance(entry, str) else dict(entry)


def load_explained(path: Path = EXPLAINED) -> dict[str, dict[str, Any]]:
    """Mutant name -> ``{"why", "function_hash", "commit" | "unverified_hash"}``."""
    if not path.exists():
        return {}
    return {n: as_explanation(e) for n, e in json.loads(path.read_text("utf-8")).get("equivalent", {}).items()}


def as_verdict(entry: Mapping[str, Any] | str) -> dict[str, Any]:
    """A recorded verdict as a record; a bare status (the format before hashes) has no hash: unverified."""
    return {"status": entry} if isinstance(entry, str) else dict(entry)


def load_verdicts(path: Path = RESULTS) -> dict[str, dict[str, Any]]:
    """Mutant name -> ``{"status", "function_hash", "commit" | "unverified_hash"}`` from the results file."""
    if not path.exists():
        return {}
    return {n: as_verdict(e) for n, e in json.loads(path.read_text("utf-8")).get("mutants", {}).items()}


def confirm(names: Iterable[str], mutants: Path, path: Path = EXPLAINED, hashes: TreeHashes | None = None) -> list[str]:
    """Stamp the explanations of ``names`` with the function's hash in the tree and the commit: a person
    re-read each mutant (``mutmut show NAME`` in build/mutmut/) on this body and the reason holds. Refused
    (problems returned, nothing written) unless the last run left each one undetected on this very body."""
    hashes = TreeHashes() if hashes is None else hashes
    statuses, run_hashes = load_statuses(mutants), load_meta_hashes(mutants)
    data = json.loads(path.read_text("utf-8"))
    problems: list[str] = []
    commit = head_commit()
    for name in names:
        entry = data.get("equivalent", {}).get(name)
        func = f"{module_of(name)}.{function_of(name)}"
        now = hashes.of(name)
        if entry is None:
            problems.append(f"{name}: not in {path.name}")
        elif statuses.get(name) in DETECTED or statuses.get(name, "not checked") == "not checked":
            problems.append(f"{name}: the last run did not leave it undetected ({statuses.get(name, 'not run')})")
        elif now is None or run_hashes.get(func) != now:
            problems.append(f"{name}: the last run was not on the body in the tree; run it again")
        else:
            data["equivalent"][name] = {"why": as_explanation(entry)["why"], "function_hash": now, "commit": commit}
    if not problems:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return problems


def explain(
    reasons: Mapping[str, str],
    path: Path = EXPLAINED,
    results: Path = RESULTS,
    hashes: TreeHashes | None = None,
) -> list[str]:
    """Write the explanations ``reasons`` (mutant name -> one-line reason) for survivors of *recorded* runs,
    stamped with the function's hash in the tree and the commit, as :func:`confirm` does for the last run.
    Refused (problems returned, nothing written) unless ``mutation/mutmut_results.json`` holds, for each
    name, an undetected verdict recorded on the body now in the tree, and the reason is not blank."""
    hashes = TreeHashes() if hashes is None else hashes
    verdicts = load_verdicts(results)
    data = json.loads(path.read_text("utf-8")) if path.exists() else {"equivalent": {}}
    problems: list[str] = []
    commit = head_commit()
    for name, why in sorted(reasons.items()):
        verdict = verdicts.get(name)
        now = hashes.of(name)
        if not str(why).strip():
            problems.append(f"{name}: a blank reason")
        elif verdict is None:
            problems.append(f"{name}: no recorded verdict")
        elif verdict.get("status") in DETECTED:
            problems.append(f"{name}: recorded as {verdict.get('status')}, nothing to explain")
        elif freshness(verdict, now) != FRESH:
            problems.append(f"{name}: its recorded verdict is not on the body in the tree; run it again")
        else:
            data.setdefault("equivalent", {})[name] = {"why": str(why).strip(), "function_hash": now, "commit": commit}
    if not problems:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return problems


def prune(
    path: Path = EXPLAINED, results: Path = RESULTS, hashes: TreeHashes | None = None, mutants: Path | None = None
) -> list[str]:
    """Drop the explanations that explain nothing any more, and return their names: those whose function is
    gone from the tree, those whose mutant mutmut no longer generates from the body now in the tree (read from
    the ``.meta`` files of the run in ``mutants``, when that run was generated from this body), and those whose
    recorded verdict is a detection on this body (a test kills it after all). A stale explanation of a mutant
    that still exists is kept: it fails the check until a person re-reads it (:func:`confirm`) or a run settles
    it."""
    hashes = TreeHashes() if hashes is None else hashes
    verdicts = load_verdicts(results)
    generated = load_statuses(mutants) if mutants is not None and mutants.is_dir() else {}
    run_hashes = load_meta_hashes(mutants) if generated else {}
    data = json.loads(path.read_text("utf-8"))
    dropped = []
    for name in sorted(data.get("equivalent", {})):
        now, verdict = hashes.of(name), verdicts.get(name, {})
        killed = verdict.get("status") in DETECTED and freshness(verdict, now) == FRESH
        same_body = now is not None and run_hashes.get(f"{module_of(name)}.{function_of(name)}") == now
        if now is None or killed or (same_body and name not in generated):
            dropped.append(name)
            del data["equivalent"][name]
    if dropped:
        path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return dropped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mutation.mutmut_check")
    ap.add_argument("--mutants", type=Path, default=MUTANTS, help="mutmut's mutants/ folder")
    ap.add_argument("--explained", type=Path, default=EXPLAINED)
    ap.add_argument("--results", type=Path, default=RESULTS, help="the recorded verdicts")
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose function bodies count")
    ap.add_argument("--confirm", action="store_true", help="stamp the explanations of the NAMEs given")
    ap.add_argument(
        "--explain",
        type=Path,
        metavar="FILE",
        help="write the reasons in FILE (JSON: name -> reason) for recorded survivors",
    )
    ap.add_argument(
        "--prune",
        action="store_true",
        help="drop the explanations of mutants gone from the tree or recorded as detected on this body",
    )
    ap.add_argument("scope", nargs="*", help="mutant name globs the run covered (default: all)")
    a = ap.parse_args(argv)
    hashes = TreeHashes(a.root)
    if a.prune:
        for name in prune(a.explained, a.results, hashes, a.mutants):
            print(f"dropped {name}")
        return 0
    if a.explain is not None:
        problems = explain(json.loads(a.explain.read_text("utf-8")), a.explained, a.results, hashes)
        for p in problems:
            print("  " + p)
        return 1 if problems else 0
    if a.confirm:
        problems = confirm(a.scope, a.mutants, a.explained, hashes)
        for p in problems:
            print("  " + p)
        return 1 if problems else 0
    stats_file = a.mutants / "mutmut-cicd-stats.json"
    if not stats_file.exists():
        print(f"{stats_file} is missing: run `mutmut export-cicd-stats` after `mutmut run`")
        return 1
    stats = json.loads(stats_file.read_text("utf-8"))
    statuses = load_statuses(a.mutants)
    explained = load_explained(a.explained)
    problems = check(stats, statuses, explained, a.scope, load_meta_hashes(a.mutants), hashes)
    ev = check_evidence(load_verdicts(a.results), explained, a.scope, hashes)
    problems += ev.stale_in_scope
    selected = [s for n, s in statuses.items() if in_scope(n, a.scope)]
    detected = sum(1 for s in selected if s in DETECTED)
    print(f"mutmut: {len(selected)} mutants in scope, {detected} detected, {len(problems)} problems")
    for name in explained_but_detected(statuses, explained, a.scope):
        print(f"note: {name} is explained as equivalent but was detected; drop it from the explained file")
    if ev.stale_outside:
        print(
            f"warning: {len(ev.stale_outside)} recorded entries outside this scope are stale (not failing here: "
            "this run did not re-run them; a full check fails on them):"
        )
        for line in ev.stale_outside:
            print("  warning: " + line)
    if ev.unverified:
        counts = ", ".join(f"{n} {k}" for k, n in sorted(ev.unverified.items()))
        modules = ", ".join(f"{m} {n}" for m, n in sorted(ev.unverified_by_module.items()))
        print(
            f"unverified hash: {counts} were recorded before function hashes were kept; their function has not "
            f"changed since the hashes were introduced, but nobody knows they were given on this body "
            f"(run those modules again, `--confirm` reviewed explanations): {modules}"
        )
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
