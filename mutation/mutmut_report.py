"""``docs/mutmut.md`` from ``mutation/mutmut_results.json`` (what mutmut ran, per module, and every survivor).

    python -m mutation.mutmut_report --record GLOB... --seconds S   # merge build/mutmut/mutants/*.meta into the results
    python -m mutation.mutmut_report --write                         # docs/mutmut.md
    python -m mutation.mutmut_report --check                         # exit 1 if docs/mutmut.md is stale
    python -m mutation.mutmut_report --migrate-hashes                # give entries without a hash the tree's, unverified

``mutation.mutmut_run`` calls ``--record`` after each run, so the results file says honestly which
slices were run, when, at which commit, and how long they took; modules never run are listed as such.
Each verdict is ``{"status", "function_hash", "commit"}``: the hash is the one mutmut computed for the
function body it generated the mutants from (its ``.meta`` file), so a verdict is tied to the code it
ran on (mutation/mutmut_check.py says which are stale). Verdicts recorded before hashes were kept carry
the hash of the body at migration and ``"unverified_hash": true`` instead of a commit.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from datetime import UTC, datetime
from pathlib import Path

from mutation.mutmut_check import (
    DETECTED,
    MUTANTS,
    TreeHashes,
    as_explanation,
    as_verdict,
    function_of,
    head_commit,
    in_scope,
    load_explained,
    load_meta_hashes,
    load_statuses,
    module_of,
)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "mutation" / "mutmut_results.json"
EXPLAINED = ROOT / "mutation" / "mutmut_explained.json"
DOC = ROOT / "docs" / "mutmut.md"


def load_results(path: Path = RESULTS) -> dict:
    """The results file, every verdict as a record (a bare status from before hashes has none: unverified)."""
    if not path.exists():
        return {"runs": [], "generated": {}, "mutants": {}, "killed_after_surviving": []}
    res = json.loads(path.read_text("utf-8"))
    res["mutants"] = {n: as_verdict(e) for n, e in res.get("mutants", {}).items()}
    return res


def dump(data: dict) -> str:
    """JSON with one line per mutant (the file has thousands; a diff then shows one line per changed verdict)."""
    out = dict(data)
    mutants = out.pop("mutants", {})
    text = json.dumps(out, indent=2, ensure_ascii=False)
    body = ",\n".join(
        f"    {json.dumps(n, ensure_ascii=False)}: {json.dumps(e, ensure_ascii=False)}" for n, e in mutants.items()
    )
    return text[:-2] + ',\n  "mutants": {\n' + body + "\n  }\n}\n"


def record(
    scope: list[str],
    seconds: float,
    max_children: int,
    mutants: Path = MUTANTS,
    path: Path = RESULTS,
    commit: str | None = None,
    tests: list[str] | None = None,
) -> dict:
    """Merge the statuses of the mutants in ``scope`` into the results file, each with the hash of the
    function body the run mutated and the commit it ran at; returns the new results.

    ``tests`` marks a narrowed run (only those test paths ran): then only detections are merged. A kill
    by part of the suite is a kill by all of it; a survivor there may be killed by a test left out, so
    its earlier verdict (or none) stays, and the run entry lists the tests."""
    from importlib.metadata import version

    res = load_results(path)
    statuses = load_statuses(mutants)
    run_hashes = load_meta_hashes(mutants)
    commit = head_commit() if commit is None else commit
    res["mutmut"] = version("mutmut")
    res["generated"] = dict(sorted(Counter(module_of(n) for n in statuses).items()))
    # a mutant whose name mutmut no longer generates mutated code that has changed or gone: drop its verdict
    old = {n: e for n, e in res.get("mutants", {}).items() if n in statuses}
    revived = set(res.setdefault("killed_after_surviving", []))
    count = 0
    for name, status in statuses.items():
        if not in_scope(name, scope) or status == "not checked":
            continue
        if tests and status not in DETECTED:
            continue
        if old.get(name, {}).get("status") == "survived" and status in DETECTED:
            revived.add(name)
        ran_on = run_hashes.get(f"{module_of(name)}.{function_of(name)}")
        if ran_on is None:  # mutmut kept no hash for it: say so rather than guess one
            old[name] = {"status": status, "function_hash": None, "unverified_hash": True}
        else:
            old[name] = {"status": status, "function_hash": ran_on, "commit": commit}
        count += 1
    res["mutants"] = dict(sorted(old.items()))
    res["killed_after_surviving"] = sorted(revived & set(statuses))
    if len(scope) > 6:  # a run of named mutants (survivors again, or the ones not run yet): say how many, of what
        modules = ", ".join(sorted({module_of(n) for n in scope}))
        what = "mutant names or patterns" if any("*" in n for n in scope) else "named mutants"
        scope = [f"{len(scope)} {what} of {modules}"]
    entry = {
        "scope": scope or ["*"],
        "mutants": count,
        "seconds": round(seconds),
        "max_children": max_children,
        "commit": commit,
        "finished": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }
    if tests:
        entry["tests"] = list(tests)
        entry["recorded"] = "detections only"
    res["runs"].append(entry)
    path.write_text(dump(res), "utf-8")
    return res


def migrate_hashes(
    path: Path = RESULTS, explained_path: Path = EXPLAINED, hashes: TreeHashes | None = None, commit: str | None = None
) -> tuple[int, int]:
    """Give every verdict and explanation that has no ``function_hash`` the hash of its function in the
    tree now, marked ``unverified_hash``: the entry may have been recorded on an older body, so it is
    not fresh, but from here on an edit of the function makes it stale. Returns (verdicts, explanations)
    migrated; entries that already have a hash are left alone."""
    hashes = TreeHashes() if hashes is None else hashes
    commit = head_commit() if commit is None else commit
    res = load_results(path)
    n_verdicts = 0
    for name, entry in res["mutants"].items():
        if "function_hash" not in entry:
            res["mutants"][name] = {
                "status": entry["status"],
                "function_hash": hashes.of(name),
                "unverified_hash": True,
            }
            n_verdicts += 1
    if n_verdicts:
        res["hashes_introduced"] = {
            "commit": commit,
            "note": "verdicts with unverified_hash were recorded before function hashes were kept; their "
            "function_hash is the body at this commit, not necessarily the body they were given on",
        }
        path.write_text(dump(res), "utf-8")
    data = json.loads(explained_path.read_text("utf-8"))
    n_explained = 0
    for name, entry in data.get("equivalent", {}).items():
        e = as_explanation(entry)
        if "function_hash" not in e:
            data["equivalent"][name] = {"why": e["why"], "function_hash": hashes.of(name), "unverified_hash": True}
            n_explained += 1
    if n_explained:
        explained_path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", "utf-8")
    return n_verdicts, n_explained


def left_out_packages(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The packages ``[tool.mutmut] do_not_mutate`` leaves out, as import names (``atmostonce/testing/*``
    -> ``atmostonce.testing``)."""
    import tomllib

    globs = tomllib.loads(pyproject.read_text("utf-8"))["tool"]["mutmut"].get("do_not_mutate", [])
    return [g.removesuffix("/*").removesuffix(".py").replace("/", ".") for g in globs]


UNVERIFIED_LABEL = "unverified hash"


def verified_label(entry: dict) -> str:
    """The commit a verdict or explanation was verified at, or ``unverified hash``."""
    if entry.get("unverified_hash") or not entry.get("function_hash") or not entry.get("commit"):
        return UNVERIFIED_LABEL
    return f"`{entry['commit']}`"


def verified_cell(counts: Counter | None) -> str:
    if not counts:
        return ""
    order = sorted(counts, key=lambda k: (k == UNVERIFIED_LABEL, k))
    return ", ".join(f"{k} ({counts[k]})" for k in order)


def render(res: dict | None = None, explained: dict | None = None) -> str:
    res = load_results() if res is None else res
    explained = load_explained() if explained is None else explained
    entries = {n: as_verdict(e) for n, e in res.get("mutants", {}).items()}
    explained = {n: as_explanation(e) for n, e in explained.items()}
    mutants: dict[str, str] = {n: e["status"] for n, e in entries.items()}
    generated: dict[str, int] = res.get("generated", {})
    by_module: dict[str, Counter] = defaultdict(Counter)
    verified_at: dict[str, Counter] = defaultdict(Counter)  # module -> commit (or "unverified hash") -> verdicts
    for name, entry in entries.items():
        by_module[module_of(name)][entry["status"]] += 1
        verified_at[module_of(name)][verified_label(entry)] += 1
    left_out = " and ".join(f"`{p}`" for p in left_out_packages())
    lines = [
        "<!-- generated by `python -m mutation.mutmut_report --write` from mutation/mutmut_results.json "
        "and mutation/mutmut_explained.json -->",
        "",
        "# mutmut: mutants inside the functions",
        "",
        f"mutmut {res.get('mutmut', '3')} mutates the code inside functions of `reference/atmostonce/` and "
        "`adapters/atmostonce_sql/guards.py` and runs the fast tests (no PostgreSQL, no Synapse, nothing marked "
        f"slow) against each mutant. It leaves out {left_out} (`do_not_mutate`): they are the conformance "
        "suite, shipped inside the package so that other implementations can run it, and so are tests rather "
        "than code under test. They are checked the other way round: the stateful machines "
        "(`atmostonce.testing`) are among the suites the guard-ablation runner requires to go red when a guard, "
        "source state or outcome mapping is removed (docs/guards.md); the JSON cases "
        "(tests/conformance/test_conformance.py) pass on the model, SQLite and PostgreSQL, fail a naive store "
        "case by case, and fail the model with any one guard deleted, by a case that names that guard. Source "
        "states and outcome mappings are not ablated against the JSON cases. The table's data (guards, source states, outcome mappings) is not code inside "
        "a function; the guard-ablation runner covers it (docs/guards.md). Configuration: `[tool.mutmut]` in "
        "pyproject.toml; mutmut runs in the staging folder `build/mutmut/` (`python -m mutation.mutmut_run`) "
        "because it names mutants after file paths. `make mutmut` runs everything, `make mutmut-slice` the CI "
        "slice; `python -m mutation.mutmut_check` fails on a survivor that `mutation/mutmut_explained.json` "
        "does not explain.",
        "",
        "A mutant counts as detected when a test failed (killed) or it ran past its time limit (timeout). "
        "Score = detected / checked. Modules whose mutants were generated but not run in the recorded runs "
        "say so: their score is unknown, not zero.",
        "",
        "## How it is set up (mutmut 3.8.1, read from its source)",
        "",
        "* mutmut names a mutant after its file's path (stripping only a leading `src.`) and switches it on only "
        "when that name equals the function's `__module__`; `reference/atmostonce/identity.py` would be "
        "`reference.atmostonce.identity`. `mutation/mutmut_run.py` therefore builds `build/mutmut/`, where "
        "`atmostonce` and `atmostonce_sql` are symlinks to their source roots, and runs mutmut there; mutmut "
        "copies them to `build/mutmut/mutants/` and puts that first on `sys.path`, ahead of the editable "
        "install's finder (which setuptools appends to `sys.meta_path`).",
        "* That finder maps every import name onto the tree `pip install -e` ran in, which may be another "
        "worktree sharing the venv; `mutation/mutmut_run.py` therefore puts this checkout's `reference/` and "
        "`adapters/` first on `PYTHONPATH`, so the packages mutmut does not copy (`atmostonce_http`, "
        "`atmostonce_cli`, `atmostonce_matrix`) and any subprocess a test starts come from the checkout under test.",
        "* In 3.8.1 `paths_to_mutate` and `tests_dir` are deprecated: the keys used are `source_paths`, "
        "`only_mutate` (the whole of `atmostonce/`, and only `guards.py` of `atmostonce_sql/`), `also_copy` "
        "(folders tests read by path), `pytest_add_cli_args` (the `make quick` marker and ignores, always "
        "applied) and `pytest_add_cli_args_test_selection`.",
        "* `do_not_mutate_patterns` skips one-line `def ...: ...` stubs: a mutant of a default value in the "
        "runtime-checkable `Transport` protocol adds attributes to it and breaks `isinstance` for every transport.",
        "* Workers are forked from the process that ran the suite once (mutmut's default `fork` isolation). A "
        "fresh import per mutant (`forkserver` without warm-up) cost 15 s or more per mutant here (6028 mutants: "
        "12 hours or more of start-up alone). What a process builds once (the cached table) is built by the original code, so "
        "tests that call such builders directly are what kill their mutants.",
        "* Hypothesis is derandomized for these runs (`mutation/mutmut_plugin.py`), so a verdict does not depend "
        "on the examples a run happened to draw.",
        "* `PYTHONDONTWRITEBYTECODE` is unset for the run: the mutated files are large and every worker "
        "would compile them again.",
        "* `mutmut run` exits 0 when mutants survive and also when it is interrupted; the gate "
        "(`mutation/mutmut_check.py`) reads `mutmut export-cicd-stats` and the `.meta` files and fails on a "
        "mutant in scope that is not checked, or not detected and not explained.",
        "* Verdicts and explanations are tied to the code they were given on. A mutant's name is a position "
        "(`x_f__mutmut_9` is the ninth mutation of `f`'s body), so an edit renumbers the mutants and an old "
        "verdict would describe another mutation. Every verdict in `mutation/mutmut_results.json` and every "
        "explanation in `mutation/mutmut_explained.json` carries `function_hash`: mutmut's own hash of the "
        "original function it mutated (`hash_by_function_name` in its `.meta` files: sha256 of the function's "
        "`ast.dump`, so the body, decorators and signature count and its line numbers do not); a verdict also "
        "carries the commit it was recorded at (`-dirty` when the source had uncommitted changes). The hash "
        "covers the function, not the tests: a test deleted since a kill is found by the next run, not by the "
        "hash. `mutation/mutmut_check.py` calls an entry **stale** when its function's hash in the tree differs "
        "(or the function is gone) and names the mutant and the function. Inside the scope it was given the "
        "check fails on a stale entry; outside it, it lists them as warnings and passes. `make mutmut` (no "
        "scope: everything is in scope) therefore fails on any stale entry, while `make mutmut-slice`, which "
        "re-runs only the CI slice's functions, fails on stale entries of the slice and only lists the rest: "
        "otherwise every code change would need a multi-hour full run before CI could pass. Re-run and record "
        "what changed (`make mutmut MUTMUT=\"'atmostonce.model.*'\"`, or `make mutmut-stale`, which re-runs exactly the "
        "functions with stale evidence) to make it fresh again.",
        "* Entries recorded before hashes were kept have **unverified hash**: `python -m mutation.mutmut_report "
        "--migrate-hashes` gave them the hash of their function at that commit, marked `unverified_hash`, "
        "because nobody knows whether the verdict was given on that body or an older one. They count as "
        "neither fresh nor stale: the check counts them and says so, and they turn stale when their function "
        "changes. A run records fresh verdicts over them; an explanation is made fresh by `python -m "
        "mutation.mutmut_check --confirm NAME` after a person re-read the mutant (`mutmut show NAME` in "
        "`build/mutmut/`) on the current body, which is refused unless the last run left it undetected on "
        "that very body.",
        "* CI (`.ci/run`) runs `make mutmut-slice`: the 430 mutants of `atmostonce.identity.*`, against only "
        "the four test files that kill them (`MUTMUT_SLICE_TESTS` in the Makefile; `--tests` of "
        "`mutation.mutmut_run`, staged in `build/mutmut-slice/`). Measured from an empty staging folder on "
        "2026-12-03: 167 s wall with 2 workers on this 2-core machine, 407 detected, 23 explained, exit 0. "
        "The slice it replaced (`atmostonce.errors.*` too, against the whole fast suite) took about 43 min, "
        "most of it the stats run of every test under mutmut's trampoline, and pushed CI past its time "
        "limit. A narrowed run records only its kills (a kill by part of the suite is a kill by all of it); "
        "a mutant that survives it may be killed by a test outside its files, so its earlier verdict stays. "
        "The runs below that were narrowed say so in their scope.",
        "",
        "## Runs",
        "",
        "| recorded | commit | scope | mutants checked | wall time | workers |",
        "|---|---|---|---|---|---|",
    ]
    for r in res.get("runs", []):
        scope = ", ".join(f"`{g}`" for g in r["scope"])
        if r.get("tests"):
            scope += f" (narrowed to {len(r['tests'])} test files: kills only)"
        commit = f"`{r['commit']}`" if r.get("commit") else "not recorded"
        lines.append(
            f"| {r['finished']} | {commit} | {scope} | {r['mutants']} | {r['seconds']} s | {r['max_children']} |"
        )
    lines += [
        "",
        "## Per module",
        "",
        "`verified at` is the commit each verdict was recorded at, with how many verdicts of the module each "
        "commit holds; `unverified hash` counts verdicts recorded before hashes were kept.",
        "",
        "| module | mutants | checked | killed | timeout | survived | no tests | other | score | verified at |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    totals: Counter = Counter()
    ref: Counter = Counter()  # reference/ alone: every module but the adapters' atmostonce_sql
    for module in sorted(set(generated) | set(by_module)):
        c = by_module.get(module, Counter())
        checked = sum(c.values())
        det = sum(v for k, v in c.items() if k in DETECTED)
        other = checked - c["killed"] - c["timeout"] - c["survived"] - c["no tests"]
        score = f"{100 * det / checked:.1f}%" if checked else "not run"
        lines.append(
            f"| `{module}` | {generated.get(module, checked)} | {checked} | {c['killed']} | {c['timeout']} | "
            f"{c['survived']} | {c['no tests']} | {other} | {score} | {verified_cell(verified_at.get(module))} |"
        )
        totals["mutants"] += generated.get(module, checked)
        totals["checked"] += checked
        totals["detected"] += det
        for k in ("killed", "timeout", "survived", "no tests"):
            totals[k] += c[k]
        totals["other"] += other
        if module.split(".")[0] == "atmostonce":
            ref["checked"] += checked
            ref["detected"] += det
    score = f"{100 * totals['detected'] / totals['checked']:.1f}%" if totals["checked"] else "not run"
    lines.append(
        f"| **all** | {totals['mutants']} | {totals['checked']} | {totals['killed']} | {totals['timeout']} | "
        f"{totals['survived']} | {totals['no tests']} | {totals['other']} | {score} | "
        f"{verified_cell(sum(verified_at.values(), Counter()))} |"
    )
    if ref["checked"]:
        lines += [
            "",
            f"Score on `reference/` alone (the `atmostonce` modules): {ref['detected']} of {ref['checked']} "
            f"checked mutants detected, {100 * ref['detected'] / ref['checked']:.1f}%.",
        ]
    runs = res.get("runs", [])
    ran = sum(r["mutants"] for r in runs)
    remaining = totals["mutants"] - totals["checked"]
    if ran and remaining > 0:
        pace = sum(r["seconds"] for r in runs) / ran
        lines += [
            "",
            f"Not yet run: {remaining} of {totals['mutants']} mutants. At the recorded pace ({pace:.1f} s of wall "
            f"time per mutant over the runs above on this shared 2-core machine; optimistic, since re-runs of "
            f"mutants already killed once are included, and survivors cost the most because they run every "
            f"test that covers them) that is about {remaining * pace / 3600:.0f} hours; run it module by module "
            "with `make mutmut MUTMUT=\"'atmostonce.model.*'\"`, each run is recorded here.",
        ]
    undetected = {n: s for n, s in mutants.items() if s not in DETECTED}
    lines += ["", "## Mutants not detected", ""]
    if not undetected:
        lines.append("None among the mutants checked.")
    else:
        lines += [
            "Each is explained in `mutation/mutmut_explained.json` (why no test can tell it from the original), "
            "or marked UNEXPLAINED, which `mutation.mutmut_check` fails on.",
            "",
            "`explained at` is the commit at which a person confirmed the reason on the function's body "
            "(`mutmut_check --confirm`), or `unverified hash` for a reason written before hashes were kept.",
            "",
            "| mutant | status | why | explained at |",
            "|---|---|---|---|",
        ]
        for name, status in sorted(undetected.items()):
            e = explained.get(name)
            why = e["why"] if e else "**UNEXPLAINED**"
            lines.append(f"| `{name}` | {status} | {why} | {verified_label(e) if e else ''} |")
    revived = res.get("killed_after_surviving", [])
    lines += ["", "## Survivors killed by tests written for them", ""]
    if revived:
        lines.append(
            f"{len(revived)} mutants survived a first run and were killed after new tests were added "
            "(tests/test_refusal_messages.py, tests/test_identity_format.py, tests/test_gate_scoping.py, "
            "tests/test_checks.py, tests/test_machine_loading.py, tests/test_docgen_command.py, "
            "tests/test_rate_window_edge.py, tests/test_intake_limits.py, tests/test_lease_intake.py, "
            "tests/test_operation_arguments.py, tests/test_store_reads_and_refusals.py, "
            "tests/test_claim_and_approval_records.py, tests/test_audit_verify_report.py, "
            "tests/test_audit_chain_format.py, tests/test_settlement_rule.py and tests/test_runtime_loops.py); "
            "each was run again by name:"
        )
        lines.append("")
        lines += [f"* `{n}`" for n in revived]
    else:
        lines.append("None yet.")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mutation.mutmut_report")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true")
    g.add_argument("--check", action="store_true")
    g.add_argument("--record", nargs="*", metavar="GLOB", help="merge a finished run's results")
    g.add_argument("--migrate-hashes", action="store_true", help="hash entries recorded before hashes (unverified)")
    ap.add_argument("--seconds", type=float, default=0.0)
    ap.add_argument("--max-children", type=int, default=1)
    ap.add_argument("--mutants", type=Path, default=MUTANTS)
    a = ap.parse_args(argv)
    if a.record is not None:
        record(a.record, a.seconds, a.max_children, a.mutants)
        return 0
    if a.migrate_hashes:
        print("migrated (verdicts, explanations):", migrate_hashes())
        return 0
    text = render()
    if a.write:
        DOC.write_text(text, "utf-8")
        return 0
    if not DOC.exists() or DOC.read_text("utf-8") != text:
        print("docs/mutmut.md is stale: run `python -m mutation.mutmut_report --write`")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
