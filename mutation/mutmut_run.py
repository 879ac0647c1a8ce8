"""Run mutmut 3 over ``reference/atmostonce`` and ``adapters/atmostonce_sql/guards.py``.

mutmut 3 names a mutant after its file's path (``atmostonce/identity.py`` becomes module
``atmostonce.identity``) and its trampoline only switches a mutant on when that name equals the
function's ``__module__``. In this repository the import name ``atmostonce`` lives in
``reference/atmostonce``, so mutmut cannot run from the repository root. This script builds a
staging folder, ``build/mutmut/``, in which every source root appears under its import name (as
symlinks), with ``pyproject.toml`` (and so ``[tool.mutmut]``) linked from the root; mutmut then
works in ``build/mutmut/mutants/``, which it puts first on ``sys.path``, ahead of the editable
install's finder.

    python -m mutation.mutmut_run [--max-children N] [--record] [MUTANT_GLOB ...]   # stage, run, export stats
    python -m mutation.mutmut_run --stale [--record]                      # only functions with stale evidence
    python -m mutation.mutmut_run --stage-only                            # just build build/mutmut/
    python -m mutation.mutmut_run --tests tests/test_identity.py 'atmostonce.identity.*'  # narrowed

``--tests`` narrows the tests mutmut maps to functions and runs (its ``pytest_add_cli_args_test_selection``)
to the paths given. Such a run stages into its own folder, ``build/mutmut-slice/``, with a copy of
``pyproject.toml`` carrying that selection, so its test-to-function map never mixes with the full run's in
``build/mutmut/``. A mutant only a test outside the selection kills counts as surviving there, so the
selection for a slice must hold every test that kills one of its mutants (``make mutmut-slice``).

It leaves ``build/mutmut/mutants/mutmut-cicd-stats.json`` and the per-file ``.meta`` results for
``mutation.mutmut_check`` (survivors against ``mutation/mutmut_explained.json``) and
``mutation.mutmut_report`` (``docs/mutmut.md``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGE = ROOT / "build" / "mutmut"
SLICE_STAGE = ROOT / "build" / "mutmut-slice"

# name in the staging folder -> path in the repository
LINKS = {
    "pyproject.toml": "pyproject.toml",
    "atmostonce": "reference/atmostonce",
    "atmostonce_sql": "adapters/atmostonce_sql",
    "tests": "tests",
    # read by tests through paths relative to the repository root (copied into mutants/ by also_copy)
    "spec": "spec",
    "docs": "docs",
    "reference": "reference",
    "adapters": "adapters",
    "mutation": "mutation",
    "tools": "tools",
    "README.md": "README.md",
}

# The source roots of this checkout. The editable install's finder maps every import name onto the tree
# `pip install -e` ran in, which may be another worktree sharing the venv; mutmut puts only mutants/ ahead
# of it, so atmostonce_http, atmostonce_cli, atmostonce_matrix (and any subprocess a test starts) would
# come from that other tree. Prepending these to PYTHONPATH keeps them in this checkout; mutants/ still
# comes first on sys.path, so the mutated atmostonce and atmostonce_sql win.
SOURCE_ROOTS = ("reference", "adapters")


def narrowed_config(pyproject: str, tests: list[str]) -> str:
    """``pyproject`` (the text of pyproject.toml) with ``[tool.mutmut]``'s test selection set to ``tests``.

    Raises ValueError when the text has no ``pytest_add_cli_args_test_selection`` line to replace."""
    line = re.compile(r"^pytest_add_cli_args_test_selection\s*=.*$", re.MULTILINE)
    if not line.search(pyproject):
        raise ValueError("pyproject.toml has no pytest_add_cli_args_test_selection line")
    return line.sub(lambda _: "pytest_add_cli_args_test_selection = " + json.dumps(tests), pyproject, count=1)


def stage(stage_dir: Path = STAGE, tests: list[str] | None = None) -> Path:
    """Create (or refresh) the staging folder; returns it. With ``tests``, its pyproject.toml is a copy
    whose mutmut test selection is those paths (see the module docstring)."""
    stage_dir.mkdir(parents=True, exist_ok=True)
    if tests:
        config = stage_dir / "pyproject.toml"
        if config.is_symlink():
            config.unlink()
        config.write_text(narrowed_config((ROOT / "pyproject.toml").read_text("utf-8"), tests), "utf-8")
    for name, target in LINKS.items():
        if tests and name == "pyproject.toml":
            continue
        link = stage_dir / name
        want = os.path.relpath(ROOT / target, stage_dir)
        if link.is_symlink() and os.readlink(link) == want:
            continue
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.exists():
            shutil.rmtree(link)
        link.symlink_to(want)
    return stage_dir


def mutmut_bin() -> str:
    here = Path(sys.executable).parent / "mutmut"
    return str(here) if here.exists() else "mutmut"


def child_env(environ: dict[str, str] | None = None) -> dict[str, str]:
    """mutmut's environment: this checkout's source roots first on PYTHONPATH, bytecode caching on."""
    env = dict(os.environ if environ is None else environ)
    roots = [str(ROOT / r) for r in SOURCE_ROOTS]
    env["PYTHONPATH"] = os.pathsep.join([*roots, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    # mutated modules are large; without their bytecode cache every worker compiles them again
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def run(
    names: list[str],
    max_children: int,
    *,
    record: bool = False,
    stage_dir: Path = STAGE,
    tests: list[str] | None = None,
) -> int:
    """Stage, run mutmut on ``names`` (globs; empty: every mutant) and export its stats; returns mutmut's
    exit status. With ``record`` and ``tests`` only the detections are recorded: a narrowed run's
    survivors may be killed by a test outside it, so they say nothing (see ``mutmut_report.record``)."""
    stage(stage_dir, tests)
    env = child_env()
    started = time.monotonic()
    cmd = [mutmut_bin(), "run", "--max-children", str(max_children), *names]
    print("+ (cd", stage_dir.relative_to(ROOT), "&&", "mutmut", " ".join(cmd[1:]) + ")", flush=True)
    rc = subprocess.call(cmd, cwd=stage_dir, env=env)
    elapsed = time.monotonic() - started
    print(f"mutmut run exited {rc} after {elapsed:.0f}s", flush=True)
    if rc != 0:
        return rc
    rc = subprocess.call([mutmut_bin(), "export-cicd-stats"], cwd=stage_dir, env=env)
    if rc == 0 and record:
        from mutation.mutmut_report import record as record_results

        record_results(list(names), elapsed, max_children, stage_dir / "mutants", tests=tests)
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mutation.mutmut_run")
    ap.add_argument("--max-children", type=int, default=1, help="parallel mutant workers (the machine is shared)")
    ap.add_argument("--stage-only", action="store_true")
    ap.add_argument("--record", action="store_true", help="merge the results into mutation/mutmut_results.json")
    ap.add_argument(
        "--stale", action="store_true", help="add every function whose recorded verdicts or explanations are stale"
    )
    ap.add_argument(
        "--tests",
        action="append",
        metavar="PATH",
        help="run only this test path (repeatable; a narrowed slice, staged in build/mutmut-slice/; --record keeps only its detections)",
    )
    ap.add_argument("names", nargs="*", help="mutant names or globs, e.g. 'atmostonce.identity.*'")
    a = ap.parse_args(argv)
    if a.stage_only:
        print(stage())
        return 0
    names = list(a.names)
    if a.stale:
        from mutation.mutmut_check import load_explained, load_verdicts, stale_functions

        stale = stale_functions(load_verdicts(), load_explained())
        print(f"{len(stale)} functions with stale mutation evidence", flush=True)
        if not stale and not names:
            return 0
        names += stale
    if a.tests:
        return run(names, a.max_children, record=a.record, stage_dir=SLICE_STAGE, tests=a.tests)
    return run(names, a.max_children, record=a.record)


if __name__ == "__main__":
    sys.exit(main())
