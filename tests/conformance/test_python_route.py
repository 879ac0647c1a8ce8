"""The Python route (docs/conformance.md, "Adopting it from Python"): an implementation declares its
features on the factory (or they are found from its store's methods); a case needing a feature or an
operation it lacks is not applicable, never an error; the stateful machine runs on what it has."""

from __future__ import annotations

import functools
import re

import pytest

from atmostonce.conformance import StoreDriver, load_cases, run_suite
from atmostonce.conformance.drivers import features_of
from atmostonce.conformance.runner import ERROR, NOT_APPLICABLE
from tests.conformance import core_store

pytestmark = pytest.mark.slow

CASES = load_cases()
NEEDS_CLAIMS = {c.id for c in CASES if "claims" in c.requires}
NEEDS_EVIDENCE = {c.id for c in CASES if "evidence" in c.requires}
LACKING = NEEDS_CLAIMS | NEEDS_EVIDENCE  # what the core-only store does not have
NEEDS_RUNTIME = {c.id for c in CASES if "runtime" in c.requires}


def test_features_are_found_from_the_stores_methods():
    assert features_of(core_store.factory()) == {"store", "runtime"}
    assert features_of(core_store.factory(hidden=())) == {"store", "runtime", "claims", "evidence"}


def test_declared_features_win_over_the_stores_methods():
    impl = core_store.factory(hidden=(), features=frozenset({"runtime"}))
    assert features_of(impl) == {"store", "runtime"}


def test_a_store_without_claims_gets_a_clean_report():
    report = run_suite(StoreDriver(core_store.factory), CASES)
    assert report.failed == [], report.summary()
    assert report.ok
    assert {r.case.id for r in report.not_applicable} == LACKING
    assert {r.message for r in report.not_applicable} == {
        "not applicable: feature not implemented (claims)",
        "not applicable: feature not implemented (evidence)",
    }


def test_a_declared_store_only_implementation_skips_the_runtime_cases():
    factory = functools.partial(core_store.factory, features=frozenset({"store"}))
    report = run_suite(StoreDriver(factory), CASES)
    assert report.ok, report.summary()
    assert {r.case.id for r in report.not_applicable} == LACKING | NEEDS_RUNTIME


def test_a_missing_operation_makes_its_cases_not_applicable_never_errors():
    factory = functools.partial(core_store.factory, hidden=core_store.HIDDEN | {"set_rate_limit", "capture_source"})
    report = run_suite(StoreDriver(factory), CASES)
    assert report.ok, report.summary()
    assert not [r for r in report.results if r.status == ERROR]
    na = {r.case.id: r.message for r in report.not_applicable if r.case.id not in LACKING}
    uses = {
        c.id
        for c in CASES
        if c.id not in LACKING and {s.get("op") for s in c.steps} & {"set_rate_limit", "capture_source"}
    }
    assert set(na) == uses and len(uses) >= 4
    assert na["guard-rate-limit-clear"].startswith("not applicable: operation not implemented (set_rate_limit: ")
    assert {r.status for r in report.results if r.case.id in uses} == {NOT_APPLICABLE}


def test_the_stateful_machine_runs_on_a_store_without_claims_or_late_outcomes():
    from hypothesis import HealthCheck, settings

    from atmostonce.testing.stateful import make_machine

    machine = make_machine(core_store.factory)
    machine.TestCase.settings = settings(
        max_examples=10, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
    )
    machine.TestCase().runTest()


# ------------------------------------------------------------------------------ the bundle and the filters
def test_the_pinned_bundle_is_the_case_files_own():
    from atmostonce.conformance.cases import bundle

    b = bundle()
    assert not b.modified, (
        "spec/conformance changed since the bundle was pinned: bump its version and run python -m tests.conformance.bundle VERSION"
    )
    assert re.fullmatch(r"\d+\.\d+\.\d+", b.version) and b.format == 1 and b.cases == len(CASES)


def test_cli_prints_the_bundle_version(capsys, tmp_path):
    import shutil

    from atmostonce.conformance import cases_dir, run_cli

    assert run_cli(["--bundle-version"]) == 0
    assert re.fullmatch(
        r"atmostonce conformance bundle \d+\.\d+\.\d+ \(case format 1, \d+ cases, sha256 [0-9a-f]{16}\)\n",
        capsys.readouterr().out,
    )
    copy = tmp_path / "cases"
    shutil.copytree(cases_dir(), copy)
    (copy / "guards.json").write_text(
        (copy / "guards.json").read_text("utf-8").replace("retry is accepted", "retry is taken")
    )
    assert run_cli(["--bundle-version", "--cases", str(copy)]) == 1
    assert "(modified since it was pinned)" in capsys.readouterr().out


def test_cli_filters_by_feature_file_and_case(capsys):
    from atmostonce.conformance import run_cli
    from atmostonce.conformance.cli import select

    assert {c.id for c in select(CASES, features=["claims"])} == NEEDS_CLAIMS
    assert {c.id for c in select(CASES, features=["store"])} == {c.id for c in CASES if not c.requires}
    assert {c.source for c in select(CASES, files=["witnesses.json"])} == {"witnesses.json"}
    both = select(CASES, files=["witnesses.json"], features=["runtime"])
    assert both and all(c.source == "witnesses.json" and "runtime" in c.requires for c in both)
    with pytest.raises(ValueError, match="no such case file"):
        select(CASES, files=["nope.json"])
    argv = ["--impl", "tests.conformance.core_store:factory", "--feature", "runtime", "--file", "runtime.json"]
    assert run_cli(argv) == 0
    out = capsys.readouterr().out
    n = len([c for c in CASES if c.source == "runtime.json"])
    assert f"{n} passed, 0 failed, 0 errors, 0 not applicable ({n} cases" in out
    assert run_cli(["--impl", "tests.conformance.core_store:factory", "--file", "nope.json"]) == 2


# ------------------------------------------------------------------------------ the stateful item's output
def _pytest(tmp_path, *args):
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "atmostonce.conformance.plugin", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_a_stateful_failure_is_short_by_default_and_whole_on_request(tmp_path):
    impl = "--atmostonce-impl=tests.conformance.core_store:wrong_factory"
    short = _pytest(tmp_path, impl, "-k", "stateful")
    assert short.returncode == 1, short.stdout[-3000:]
    assert "state.begin(" in short.stdout, short.stdout[-3000:]  # the minimal failing program
    # pytest repeats the whole message in its short summary when it runs on CI (the CI variable is set),
    # so only the failure section is read.
    section = short.stdout.split("short test summary info")[0]
    first = [line for line in section.splitlines() if line.startswith("first disagreement: ")]
    assert len(first) == 1 and "no_open_attempt" in first[0], short.stdout[-3000:]
    assert "Traceback" not in short.stdout and "raise " not in short.stdout
    full = _pytest(tmp_path, impl, "-k", "stateful", "--atmostonce-stateful-trace")
    assert full.returncode == 1
    assert "first disagreement" not in full.stdout and "AssertionError" in full.stdout
    assert len(full.stdout.splitlines()) > len(short.stdout.splitlines())


def test_the_stateful_item_passes_on_a_store_without_claims(tmp_path):
    run = _pytest(
        tmp_path, "--atmostonce-impl=tests.conformance.core_store:factory", "--atmostonce-stateful-examples=5"
    )
    tail = run.stdout.strip().splitlines()[-1]
    assert run.returncode == 0, run.stdout[-2000:]
    assert f"{len(CASES) - len(LACKING) + 1} passed, {len(LACKING)} skipped" in tail
    assert "stateful machine: passed (5 examples)" in run.stdout


def test_the_stateful_machine_compares_identities_through_the_stores_own_functions():
    """A store whose keys and digests are its own (not byte-equal to the model's) runs the machine
    clean: the machine maps the model's keys to the store's instead of assuming they are equal."""
    from hypothesis import HealthCheck, settings

    from atmostonce.testing.stateful import make_machine

    impl = core_store.own_identities_factory()
    it = impl.store.submit("acct", "post", "room-1", {"text": "hi"})
    assert it.key.startswith("own-") and it.request_digest.startswith("own-digest-")
    machine = make_machine(core_store.own_identities_factory)
    machine.TestCase.settings = settings(
        max_examples=10, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
    )
    machine.TestCase().runTest()
