"""Guard ablation, driven by the table: remove one guard, source state or outcome mapping at one
layer, run the tests aimed at that layer, and require a red test (docs/design.md#every-guard-matters).

    python -m mutation.ablate                 # every mutant (``make ablation``, part of ``make mutation``)
    python -m mutation.ablate --slice 0/8     # a bounded slice (CI runs one)
    python -m mutation.ablate --only model:guard:lease_live

Each mutant runs in its own pytest process with ``-p mutation.ablation_plugin``. A mutant is killed
when a test fails; the killing test must be aimed at the mutant's layer (its id names the layer, or
it is that layer's stateful suite). Results go to ``mutation/results.json`` (a full run) and the run
fails if a mutant survives, is killed only by a test aimed elsewhere, or if the set of mutants
differs from ``mutation/expected.json`` (a new guard needs a killing test and an entry there). A
survivor is accepted only when ``expected.json`` explains it as equivalent (the behaviour cannot
change, e.g. the database enforces the same rule a second time).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EXPECTED = ROOT / "mutation" / "expected.json"
RESULTS = ROOT / "mutation" / "results.json"
LAYERS = ("model", "sqlite", "postgresql")
TARGETED = [
    "tests/test_rules.py",
    "tests/test_adversarial.py",
    "tests/test_policy_gate.py",
    "tests/test_sources.py",
    "tests/test_rate_limits.py",
]
SUITES = {
    "model": (TARGETED, "memory", ["tests/test_model_stateful.py"]),
    "sqlite": (
        [*TARGETED, "tests/test_sql_store.py"],
        "sqlite",
        ["tests/test_store_differential.py::test_sqlite_agrees_with_model"],
    ),
    "postgresql": (
        [*TARGETED, "tests/test_sql_store.py"],
        "postgresql",
        ["tests/test_store_differential.py::test_postgresql_agrees_with_model"],
    ),
    # test_runtime_loops drives the dispatcher over the model only (its ids carry no store name)
    "runtime": (["tests/test_runtime.py"], "memory", ["tests/test_runtime_loops.py"]),
}
# the approval and claim machines (docs/design.md#approvals-and-per-target-dispatch-claims): their mutants run the tests aimed at those machines
CLAIM_TARGETED = [
    "tests/test_approval_rules.py",
    "tests/test_signed_approvals.py",
    "tests/test_claims.py",
    "tests/test_claims_runtime.py",
]
CLAIM_STATEFUL = {
    "model": ["tests/test_claims_stateful.py::test_model_alone_keeps_the_claim_invariants"],
    "sqlite": ["tests/test_claims_stateful.py::test_sqlite_agrees_with_the_model"],
    "postgresql": ["tests/test_claims_stateful.py::test_postgresql_agrees_with_the_model"],
}
# the runtime's outcome mappings, each bent the dangerous way (or simply the wrong way)
OUTCOME_MUTANTS = {
    "send.unknown": "record_not_sent",
    "send.not_sent": "record_unknown",
    "read_back.not_found": "confirm_read_back",
    "read_back.differs": "confirm_read_back",
    "read_back.match": "read_back_failed",
}


def mutants() -> list[str]:
    from atmostonce.table import table

    t = table()
    out = []
    for layer in LAYERS:
        out += [f"{layer}:guard:{g}" for g in t.guards]
        out += [f"{layer}:source:{e.name}/{s}" for e in t.events.values() for s in e.sources]
    out += [f"runtime:outcome:{o}={e}" for o, e in OUTCOME_MUTANTS.items()]
    # every guard whose refusal the table calls a wait (``refusal_outcome``)
    out += [f"runtime:refusal:{g}" for g in t.waiting_guards]
    from atmostonce.table import MACHINES, machine

    for layer in LAYERS:
        for m in MACHINES:
            mt = machine(m)
            out += [f"{layer}:guard:{g}" for g in mt.guards]
            out += [f"{layer}:{m}-source:{e.name}/{s}" for e in mt.events.values() for s in e.sources]
    # every coupling of an intent event to a claim move (spec/table.toml `couples`), per layer
    for layer in LAYERS:
        out += [f"{layer}:coupling:{e.name}" for e in t.events.values() if e.couples]
    # a guard the database enforces a second time: the fragment and that object removed together
    from mutation.ablation_plugin import BACKSTOPS

    out += [f"{layer}:guard-and-backstop:{g}" for g, by in BACKSTOPS.items() for layer in LAYERS if layer in by]
    return out


def _is_claim_mutant(mutant: str) -> bool:
    from atmostonce.table import MACHINES, machine

    _, kind, name = mutant.split(":", 2)
    if kind.endswith("-source") or kind == "coupling":
        return True
    return kind == "guard" and any(name in machine(m).guards for m in MACHINES)


def run_one(mutant: str, timeout: float) -> dict:
    layer = mutant.split(":", 1)[0]
    files, keyword, stateful = SUITES[layer]
    if _is_claim_mutant(mutant):
        files, stateful = CLAIM_TARGETED, CLAIM_STATEFUL[layer]
    env = dict(os.environ, HYPOTHESIS_PROFILE="ci", PYTHONHASHSEED="0")
    t0 = time.monotonic()
    killers: list[str] = []
    for batch in ([*files, "-k", keyword], stateful):
        if not batch:
            continue
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-x",
            "-q",
            "-rf",
            "-p",
            "no:randomly",
            "-p",
            "no:xdist",
            "-p",
            "mutation.ablation_plugin",
            f"--ablate={mutant}",
            *batch,
        ]
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            return {"mutant": mutant, "killed": False, "by": None, "note": "timeout", "seconds": timeout}
        killers = re.findall(r"^FAILED (\S+)", proc.stdout, re.M)
        if proc.returncode not in (0, 1):
            return {
                "mutant": mutant,
                "killed": False,
                "by": None,
                "note": f"pytest exit {proc.returncode}",
                "seconds": round(time.monotonic() - t0, 1),
                "output": proc.stdout[-2000:],
            }
        if killers:
            break
    by = killers[0] if killers else None
    aimed = by is not None and (keyword in by or any(s.split("::")[0] in by for s in stateful) or layer == "runtime")
    return {
        "mutant": mutant,
        "killed": bool(by) and aimed,
        "by": by,
        "aimed": aimed,
        "seconds": round(time.monotonic() - t0, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mutation.ablate")
    ap.add_argument("--slice", default=None, help="K/N: run every N-th mutant starting at K")
    ap.add_argument("--only", action="append", default=[])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--write-expected", action="store_true", help="record the current mutant set as expected")
    args = ap.parse_args(argv)

    every = mutants()
    doc = json.loads(EXPECTED.read_text()) if EXPECTED.exists() else {"mutants": [], "equivalent": {}}
    equivalent: dict[str, str] = doc.get("equivalent", {})
    if args.write_expected:
        doc = {"mutants": every, "equivalent": equivalent}
        EXPECTED.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {len(every)} mutants ({len(equivalent)} explained equivalents) to {EXPECTED}")
        return 0
    expected = doc["mutants"]
    rc = 0
    if sorted(expected) != sorted(every):
        added, removed = sorted(set(every) - set(expected)), sorted(set(expected) - set(every))
        print(
            f"mutant set changed: {len(added)} new (e.g. {added[:3]}), {len(removed)} gone (e.g. {removed[:3]});"
            " add killing tests, then --write-expected"
        )
        rc = 1
    chosen = args.only or every
    if args.slice:
        k, n = (int(x) for x in args.slice.split("/"))
        chosen = chosen[k::n]
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        results = list(pool.map(lambda m: run_one(m, args.timeout), chosen))
    for r in results:
        if not r["killed"] and r["mutant"] in equivalent:
            r["equivalent"] = equivalent[r["mutant"]]
    survivors = [r for r in results if not r["killed"] and "equivalent" not in r]
    for r in results:
        mark = "killed " if r["killed"] else ("equiv. " if "equivalent" in r else "SURVIVED")
        print(f"{mark} {r['mutant']:<60} {r.get('by') or r.get('note') or ''} ({r['seconds']}s)")
    print(f"{len(results) - len(survivors)}/{len(results)} killed in {time.monotonic() - t0:.0f}s")
    if not args.slice:
        merged = {}
        if args.only and RESULTS.exists():  # a partial re-run updates the recorded results
            merged = {r["mutant"]: r for r in json.loads(RESULTS.read_text())["results"]}
        merged.update({r["mutant"]: r for r in results})
        ordered = [merged[m] for m in every if m in merged]
        RESULTS.write_text(json.dumps({"results": ordered}, indent=1) + "\n")
    return 1 if survivors or rc else 0


if __name__ == "__main__":
    sys.exit(main())
