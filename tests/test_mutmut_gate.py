"""The mutmut gate (mutation/mutmut_check.py) fails on an unexplained survivor, and only then.

mutmut 3.8 exits 0 whatever survives, so this checker is what makes a survivor fail CI. These tests
feed it synthetic ``export-cicd-stats`` JSON and ``.meta`` files in mutmut's own format.
"""

from __future__ import annotations

import json

from mutation.mutmut_check import check, explained_but_detected, load_statuses, main, module_of, status_of
from mutation.mutmut_report import record, render

KILLED, SURVIVED = "atmostonce.identity.x_claim_id__mutmut_1", "atmostonce.identity.x_claim_id__mutmut_2"


def _stats(survived=0, killed=0):
    return {"killed": killed, "survived": survived, "total": killed + survived, "no_tests": 0, "skipped": 0}


def _write_run(tmp_path, codes, stats=None):
    """A mutants/ folder as mutmut leaves it: one .meta per source file plus the exported stats."""
    meta = tmp_path / "mutants" / "atmostonce" / "identity.py.meta"
    meta.parent.mkdir(parents=True)
    meta.write_text(
        json.dumps(
            {
                "exit_code_by_key": codes,
                "hash_by_function_name": {},
                "type_check_error_by_key": {},
                "durations_by_key": {},
                "estimated_durations_by_key": {},
            }
        )
    )
    if stats is None:
        stats = _stats(
            survived=sum(1 for c in codes.values() if c == 0), killed=sum(1 for c in codes.values() if c == 1)
        )
    (tmp_path / "mutants" / "mutmut-cicd-stats.json").write_text(json.dumps(stats))
    return tmp_path / "mutants"


def _explained(tmp_path, reasons):
    p = tmp_path / "explained.json"
    p.write_text(json.dumps({"equivalent": reasons}))
    return p


def test_exit_codes_map_to_mutmuts_statuses():
    assert status_of(1) == "killed" and status_of(0) == "survived" and status_of(None) == "not checked"
    assert status_of(-24) == "timeout" and status_of(33) == "no tests"
    assert status_of(99) == "suspicious"  # unknown codes are not silently a kill


def test_module_of_strips_the_mangled_function_and_class():
    assert module_of(KILLED) == "atmostonce.identity"
    assert module_of("atmostonce.identity.xǁ_Visibleǁhandle_data__mutmut_2") == "atmostonce.identity"
    assert module_of("atmostonce_sql.guards.x_p__mutmut_1") == "atmostonce_sql.guards"


def test_all_killed_passes():
    assert check(_stats(killed=2), {KILLED: "killed", SURVIVED: "timeout"}, {}) == []


def test_an_unexplained_survivor_fails_and_is_named():
    problems = check(_stats(survived=1, killed=1), {KILLED: "killed", SURVIVED: "survived"}, {})
    assert len(problems) == 1 and SURVIVED in problems[0] and "not explained" in problems[0]


def test_an_explained_survivor_passes_but_a_blank_reason_does_not():
    statuses = {KILLED: "killed", SURVIVED: "survived"}
    assert (
        check(_stats(survived=1, killed=1), statuses, {SURVIVED: "equivalent: the default is the only version"}) == []
    )
    assert check(_stats(survived=1, killed=1), statuses, {SURVIVED: "  "}) != []


def test_no_tests_and_suspicious_need_a_reason_too():
    problems = check(_stats(), {KILLED: "no tests", SURVIVED: "suspicious"}, {})
    assert len(problems) == 2


def test_an_unfinished_run_fails():
    problems = check(_stats(killed=1), {KILLED: "killed", SURVIVED: "not checked"}, {})
    assert problems and "not checked" in problems[0]


def test_survivors_outside_the_scope_are_not_this_slices_business():
    statuses = {KILLED: "killed", "atmostonce.model.x_f__mutmut_1": "survived"}
    assert check(_stats(survived=1, killed=1), statuses, {}, ["atmostonce.identity.*"]) == []
    assert check(_stats(survived=1, killed=1), statuses, {}, ["atmostonce.model.*"]) != []


def test_a_scope_that_matches_nothing_fails():
    assert check(_stats(killed=1), {KILLED: "killed"}, {}, ["atmostonce.nope.*"]) != []


def test_stats_that_disagree_with_the_meta_files_fail():
    problems = check(_stats(survived=0, killed=2), {KILLED: "killed", SURVIVED: "survived"}, {SURVIVED: "why"})
    assert problems and "export-cicd-stats" in problems[0]


def test_explanations_of_mutants_detected_after_all_are_reported():
    assert explained_but_detected({SURVIVED: "killed"}, {SURVIVED: "reason"}) == [SURVIVED]


def test_main_reads_mutmuts_files_and_sets_the_exit_code(tmp_path, capsys):
    mutants = _write_run(tmp_path, {KILLED: 1, SURVIVED: 0})
    assert load_statuses(mutants) == {KILLED: "killed", SURVIVED: "survived"}
    none = _explained(tmp_path, {})
    results = ["--results", str(tmp_path / "no-results.json")]  # no recorded verdicts: only this run counts
    assert main(["--mutants", str(mutants), "--explained", str(none), *results]) == 1
    assert SURVIVED in capsys.readouterr().out
    why = _explained(tmp_path, {SURVIVED: "equivalent"})
    assert main(["--mutants", str(mutants), "--explained", str(why), *results]) == 0


def test_main_fails_without_the_exported_stats(tmp_path):
    mutants = _write_run(tmp_path, {KILLED: 1})
    (mutants / "mutmut-cicd-stats.json").unlink()
    assert main(["--mutants", str(mutants), "--explained", str(_explained(tmp_path, {}))]) == 1


def test_the_report_lists_every_survivor_with_its_reason(tmp_path):
    mutants = _write_run(tmp_path, {KILLED: 1, SURVIVED: 0})
    res = record(["atmostonce.identity.*"], 12.0, 1, mutants, tmp_path / "results.json", "c0ffee")
    assert {n: e["status"] for n, e in res["mutants"].items()} == {KILLED: "killed", SURVIVED: "survived"}
    text = render(res, {})
    assert f"`{SURVIVED}` | survived | **UNEXPLAINED**" in text
    assert "| `atmostonce.identity` | 2 | 2 | 1 | 0 | 1 | 0 | 0 | 50.0% | unverified hash (2) |" in text
    assert "Score on `reference/` alone (the `atmostonce` modules): 1 of 2 checked mutants detected, 50.0%." in text
    text = render(res, {SURVIVED: "same bytes either way"})
    assert "same bytes either way" in text and "**UNEXPLAINED**" not in text


def test_recording_a_kill_after_a_survival_remembers_it(tmp_path):
    results = tmp_path / "results.json"
    record([], 1.0, 1, _write_run(tmp_path / "a", {KILLED: 1, SURVIVED: 0}), results)
    res = record([SURVIVED], 1.0, 1, _write_run(tmp_path / "b", {KILLED: 1, SURVIVED: 1}), results)
    assert res["killed_after_surviving"] == [SURVIVED]
    assert [r["scope"] for r in res["runs"]] == [["*"], [SURVIVED]]


def test_recording_drops_verdicts_of_mutants_no_longer_generated(tmp_path):
    results = tmp_path / "results.json"
    record([], 1.0, 1, _write_run(tmp_path / "a", {KILLED: 1, SURVIVED: 0}), results)
    # the code SURVIVED mutated changed: mutmut no longer generates it, so its verdict would describe nothing
    res = record([KILLED], 1.0, 1, _write_run(tmp_path / "b", {KILLED: 1}), results)
    assert list(res["mutants"]) == [KILLED]
    assert res["generated"] == {"atmostonce.identity": 1}


def test_a_run_of_many_named_mutants_is_recorded_by_count_and_module(tmp_path):
    names = [f"atmostonce.identity.x_claim_id__mutmut_{i}" for i in range(1, 9)]
    res = record(names, 1.0, 1, _write_run(tmp_path, {KILLED: 1, SURVIVED: 0}), tmp_path / "results.json")
    assert res["runs"][-1]["scope"] == ["8 named mutants of atmostonce.identity"]
    assert res["runs"][-1]["mutants"] == 2  # the two the run had results for
    globs = [f"atmostonce.identity.x_f{i}__mutmut_*" for i in range(7)]
    res = record(globs, 1.0, 1, _write_run(tmp_path / "b", {KILLED: 1, SURVIVED: 0}), tmp_path / "results.json")
    assert res["runs"][-1]["scope"] == ["7 mutant names or patterns of atmostonce.identity"]


def test_the_report_names_the_packages_left_out_from_the_config(tmp_path):
    from mutation.mutmut_report import left_out_packages, render

    assert left_out_packages() == ["atmostonce.conformance", "atmostonce.testing"]
    assert "It leaves out `atmostonce.conformance` and `atmostonce.testing` (`do_not_mutate`)" in render()
    cfg = tmp_path / "pyproject.toml"
    cfg.write_text('[tool.mutmut]\ndo_not_mutate = ["atmostonce/x/*", "atmostonce/y.py"]\n', "utf-8")
    assert left_out_packages(cfg) == ["atmostonce.x", "atmostonce.y"]


def test_docs_mutmut_md_is_generated_from_the_recorded_results():
    from mutation.mutmut_report import DOC

    assert DOC.read_text("utf-8") == render(), "docs/mutmut.md is stale: python -m mutation.mutmut_report --write"


def test_mutmut_runs_import_the_unmutated_packages_from_this_checkout(tmp_path):
    # the editable install may point at another worktree; mutmut only puts mutants/ ahead of it
    import subprocess
    import sys

    from mutation.mutmut_run import ROOT, child_env

    env = child_env({"PATH": "/usr/bin:/bin", "PYTHONPATH": "/elsewhere", "PYTHONDONTWRITEBYTECODE": "1"})
    assert env["PYTHONPATH"].split(":") == [str(ROOT / "reference"), str(ROOT / "adapters"), "/elsewhere"]
    assert "PYTHONDONTWRITEBYTECODE" not in env
    code = "import atmostonce, atmostonce_http, atmostonce_cli; print(atmostonce.__file__, atmostonce_http.__file__, atmostonce_cli.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True, check=True
    )
    files = out.stdout.split()
    assert files == [
        str(ROOT / "reference/atmostonce/__init__.py"),
        str(ROOT / "adapters/atmostonce_http/__init__.py"),
        str(ROOT / "adapters/atmostonce_cli/__init__.py"),
    ]


def _recorded(tmp_path, entries):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"mutants": entries}), "utf-8")
    return results


class _Hashes:
    """The tree's function hashes, as a test sets them."""

    def __init__(self, by_name):
        self.by_name = by_name

    def of(self, name):
        return self.by_name.get(name)


def test_a_recorded_survivor_gets_its_reason_stamped_with_the_body_it_was_given_on(tmp_path):
    from mutation.mutmut_check import explain, load_explained

    results = _recorded(tmp_path, {SURVIVED: {"status": "survived", "function_hash": "abc", "commit": "c1"}})
    path = _explained(tmp_path, {})
    assert explain({SURVIVED: "message text only"}, path, results, _Hashes({SURVIVED: "abc"})) == []
    entry = load_explained(path)[SURVIVED]
    assert (entry["why"], entry["function_hash"]) == ("message text only", "abc")
    assert "unverified_hash" not in entry


def test_a_reason_is_refused_for_a_kill_a_changed_body_or_a_mutant_never_recorded(tmp_path):
    from mutation.mutmut_check import explain

    results = _recorded(
        tmp_path,
        {
            KILLED: {"status": "killed", "function_hash": "abc", "commit": "c1"},
            SURVIVED: {"status": "survived", "function_hash": "old", "commit": "c1"},
        },
    )
    path = _explained(tmp_path, {})
    before = path.read_text("utf-8")
    other = "atmostonce.identity.x_claim_id__mutmut_3"
    problems = explain(
        {KILLED: "x", SURVIVED: "y", other: "z"}, path, results, _Hashes({KILLED: "abc", SURVIVED: "abc", other: "abc"})
    )
    assert sorted(p.split(":")[0] for p in problems) == sorted([KILLED, SURVIVED, other])
    assert path.read_text("utf-8") == before  # nothing written when any one is refused


def test_a_narrowed_mutmut_run_stages_its_own_config_with_only_the_given_tests(tmp_path):
    # a slice's test-to-function map must not mix with the full run's, and its config must select its tests
    import tomllib

    from mutation.mutmut_run import ROOT, stage

    staged = stage(tmp_path / "slice", ["tests/test_identity.py", "tests/test_sources.py"])
    config = staged / "pyproject.toml"
    assert not config.is_symlink()
    mutmut = tomllib.loads(config.read_text("utf-8"))["tool"]["mutmut"]
    original = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["tool"]["mutmut"]
    assert mutmut["pytest_add_cli_args_test_selection"] == ["tests/test_identity.py", "tests/test_sources.py"]
    assert {k: v for k, v in mutmut.items() if k != "pytest_add_cli_args_test_selection"} == {
        k: v for k, v in original.items() if k != "pytest_add_cli_args_test_selection"
    }
    assert (staged / "atmostonce").resolve() == ROOT / "reference" / "atmostonce"


def test_a_narrowed_run_records_its_kills_and_leaves_its_survivors_verdicts_alone(tmp_path):
    # a kill by part of the suite is a kill by all of it; a survivor there may die to a test left out
    results = tmp_path / "results.json"
    record([], 1.0, 1, _write_run(tmp_path / "a", {KILLED: 0, SURVIVED: 0}), results, "c1")
    res = record(
        [KILLED, SURVIVED],
        1.0,
        1,
        _write_run(tmp_path / "b", {KILLED: 1, SURVIVED: 0}),
        results,
        "c2",
        tests=["tests/test_identity.py"],
    )
    assert res["mutants"][KILLED]["status"] == "killed"
    assert res["mutants"][SURVIVED] == {"status": "survived", "function_hash": None, "unverified_hash": True}
    assert res["runs"][-1]["tests"] == ["tests/test_identity.py"] and res["runs"][-1]["mutants"] == 1
    assert res["killed_after_surviving"] == [KILLED]
    assert "(narrowed to 1 test files: kills only)" in render(res, {})  # a reader of docs/mutmut.md sees which runs


def test_pruning_drops_reasons_that_explain_nothing_and_keeps_the_stale_ones(tmp_path):
    # a gone function's mutant no longer exists, and a mutant killed on this body needs no reason; a reason
    # for a function that changed stays (stale) until a person re-reads it or a run settles it
    from mutation.mutmut_check import load_explained, prune

    gone, stale, fresh = (f"atmostonce.identity.x_{f}__mutmut_1" for f in ("gone", "changed", "same"))
    results = _recorded(
        tmp_path,
        {
            KILLED: {"status": "killed", "function_hash": "abc", "commit": "c1"},
            fresh: {"status": "survived", "function_hash": "same", "commit": "c1"},
        },
    )
    reason = {"why": "equivalent", "function_hash": "old", "unverified_hash": True}
    path = _explained(
        tmp_path, {gone: reason, stale: reason, KILLED: reason, fresh: dict(reason, function_hash="same")}
    )
    hashes = _Hashes({stale: "new", KILLED: "abc", fresh: "same"})
    assert prune(path, results, hashes) == sorted([gone, KILLED])
    assert sorted(load_explained(path)) == sorted([stale, fresh])
    assert prune(path, results, hashes) == []  # nothing left to drop: the file is not rewritten


def test_pruning_drops_a_reason_whose_mutant_the_current_body_no_longer_yields(tmp_path):
    # the function shrank: mutmut, run on the body now in the tree, makes only mutants 1 and 2 of it, so a
    # reason for mutant 3 describes nothing; judged only from a run on this very body
    from mutation.mutmut_check import load_explained, prune

    third = "atmostonce.identity.x_claim_id__mutmut_3"
    mutants = _write_run(tmp_path, {KILLED: 1, SURVIVED: 0})
    meta = mutants / "atmostonce" / "identity.py.meta"
    data = json.loads(meta.read_text())
    meta.write_text(json.dumps(dict(data, hash_by_function_name={"x_claim_id": "now"})))
    reason = {"why": "equivalent", "function_hash": "old", "unverified_hash": True}
    path = _explained(tmp_path, {third: reason, SURVIVED: reason})
    results = _recorded(tmp_path, {})
    assert prune(path, results, _Hashes({third: "other", SURVIVED: "other"}), mutants) == []  # a run on another body
    assert prune(path, results, _Hashes({third: "now", SURVIVED: "now"}), mutants) == [third]
    assert list(load_explained(path)) == [SURVIVED]
