"""The conformance suite on every implementation we ship, and proof that it discriminates (docs/conformance.md).

The model, SQLite, PostgreSQL and a JSON-lines subprocess driver pass every applicable case;
a deliberately naive store fails with named counterexamples; deleting any guard from the model
fails a case that names that guard; a driver without a feature gets its cases listed as not applicable, never passed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from atmostonce.conformance import (
    Implementation,
    ManualClock,
    StoreDriver,
    SubprocessDriver,
    load_cases,
    run_cli,
    run_suite,
)
from atmostonce.conformance.cases import CaseError, match, resolve
from atmostonce.conformance.factories import memory
from atmostonce.conformance.runner import ERROR, NOT_APPLICABLE, PASSED
from atmostonce.errors import Rejected
from atmostonce.model import MemoryStore
from atmostonce.table import table
from tests.conformance.factories import ResettingPostgres, sql_factory
from tests.conformance.naive_store import factory as naive_factory

ROOT = Path(__file__).resolve().parents[2]
JSONL = Path(__file__).with_name("jsonl_driver.py")
CASES = load_cases()
ALL = {c.id for c in CASES}
CLAIMS = {c.id for c in CASES if "claims" in c.requires}
EVIDENCE = {c.id for c in CASES if "evidence" in c.requires}
LACKING = CLAIMS | EVIDENCE  # what a store-and-runtime driver does not have


def assert_passes(report, not_applicable=frozenset()):
    bad = {r.case.id: r.message for r in report.failed}
    assert bad == {}, report.summary()
    assert {r.case.id for r in report.passed} == ALL - set(not_applicable)
    assert {r.case.id for r in report.not_applicable} == set(not_applicable)
    assert report.ok


# ------------------------------------------------------------------------------ every implementation passes
def test_the_reference_model_passes():
    assert_passes(run_suite(StoreDriver(memory, name="model"), CASES))


def test_sqlite_passes(sqlite_databases):
    driver = StoreDriver(sql_factory(sqlite_databases), name="sqlite")
    try:
        assert_passes(run_suite(driver, CASES))
    finally:
        driver.close()


@pytest.mark.postgres
def test_postgresql_passes(pg_databases):
    factory = ResettingPostgres(pg_databases)
    driver = StoreDriver(factory, name="postgresql")
    try:
        assert_passes(run_suite(driver, CASES))
        # the reset between cases really gives back the freshly migrated database
        impl = factory()
        try:
            assert set(impl.store.count_by_state().values()) == {0}
            assert impl.store.due_leases() == [] and impl.store.current_epoch() == 1
        finally:
            impl.close()
    finally:
        driver.close()
        factory.close()


def test_a_json_lines_driver_in_another_process_passes():
    driver = SubprocessDriver([sys.executable, str(JSONL)], cwd=str(ROOT))
    try:
        assert driver.name == "jsonl model driver" and driver.features == {"store", "runtime"}
        assert_passes(run_suite(driver, CASES), not_applicable=LACKING)  # it speaks neither claims nor late outcomes
    finally:
        driver.close()


# ------------------------------------------------------------------------------ it discriminates
NAIVE_COUNTEREXAMPLES = {
    # case id: (expected outcome, what the naive store did) at the first step that differs
    # mistake 1, unknown treated as retryable
    "retry-refused-from-indeterminate": ("refused:source_state", "accepted"),
    "not-found-lookup-resolves-nothing": ("refused:source_state", "accepted"),
    "lapsed-send-lease-goes-indeterminate": ("refused:source_state", "accepted"),
    "failed-read-back-is-indeterminate": ("refused:source_state", "accepted"),
    "runtime-unfenced-not-found-never-resends": ("accepted", "accepted"),  # sweep retried it
    "runtime-differing-read-back-is-not-published": ("accepted", "accepted"),
    "runtime-worker-dies-after-authorize-unfenced": ("accepted", "accepted"),
    "runtime-timeout-is-never-resent": ("accepted", "accepted"),  # the platform received it twice
    "runtime-worker-dies-after-send": ("accepted", "accepted"),
    # mistake 2, no fencing
    "late-generation-1-authorization-refused": ("refused:lease_holder", "accepted"),
    "late-generation-1-outcome-refused": ("refused:lease_holder", "accepted"),
    "current-token-old-generation-refused": ("refused:lease_holder", "accepted"),
    "stale-sweeper-plan-cannot-close-new-attempt": ("refused:lease_holder", "accepted"),
    "guard-lease-holder": ("refused:lease_holder", "accepted"),
    "stale-write-refusal-is-recorded": ("refused:lease_holder", "accepted"),
    "completion-with-current-token-old-generation-refused": ("refused:lease_holder", "accepted"),
    "completion-with-another-attempts-generation-refused": ("refused:lease_holder", "accepted"),
    "unreadable-success-is-settled-by-lookup": ("refused:source_state", "accepted"),
    "a-fenced-miss-before-a-restore-proves-nothing": ("refused:source_state", "accepted"),
    "a-restore-fences-a-failed-intent": ("refused:source_state", "accepted"),
    "runtime-a-worker-lost-before-the-send-is-never-resent-unfenced": ("accepted", "accepted"),
    "runtime-a-lookup-of-a-differing-object-confirms-nothing": ("accepted", "accepted"),
    "runtime-a-fenced-miss-after-a-restore-is-not-absence": ("accepted", "accepted"),
    "refusal-records-are-append-only": ("refused:lease_holder", "accepted"),
    "every-stale-workers-refusal-is-kept": ("refused:lease_holder", "accepted"),
    "a-superseded-lease-refusal-names-the-newer-begin": ("refused:lease_holder", "accepted"),
    # mistake 3, approval by row id
    "authorization-needs-the-exact-digest": ("refused:request_digest_matches", "accepted"),
    "guard-request-digest-matches": ("refused:request_digest_matches", "accepted"),
    "claims-post-approval-edit-claims-nothing": ("refused:approval_binds_request", "accepted"),
}


def test_the_naive_store_fails_with_named_counterexamples():
    report = run_suite(StoreDriver(naive_factory, name="naive"), CASES)
    got = {r.case.id: (r.expected, r.got) for r in report.failed}
    assert got == NAIVE_COUNTEREXAMPLES
    assert not report.ok and all(r.status != ERROR for r in report.results)
    messages = {r.case.id: r.message for r in report.failed}
    assert "sends: 2, wanted 1" in messages["runtime-timeout-is-never-resent"]
    assert "objects: 2, wanted 1" in messages["runtime-worker-dies-after-send"]
    assert "result.retried: 1, wanted 0" in messages["runtime-unfenced-not-found-never-resends"]
    assert messages["late-generation-1-authorization-refused"].startswith(
        "step 6 authorize_dispatch (A wakes up): expected refused by lease_holder, got accepted"
    )
    # everything the three mistakes do not touch still passes: the suite is not failing blindly
    passed = {r.case.id for r in report.passed}
    assert {
        "retry-from-failed-creates-no-attempt",
        "guard-plan-unchanged",
        "same-text-accepted-at-window-edge",
    } <= passed
    assert len(passed) == len(ALL) - len(NAIVE_COUNTEREXAMPLES)
    summary = report.summary()
    assert (
        "[FAIL] docs/design.md#testing: verification: fenced recovery (late generation-1 write refused) (1/6 passed)"
        in summary
    )
    assert "[PASS] docs/design.md#testing: verification: retry creates zero rows (1/1 passed)" in summary


@pytest.mark.parametrize("guard", list(table().guards))
def test_deleting_a_guard_from_the_model_fails_a_case_that_names_it(guard):
    def mutant() -> Implementation:
        clock = ManualClock()
        store = MemoryStore(clock=clock)
        store._disabled_guards = frozenset({guard})
        return Implementation(store, clock.advance)

    report = run_suite(StoreDriver(mutant), CASES)
    assert f"refused:{guard}" in {r.expected for r in report.failed}


def test_not_applicable_cases_are_listed_and_never_passed():
    report = run_suite(StoreDriver(memory, features={"store", "runtime"}), CASES)
    na = report.not_applicable
    assert {r.case.id for r in na} == LACKING and len(CLAIMS) >= 20 and len(EVIDENCE) >= 2
    assert {r.message for r in na} == {
        "not applicable: feature not implemented (claims)",
        "not applicable: feature not implemented (evidence)",
    }
    assert not LACKING & {r.case.id for r in report.passed}
    summary = report.summary()
    assert all(cid in summary for cid in LACKING)
    assert f"{len(CASES)} cases" in summary
    xml = ET.fromstring(report.junit_xml())
    assert xml.get("skipped") == str(len(LACKING)) and xml.get("failures") == "0"
    skipped = [tc for tc in xml.iter("testcase") if tc.find("skipped") is not None]
    assert {tc.get("name").split(":")[0] for tc in skipped} == LACKING


def test_a_driver_without_the_runtime_feature_gets_runtime_cases_not_applicable():
    report = run_suite(StoreDriver(memory, features={"store"}), CASES)
    runtime = {c.id for c in CASES if "runtime" in c.requires}
    assert len(runtime) >= 10
    assert {r.case.id for r in report.not_applicable} == runtime | LACKING
    assert report.ok


# ------------------------------------------------------------------------------ command line
def test_cli_exit_codes_summary_and_junit(tmp_path, capsys):
    junit = tmp_path / "naive.xml"
    assert run_cli(["--impl", "tests.conformance.naive_store:factory", "--junit", str(junit)]) == 1
    out = capsys.readouterr().out
    assert "FAILED late-generation-1-authorization-refused" in out
    assert "expected refused by request_digest_matches, got accepted" in out
    assert "result: FAIL" in out
    xml = ET.parse(junit).getroot()
    assert xml.get("failures") == str(len(NAIVE_COUNTEREXAMPLES)) and xml.get("errors") == "0"
    suites = {s.get("name"): s for s in xml.iter("testsuite")}
    assert suites["table guard: request_digest_matches"].get("failures") == "1"

    assert (
        run_cli(["--impl", "atmostonce.conformance.factories:memory", "--rule", "design.md#testing: verification"]) == 0
    )
    out = capsys.readouterr().out
    assert (
        "[PASS] docs/design.md#testing: verification: attempt cap parks (2/2 passed)" in out and "result: PASS" in out
    )


def test_cli_runs_a_subprocess_driver(capsys):
    assert run_cli(["--driver", f"{sys.executable} {JSONL}", "--case", "retry-from-failed-creates-no-attempt"]) == 0
    assert "1 passed, 0 failed" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["--impl", "tests.conformance.no_such_module:factory"],
        ["--impl", "atmostonce.conformance.factories:nothing_here"],
        ["--driver", f"{sys.executable} -c \"print('not json')\""],
        ["--driver", f'{sys.executable} -c "import sys; sys.exit(3)"'],
        ["--impl", "atmostonce.conformance.factories:memory", "--case", "no-such-case"],
    ],
    ids=["no module", "no factory", "garbage driver", "dead driver", "no such case"],
)
def test_cli_usage_errors_exit_2(argv, capsys):
    assert run_cli(argv) == 2
    assert capsys.readouterr().err.startswith("error: ")


def _scripted_driver(on_submit: str) -> SubprocessDriver:
    script = (
        "import sys, json\n"
        "for line in sys.stdin:\n"
        "    op = json.loads(line)['op']\n"
        f"    if op == 'submit': {on_submit}\n"
        "    print(json.dumps({'ok': {'features': ['store']} if op == 'hello' else {}}), flush=True)\n"
    )
    return SubprocessDriver([sys.executable, "-c", script], timeout=10)


@pytest.mark.parametrize(
    ("on_submit", "says"),
    [
        ("sys.exit(1)", "exited"),
        ("pass", "malformed driver answer"),
        ("print('{}', flush=True); continue", "expected exactly one of ok"),
    ],
    ids=["dies", "answers without a key", "answers off-protocol"],
)
def test_a_misbehaving_driver_is_an_error_not_a_pass(on_submit, says):
    driver = _scripted_driver(on_submit)
    try:
        [result] = run_suite(driver, [c for c in CASES if c.id == "begin-opens-one-attempt"]).results
    finally:
        driver.close()
    assert result.status == ERROR
    assert says in result.message


# ------------------------------------------------------------------------------ pytest plugin
def _pytest(tmp_path, *args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    cmd = [sys.executable, "-m", "pytest", "-p", "atmostonce.conformance.plugin", "-q", "-p", "no:cacheprovider", *args]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def test_pytest_plugin_runs_every_case_and_the_stateful_machine(tmp_path):
    run = _pytest(
        tmp_path, "--atmostonce-impl=atmostonce.conformance.factories:memory", "--atmostonce-stateful-examples=5"
    )
    tail = run.stdout.strip().splitlines()[-1]
    assert f"{len(ALL) + 1} passed" in tail and "skipped" not in tail, run.stdout[-3000:]
    assert run.returncode == 0
    assert "atmostonce conformance, by rule" in run.stdout
    assert "stateful machine: passed (5 examples)" in run.stdout


def test_pytest_plugin_fails_the_naive_store_by_case_name(tmp_path):
    run = _pytest(tmp_path, "--atmostonce-impl=tests.conformance.naive_store:factory", "-k", "not stateful", "-rf")
    assert run.returncode == 1
    failed = {line.split("::")[-1].split(" ")[0] for line in run.stdout.splitlines() if line.startswith("FAILED ")}
    assert failed == set(NAIVE_COUNTEREXAMPLES)
    assert "expected refused by lease_holder, got accepted" in run.stdout


def test_pytest_plugin_is_inert_without_its_options(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    assert True\n")
    run = _pytest(tmp_path)
    assert run.returncode == 0 and "1 passed" in run.stdout
    assert "conformance" not in run.stdout


def test_each_case_starts_from_a_fresh_implementation():
    driver = StoreDriver(memory)
    case = next(c for c in CASES if c.id == "same-delivery-is-one-intent")
    assert [r.status for r in run_suite(driver, [case, case]).results] == [PASSED, PASSED]
    lacking = StoreDriver(memory, features={"store"})
    assert {r.status for r in run_suite(lacking, [c for c in CASES if c.id in CLAIMS]).results} == {NOT_APPLICABLE}


# ------------------------------------------------------------------------------ the runner's own checks
class LeakyStore(MemoryStore):
    """Refuses like the model, but touches the row's update time when it does (claim and approval
    refusals touch the intent they are for)."""

    def _leak(self, key):
        with self._lock:
            if key in self._rows:
                self._rows[key]["updated_at"] += 1

    def _apply(self, event, key, args):
        try:
            return super()._apply(event, key, args)
        except Rejected:
            self._leak(key)
            raise

    def _approve(self, args):
        try:
            return super()._approve(args)
        except Rejected:
            self._leak(args.get("key"))
            raise

    def _claim_move(self, event, target, args):
        try:
            return super()._claim_move(event, target, args)
        except Rejected:
            self._leak(args.get("key"))
            raise

    def _approval_move(self, event, approval_id, args):
        try:
            return super()._approval_move(event, approval_id, args)
        except Rejected:
            row = self._approvals.get(approval_id)
            self._leak(row["key"] if row else None)
            raise


def test_a_refusal_that_writes_anything_fails_the_unchanged_check():
    def leaky() -> Implementation:
        clock = ManualClock()
        return Implementation(LeakyStore(clock=clock), clock.advance)

    report = run_suite(StoreDriver(leaky), CASES)
    failed = {r.case.id: r.message for r in report.failed}
    assert "second-begin-refused-while-attempt-open" in failed
    assert "the step changed get although it was not accepted" in failed["second-begin-refused-while-attempt-open"]
    refusing = {
        c.id
        for c in CASES
        if any(
            "unchanged" in s.get("expect", {}) and {"refused", "refused_by_any"} & set(s.get("expect", {}))
            for s in c.steps
        )
    }
    assert set(failed) == refusing


def test_references_and_matchers():
    env = {"l": {"key": "k", "generation": 2, "items": [{"t": "a"}, {"t": "b"}]}, "old": {"generation": 1}}
    assert resolve("$l.items.1.t", env) == "b"
    assert resolve("$$l", env) == "$l"
    assert resolve({"$merge": ["$l", {"generation": "$old.generation"}]}, env)["generation"] == 1
    with pytest.raises(CaseError, match="not bound"):
        resolve("$nope", env)
    with pytest.raises(CaseError, match="does not exist"):
        resolve("$l.items.7", env)
    assert match({"generation": {">": 1}, "key": "k"}, env["l"]) == []
    assert match({"generation": {">": 2}}, env["l"]) == ["generation: 2 is not > 2"]
    assert match({"items": {"distinct_by": "t"}}, env["l"]) == []
    assert match({"items": {"distinct_by": "t"}}, {"items": [{"t": 1}, {"t": 1}]}) != []
    assert match({"items": {"prefix": [{"t": "a"}]}}, env["l"]) == []
    assert match({"items": {"prefix": [{"t": "b"}]}}, env["l"]) != []
    assert match([{}, {"t": "b"}], env["l"]["items"]) == []
    assert match({"missing": None}, {}) == ["missing: missing (wanted None)"]
    assert match(True, 1) != [] and match(1, 1.0) == []


def test_the_runner_reports_every_failing_step_of_a_case():
    """A case runs on after a failing step: the report names each step that differed."""
    from atmostonce.conformance.cases import Case

    case = Case(
        id="two-failing-steps",
        description="two steps that the model answers otherwise",
        rule="runner",
        setup={"intents": [{"name": "it"}]},
        steps=(
            {"op": "begin", "args": {"key": "$it.key"}, "bind": "l", "expect": {"accepted": True, "state": "failed"}},
            {"op": "retry", "args": {"key": "$it.key"}, "expect": {"accepted": True}},
            {"op": "get", "args": {"key": "$it.key"}, "expect": {"accepted": True, "state": "pending"}},
            {"op": "get", "args": {"key": "$l.key"}, "expect": {"accepted": True, "intent": {"attempt_count": 2}}},
        ),
    )
    [r] = run_suite(StoreDriver(memory), [case]).results
    assert r.status == "failed" and (r.step, r.op) == (1, "begin")
    lines = r.message.splitlines()
    assert lines[0] == "step 1 begin: state is 'pending', wanted 'failed'"
    assert lines[1] == "step 2 retry: expected accepted, got refused by source_state"
    assert lines[2] == "step 4 get: intent.attempt_count: 1, wanted 2"
    assert len(lines) == 3


class ReorderedGuardsStore(MemoryStore):
    """The model checking authorize_dispatch's guards in reverse order: a harmless reordering."""

    def _apply(self, event, key, args):
        if event == "authorize_dispatch":
            ev = self.table.event(event)
            with self._lock:
                row = self._rows.get(key)
                if row is not None and row["state"] in ev.sources:
                    from atmostonce.errors import GuardRefused
                    from atmostonce.guards import GUARDS

                    for g in reversed(ev.guards):
                        if not GUARDS[g](row, args, self.now(), self):
                            raise GuardRefused(event, key, g, row["state"])
        return super()._apply(event, key, args)


def test_a_step_several_guards_refuse_accepts_any_guard_of_the_set():
    """refused_by_any: another order of the same guards still passes; a guard outside the set does not."""
    from atmostonce.conformance.cases import Case

    case = next(c for c in CASES if c.id == "expired-pre-authorization-worker-refused")

    def reordered() -> Implementation:
        clock = ManualClock()
        return Implementation(ReorderedGuardsStore(clock=clock), clock.advance)

    [r] = run_suite(StoreDriver(reordered), [case]).results
    assert r.status == PASSED, r.message
    narrowed = Case(
        id=case.id,
        description=case.description,
        rule=case.rule,
        setup=case.setup,
        steps=tuple(
            {**s, "expect": {"refused_by_any": ["lease_holder", "kill_switch_off"], "unchanged": True}}
            if "refused_by_any" in s.get("expect", {})
            else s
            for s in case.steps
        ),
    )
    [r] = run_suite(StoreDriver(reordered), [narrowed]).results
    assert (r.status, r.expected, r.got) == ("failed", "refused:lease_holder|kill_switch_off", "refused:lease_live")
    assert r.message.splitlines()[0].endswith(
        "expected refused by any of lease_holder, kill_switch_off, got refused by lease_live"
    )
