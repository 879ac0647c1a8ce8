"""Recorded mutation evidence is tied to the function body it was given on (mutation/mutmut_check.py).

A mutant's name is a position in its function (``x_f__mutmut_9`` is the ninth mutation of ``f``), so an
edit of ``f`` renumbers its mutants. These tests build a small checkout in a tmp folder, record
verdicts and explanations on one body of a function, change the function, and check what the gate
says: stale inside its scope fails, stale outside a slice's scope is listed and passes, entries from
before hashes were kept are counted as unverified and never taken as fresh.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from mutation.mutmut_check import (
    FRESH,
    STALE,
    UNVERIFIED,
    TreeHashes,
    check,
    check_evidence,
    confirm,
    freshness,
    function_hashes,
    function_of,
    main,
    stale_functions,
)
from mutation.mutmut_report import load_results, migrate_hashes, record, render

ROOT = Path(__file__).resolve().parents[1]

IDENTITY = "def claim_id(a, b):\n    return a + b\n\n\ndef other(x):\n    return x * 2\n"
IDENTITY_EDITED = "def claim_id(a, b):\n    return a - b\n\n\ndef other(x):\n    return x * 2\n"
MODEL = "class Model:\n    def fire(self, event):\n        return event == 'go'\n"
CLAIM_1 = "atmostonce.identity.x_claim_id__mutmut_1"
CLAIM_2 = "atmostonce.identity.x_claim_id__mutmut_2"
OTHER_1 = "atmostonce.identity.x_other__mutmut_1"
FIRE_1 = "atmostonce.model.xǁModelǁfire__mutmut_1"


def _checkout(tmp_path: Path, identity: str = IDENTITY) -> Path:
    """A tree with the two source roots mutmut mutates, as mutation/mutmut_run.py maps them."""
    root = tmp_path / "tree"
    (root / "reference" / "atmostonce").mkdir(parents=True, exist_ok=True)
    (root / "adapters" / "atmostonce_sql").mkdir(parents=True, exist_ok=True)
    (root / "reference" / "atmostonce" / "identity.py").write_text(identity, "utf-8")
    (root / "reference" / "atmostonce" / "model.py").write_text(MODEL, "utf-8")
    return root


def _hash(source: str, func: str) -> str:
    return function_hashes(source)[func]


def _run(tmp_path: Path, codes: dict[str, int | None], identity: str = IDENTITY) -> Path:
    """A mutants/ folder as mutmut leaves it, generated from ``identity`` and MODEL."""
    mutants = tmp_path / "mutants"
    for module, source in (("identity", identity), ("model", MODEL)):
        meta = mutants / "atmostonce" / f"{module}.py.meta"
        meta.parent.mkdir(parents=True, exist_ok=True)
        mine = {n: c for n, c in codes.items() if n.startswith(f"atmostonce.{module}.")}
        meta.write_text(
            json.dumps({"exit_code_by_key": mine, "hash_by_function_name": function_hashes(source)}), "utf-8"
        )
    survived = sum(1 for c in codes.values() if c == 0)
    killed = sum(1 for c in codes.values() if c == 1)
    stats = {"killed": killed, "survived": survived, "total": len(codes), "no_tests": 0, "skipped": 0}
    (mutants / "mutmut-cicd-stats.json").write_text(json.dumps(stats), "utf-8")
    return mutants


def _explained(tmp_path: Path, entries: dict) -> Path:
    p = tmp_path / "explained.json"
    p.write_text(json.dumps({"about": "test", "equivalent": entries}, ensure_ascii=False), "utf-8")
    return p


def _gate(tmp_path: Path, root: Path, mutants: Path, results: Path, explained: Path, *scope: str) -> int:
    return main(
        ["--root", str(root), "--mutants", str(mutants), "--results", str(results), "--explained", str(explained)]
        + list(scope)
    )


def test_our_function_hash_is_mutmuts_own():
    from mutmut.mutation.file_mutation import compute_function_hashes

    for path in (
        "reference/atmostonce/identity.py",
        "reference/atmostonce/model.py",
        "adapters/atmostonce_sql/guards.py",
    ):
        source = (ROOT / path).read_text("utf-8")
        assert function_hashes(source) == compute_function_hashes(source)


def test_the_hash_covers_the_body_not_where_the_function_sits():
    moved = "\n\n# a comment and blank lines above it\n\n" + IDENTITY
    assert _hash(moved, "x_claim_id") == _hash(IDENTITY, "x_claim_id")
    assert _hash(IDENTITY_EDITED, "x_claim_id") != _hash(IDENTITY, "x_claim_id")
    assert function_of(FIRE_1) == "xǁModelǁfire"


def test_a_verdict_recorded_on_the_body_in_the_tree_is_fresh_and_after_an_edit_stale(tmp_path):
    root = _checkout(tmp_path)
    results = tmp_path / "results.json"
    res = record(["atmostonce.identity.*"], 1.0, 1, _run(tmp_path, {CLAIM_1: 1, OTHER_1: 1}), results, "c0ffee")
    assert res["mutants"][CLAIM_1] == {
        "status": "killed",
        "function_hash": _hash(IDENTITY, "x_claim_id"),
        "commit": "c0ffee",
    }
    assert res["runs"][-1]["commit"] == "c0ffee"
    assert freshness(res["mutants"][CLAIM_1], TreeHashes(root).of(CLAIM_1)) == FRESH

    (root / "reference" / "atmostonce" / "identity.py").write_text(IDENTITY_EDITED, "utf-8")
    ev = check_evidence(load_results(results)["mutants"], {}, [], TreeHashes(root))
    assert len(ev.stale_in_scope) == 1  # claim_id changed; other did not
    assert ev.stale_in_scope[0].startswith(f"{CLAIM_1}: stale verdict: function atmostonce.identity.x_claim_id changed")


def test_a_verdict_of_a_function_that_is_gone_is_stale(tmp_path):
    root = _checkout(tmp_path, identity="def other(x):\n    return x * 2\n")
    entry = {"status": "killed", "function_hash": _hash(IDENTITY, "x_claim_id"), "commit": "c0ffee"}
    assert freshness(entry, TreeHashes(root).of(CLAIM_1)) == STALE


def test_a_stale_rerun_selects_exactly_the_changed_functions_that_still_exist(tmp_path):
    root = _checkout(tmp_path)
    results = tmp_path / "results.json"
    record(["atmostonce.identity.*"], 1.0, 1, _run(tmp_path, {CLAIM_1: 1, OTHER_1: 1}), results, "c0ffee")
    verdicts = load_results(results)["mutants"]
    assert stale_functions(verdicts, {}, TreeHashes(root)) == []
    (root / "reference" / "atmostonce" / "identity.py").write_text(IDENTITY_EDITED, "utf-8")
    explained = {FIRE_1: {"why": "x", "function_hash": "0" * 12}}  # an explanation given on another body
    assert stale_functions(verdicts, explained, TreeHashes(root)) == [
        "atmostonce.identity.x_claim_id__mutmut_*",
        "atmostonce.model.xǁModelǁfire__mutmut_*",
    ]
    (root / "reference" / "atmostonce" / "identity.py").write_text("def other(x):\n    return x * 2\n", "utf-8")
    assert stale_functions(verdicts, {}, TreeHashes(root)) == []  # gone: nothing to run, the next record drops it


def test_the_full_check_fails_on_a_stale_verdict_in_a_copy_of_the_real_results_file(tmp_path):
    # the recorded results as they are, and a checkout in which one recorded function changed
    results = tmp_path / "results.json"
    shutil.copy(ROOT / "mutation" / "mutmut_results.json", results)
    recorded = load_results(results)["mutants"]
    name = next(n for n in recorded if n.startswith("atmostonce.identity.x_normalize_text__mutmut_"))
    root = tmp_path / "tree"
    shutil.copytree(ROOT / "reference" / "atmostonce", root / "reference" / "atmostonce")
    shutil.copytree(ROOT / "adapters" / "atmostonce_sql", root / "adapters" / "atmostonce_sql")
    before = {line.partition(":")[0] for line in check_evidence(recorded, {}, [], TreeHashes(root)).stale_in_scope}

    path = root / "reference" / "atmostonce" / "identity.py"
    path.write_text(path.read_text("utf-8").replace("def normalize_text(", "def normalize_text(_unused=None, *, ", 1))
    after = check_evidence(recorded, {}, [], TreeHashes(root))
    stale = {line.partition(":")[0] for line in after.stale_in_scope}
    assert name in stale and name not in before
    assert stale - before == {n for n in recorded if n.startswith("atmostonce.identity.x_normalize_text__mutmut_")}


def test_a_slice_fails_on_stale_entries_inside_it_and_only_lists_those_outside(tmp_path, capsys):
    root = _checkout(tmp_path)
    results = tmp_path / "results.json"
    mutants = _run(tmp_path, {CLAIM_1: 1, CLAIM_2: 1, FIRE_1: 1})
    record([], 1.0, 1, mutants, results, "c0ffee")
    explained = _explained(tmp_path, {})
    # the model changed after its verdicts were recorded; the identity slice is re-run on its current body
    (root / "reference" / "atmostonce" / "model.py").write_text(MODEL.replace("'go'", "'stop'"), "utf-8")
    assert _gate(tmp_path, root, mutants, results, explained, "atmostonce.identity.*") == 0
    out = capsys.readouterr().out
    assert f"warning: {FIRE_1}: stale verdict: function atmostonce.model.xǁModelǁfire changed" in out
    # the same stale verdict inside the scope, and with no scope (the full check), fails
    assert _gate(tmp_path, root, mutants, results, explained, "atmostonce.model.*") == 1
    assert _gate(tmp_path, root, mutants, results, explained) == 1
    assert f"  {FIRE_1}: stale verdict" in capsys.readouterr().out


def test_an_explanation_written_for_another_body_fails_its_slice(tmp_path, capsys):
    root = _checkout(tmp_path, identity=IDENTITY_EDITED)
    results = tmp_path / "results.json"
    mutants = _run(tmp_path, {CLAIM_1: 0, CLAIM_2: 1}, identity=IDENTITY_EDITED)
    record([], 1.0, 1, mutants, results, "c0ffee")
    why = {"why": "equivalent: written for a + b", "function_hash": _hash(IDENTITY, "x_claim_id"), "commit": "0ld"}
    explained = _explained(tmp_path, {CLAIM_1: why})
    assert _gate(tmp_path, root, mutants, results, explained, "atmostonce.identity.*") == 1
    assert f"{CLAIM_1}: stale explanation: function atmostonce.identity.x_claim_id changed" in capsys.readouterr().out


def test_a_run_generated_from_another_body_than_the_trees_fails(tmp_path):
    root = _checkout(tmp_path, identity=IDENTITY_EDITED)
    mutants = _run(tmp_path, {CLAIM_1: 1}, identity=IDENTITY)
    from mutation.mutmut_check import load_meta_hashes, load_statuses

    stats = {"killed": 1, "survived": 0}
    problems = check(stats, load_statuses(mutants), {}, [], load_meta_hashes(mutants), TreeHashes(root))
    assert len(problems) == 1 and problems[0].startswith("atmostonce.identity.x_claim_id: the run's mutants")


def test_migrated_entries_are_unverified_until_their_function_changes_then_stale(tmp_path, capsys):
    root = _checkout(tmp_path)
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [], "generated": {}, "mutants": {CLAIM_1: "killed", FIRE_1: "survived"}}))
    explained = _explained(tmp_path, {FIRE_1: "equivalent: the event names are strings"})
    assert migrate_hashes(results, explained, TreeHashes(root), "c0ffee") == (2, 1)
    verdicts = load_results(results)["mutants"]
    assert verdicts[CLAIM_1] == {
        "status": "killed",
        "function_hash": _hash(IDENTITY, "x_claim_id"),
        "unverified_hash": True,
    }
    assert load_results(results)["hashes_introduced"]["commit"] == "c0ffee"
    assert migrate_hashes(results, explained, TreeHashes(root), "later") == (0, 0)  # once only

    explanations = json.loads(explained.read_text("utf-8"))["equivalent"]
    ev = check_evidence(verdicts, explanations, [], TreeHashes(root))
    assert ev.stale_in_scope == [] and ev.unverified == {"verdicts": 2, "explanations": 1}

    mutants = _run(tmp_path, {CLAIM_1: 1, FIRE_1: 0})
    assert _gate(tmp_path, root, mutants, results, explained) == 0
    assert "unverified hash: 1 explanations, 2 verdicts were recorded before function hashes" in capsys.readouterr().out

    (root / "reference" / "atmostonce" / "identity.py").write_text(IDENTITY_EDITED, "utf-8")
    ev = check_evidence(verdicts, explanations, [], TreeHashes(root))
    assert [line.partition(":")[0] for line in ev.stale_in_scope] == [CLAIM_1]


def test_a_fresh_run_replaces_an_unverified_verdict(tmp_path):
    root = _checkout(tmp_path)
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [], "generated": {}, "mutants": {CLAIM_1: "killed"}}))
    migrate_hashes(results, _explained(tmp_path, {}), TreeHashes(root), "c0ffee")
    res = record([CLAIM_1], 1.0, 1, _run(tmp_path, {CLAIM_1: 1}), results, "beef")
    assert freshness(res["mutants"][CLAIM_1], TreeHashes(root).of(CLAIM_1)) == FRESH
    assert freshness({"status": "killed"}, TreeHashes(root).of(CLAIM_1)) == UNVERIFIED


def test_confirming_an_explanation_needs_a_run_that_left_it_alive_on_this_body(tmp_path):
    root = _checkout(tmp_path)
    explained = _explained(tmp_path, {CLAIM_1: "equivalent: a + b", CLAIM_2: "equivalent: a + b"})
    # CLAIM_2 was killed by the last run: its reason does not hold, nothing is written
    problems = confirm([CLAIM_1, CLAIM_2], _run(tmp_path / "a", {CLAIM_1: 0, CLAIM_2: 1}), explained, TreeHashes(root))
    assert [p.partition(":")[0] for p in problems] == [CLAIM_2]
    assert json.loads(explained.read_text("utf-8"))["equivalent"][CLAIM_1] == "equivalent: a + b"
    # a run generated from an older body does not vouch for this one
    stale_run = _run(tmp_path / "b", {CLAIM_1: 0}, identity=IDENTITY_EDITED)
    assert confirm([CLAIM_1], stale_run, explained, TreeHashes(root)) != []
    assert confirm([CLAIM_1], _run(tmp_path / "c", {CLAIM_1: 0}), explained, TreeHashes(root)) == []
    entry = json.loads(explained.read_text("utf-8"))["equivalent"][CLAIM_1]
    assert entry["why"] == "equivalent: a + b" and entry["function_hash"] == _hash(IDENTITY, "x_claim_id")
    assert "unverified_hash" not in entry and entry["commit"]


def test_the_report_says_at_which_commit_each_modules_verdicts_were_verified(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps({"runs": [], "generated": {}, "mutants": {FIRE_1: "killed"}}))
    root = _checkout(tmp_path)
    migrate_hashes(results, _explained(tmp_path, {}), TreeHashes(root), "c0ffee")
    res = record(
        ["atmostonce.identity.*"], 1.0, 1, _run(tmp_path, {CLAIM_1: 1, CLAIM_2: 1, FIRE_1: 1}), results, "beef"
    )
    rows = {
        line.split(" | ")[0]: line.split(" | ")[-1] for line in render(res, {}).splitlines() if line.startswith("| `")
    }
    assert rows["| `atmostonce.identity`"] == "`beef` (2) |"
    assert rows["| `atmostonce.model`"] == "unverified hash (1) |"
