"""Lint of the conformance cases (docs/conformance.md): valid, unique, short, and covering what they must.

Coverage is checked against the live sources: every guard in ``spec/table.toml``'s catalogue
must be refused somewhere and hold somewhere, every guard of the approval and claim machines
must be refused somewhere and have its own case, and every store-level item of
``spec/conformance/verification_items.json`` (the verification list of docs/design.md#testing) must be the rule of
at least one case that can run today (not a pending one).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from atmostonce.conformance import RUNTIME_OPS, STORE_OPS, cases_dir, load_cases, load_schema, validate_document
from atmostonce.conformance.cases import NON_CASE_FILES
from atmostonce.conformance.drivers import CLAIM_OPS, EVIDENCE_OPS
from atmostonce.table import MACHINES, machine, table

ROOT = cases_dir()
FILES = sorted(p for p in ROOT.rglob("*.json") if p.name not in NON_CASE_FILES)
CASES = load_cases()
CURRENT = [c for c in CASES if not c.source.startswith("pending/")]
PENDING = [c for c in CASES if c.source.startswith("pending/")]
MACHINES_ = {m: machine(m) for m in MACHINES}
MACHINE_GUARDS = {g for m in MACHINES_.values() for g in m.guards}
STRUCTURAL_GUARDS = {"source_state", "intent_exists"}  # refusals that are not catalogue guards
ITEMS = json.loads((ROOT / "verification_items.json").read_text("utf-8"))["items"]


def _steps(case):
    return [s for s in case.steps if "op" in s]


def test_the_case_schema_is_a_valid_2020_12_schema():
    schema = load_schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_case_file_validates_against_the_schema(path: Path):
    assert validate_document(json.loads(path.read_text("utf-8"))) == []


def test_there_are_cases_and_none_is_pending():
    """The claims cases were pending until the claims feature was built; none is left waiting."""
    assert len(CURRENT) >= 80 and PENDING == []
    assert len([c for c in CURRENT if "claims" in c.requires]) >= 20


def test_case_ids_and_descriptions_are_unique():
    ids = [c.id for c in CASES]
    descriptions = [c.description for c in CASES]
    assert len(set(ids)) == len(ids)
    assert len(set(descriptions)) == len(descriptions), [d for d in descriptions if descriptions.count(d) > 1]


def test_descriptions_are_short_present_tense_statements():
    for c in CASES:
        assert len(c.description) < 100, c.id
        assert not c.description.endswith("."), c.id
        assert not re.match(r"(?i)(should|must|test|check|verify|ensure|it )\b", c.description), c.description


def test_every_guard_in_the_catalogue_is_refused_somewhere_and_holds_somewhere():
    t = table()
    refused = {s["expect"]["refused"] for c in CURRENT for s in _steps(c) if "refused" in s["expect"]}
    held = {
        g
        for c in CURRENT
        for s in _steps(c)
        if s["expect"].get("accepted") and s["op"] in t.events
        for g in t.events[s["op"]].guards
    }
    assert set(t.guards) - refused == set(), "guards no case sees refuse"
    assert set(t.guards) - held == set(), "guards no case sees hold"
    assert MACHINE_GUARDS - refused == set(), "approval or claim guards no case sees refuse"
    assert refused - set(t.guards) - MACHINE_GUARDS - STRUCTURAL_GUARDS == set(), "refusals by a guard no table knows"


def test_every_guard_has_its_own_case():
    rules = {c.rule for c in CURRENT}
    assert {f"table guard: {g}" for g in table().guards} <= rules
    assert {f"table guard: {g}" for g in MACHINE_GUARDS} <= rules


def test_every_store_level_verification_item_is_covered():
    assert len(ITEMS) == 12 and len({i["rule"] for i in ITEMS}) == 12
    rules = {c.rule for c in CURRENT}
    missing = [i["rule"] for i in ITEMS if i["store_level"] and i["rule"] not in rules]
    assert missing == []


def test_every_verification_rule_used_by_a_case_is_a_listed_item():
    listed = {i["rule"] for i in ITEMS}
    used = {c.rule for c in CASES if c.rule.startswith("docs/design.md#testing: verification:")}
    assert used - listed == set()


def test_current_cases_use_only_operations_drivers_answer():
    for c in CURRENT:
        allowed = set(STORE_OPS) | (set(RUNTIME_OPS) if "runtime" in c.requires else set())
        allowed |= set(CLAIM_OPS) if "claims" in c.requires else set()
        allowed |= set(EVIDENCE_OPS) if "evidence" in c.requires else set()
        used = {s["op"] for s in _steps(c)}
        assert used <= allowed, (c.id, used - allowed)
        if "runtime" in c.requires:
            assert used & set(RUNTIME_OPS), f"{c.id} requires runtime without using it"


def test_cases_that_use_claims_operations_require_the_feature():
    for c in CURRENT:
        if {s["op"] for s in _steps(c)} & set(CLAIM_OPS):
            assert "claims" in c.requires, c.id


def _refs(value):
    if isinstance(value, str) and value.startswith("$") and not value.startswith("$$"):
        yield value[1:].split(".")[0]
    elif isinstance(value, dict):
        for v in value.values():
            yield from _refs(v)
    elif isinstance(value, list):
        for v in value:
            yield from _refs(v)


def test_references_name_something_bound_earlier():
    for c in CASES:
        bound = set()
        for it in c.setup.get("intents", []):
            bound.add(it["name"])
            if it.get("state", "pending") != "pending":
                bound.add(f"{it['name']}_lease")
        for i, s in enumerate(c.steps, 1):
            used = set(_refs(s.get("args", {}))) | set(_refs(s.get("expect", {}))) | set(_refs(s.get("advance")))
            assert used <= bound, f"{c.id} step {i} uses {used - bound} before binding it"
            if "bind" in s:
                bound.add(s["bind"])


def test_refused_steps_also_check_that_nothing_changed_where_a_subject_exists():
    lazy = [
        (c.id, i)
        for c in CURRENT
        for i, s in enumerate(c.steps, 1)
        if ("refused" in s.get("expect", {}) or "refused_by_any" in s.get("expect", {}))
        and s["expect"].get("refused") != "intent_exists"
        and not s["expect"].get("unchanged")
    ]
    assert lazy == []


BROKEN = {
    "step without expectation": {"op": "begin", "args": {}},
    "accepted and refused": {"op": "begin", "expect": {"accepted": True, "refused": "no_open_attempt"}},
    "unknown fault": {"op": "dispatch", "fault": {"kind": "cosmic_ray"}, "expect": {"accepted": True}},
    "unchanged on an accepted step": {"op": "retry", "expect": {"accepted": True, "unchanged": True}},
    "bind without op": {"advance": 3, "bind": "x"},
    "negative clock move": {"advance": -1},
    "unknown count": {"op": "get", "expect": {"accepted": True, "counts": {"rows": 1}}},
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_the_schema_rejects_broken_steps(name):
    doc = {
        "format": 1,
        "cases": [
            {"id": "x-case", "description": "a case that is broken", "rule": "table: x", "steps": [BROKEN[name]]}
        ],
    }
    assert validate_document(doc) != []


def test_the_schema_rejects_a_long_description_and_an_unnamed_rule():
    base = {"id": "x-case", "rule": "table: x", "steps": [{"advance": 1}]}
    assert validate_document({"format": 1, "cases": [base | {"description": "x" * 100}]}) != []
    assert validate_document({"format": 1, "cases": [base | {"description": "fine words", "rule": "whatever"}]}) != []
    assert validate_document({"format": 1, "cases": [base | {"description": "fine words"}]}) == []
