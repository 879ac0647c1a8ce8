"""Loading the auxiliary machines (``spec/claim.toml``, ``spec/approval.toml``) and validating a file against a
named schema.

``machine()`` and ``table()`` are cached once per process, so most tests only ever see what was parsed at
start-up; these call the loaders themselves, on the shipped files or on changed copies of them.
"""

from __future__ import annotations

import json
import tomllib

import pytest

from atmostonce.errors import TableCode
from atmostonce.table import MACHINES, TableError, load_machine, load_table, machine, parse_table, spec_dir


def _raw(name: str) -> dict:
    return tomllib.loads((spec_dir() / f"{name}.toml").read_text("utf-8"))


@pytest.mark.parametrize("name", MACHINES)
def test_each_machine_loads_afresh_from_its_own_file(name):
    raw = _raw(name)
    m = load_machine(name)
    assert (m.name, m.version, m.initial) == (raw["name"], raw["version"], raw["initial"])
    assert tuple(m.states) == tuple(raw["states"])
    assert tuple(m.events) == tuple(ev["name"] for ev in raw["events"])
    assert "outcomes" not in raw and dict(m.outcomes) == {}  # a machine declares no outcomes
    assert m == machine(name)  # the cached machine every module reads is this one


def test_the_two_machines_are_not_the_intent_table():
    claim, approval, intent = load_machine("claim"), load_machine("approval"), load_table()
    assert len({claim.name, approval.name, intent.name}) == 3
    assert claim.initial == "free" and intent.initial != "free"


@pytest.mark.parametrize("bad", ["table", "claims", "", "../claim"])
def test_an_unknown_machine_is_refused_naming_the_known_ones(bad):
    with pytest.raises(TableError) as e:
        load_machine(bad)
    assert (e.value.code, e.value.name) == (TableCode.UNKNOWN_MACHINE, bad)


def test_an_explicit_path_is_read_instead_of_the_shipped_file(tmp_path):
    text = (spec_dir() / "claim.toml").read_text("utf-8")
    copy = tmp_path / "my-claim.toml"
    copy.write_text(text.replace('name = "atmostonce target claim"', 'name = "a copied claim"', 1), "utf-8")
    assert load_machine("claim", copy).name == "a copied claim"
    assert load_machine("claim", str(copy)).name == "a copied claim"
    assert load_machine("claim").name == "atmostonce target claim"  # the shipped one is unchanged
    with pytest.raises(TableError) as e:
        load_machine("claim", tmp_path / "absent.toml")
    assert (e.value.code, e.value.path) == (TableCode.NOT_FOUND, str(tmp_path / "absent.toml"))


def test_a_machine_file_is_held_to_the_machine_schema(tmp_path):
    text = (spec_dir() / "approval.toml").read_text("utf-8")
    head, rest = text.split("[states.approved]\n", 1)
    body, tail = rest.split("\n\n", 1)
    assert "meaning = " in body
    kept = "\n".join(line for line in body.splitlines() if not line.startswith("meaning = "))
    broken = tmp_path / "approval.toml"
    broken.write_text(f"{head}[states.approved]\n{kept}\n\n{tail}", "utf-8")
    with pytest.raises(TableError) as e:
        load_machine("approval", broken)
    assert (e.value.code, e.value.where) == (TableCode.SCHEMA, "states/approved")


def test_load_table_validates_against_the_schema_it_is_given():
    path = spec_dir() / "claim.toml"
    # the intent table's schema wants outcomes and the intent kinds, which a machine does not have
    with pytest.raises(TableError) as e:
        load_table(path)
    assert e.value.code == TableCode.SCHEMA
    m = load_table(path, schema="machine.schema.json")
    assert m == load_machine("claim") and m.initial == "free"


def test_parse_table_of_a_file_without_outcomes_gives_an_empty_catalogue():
    schema = json.loads((spec_dir() / "machine.schema.json").read_text("utf-8"))
    m = parse_table(_raw("approval"), schema)
    assert dict(m.outcomes) == {} and m.events


def test_a_table_file_with_text_outside_ascii_loads_whatever_the_locale(tmp_path, ascii_locale):
    # meanings are free text: a table file is read as UTF-8, not in the locale's encoding
    text = (spec_dir() / "table.toml").read_text("utf-8")
    marker = 'meaning = "'
    assert marker in text
    copy = tmp_path / "table.toml"
    copy.write_text(text.replace(marker, marker + "Zustände — ", 1), "utf-8")
    t = load_table(copy)
    first = next(iter(t.actors.values()))  # the file's first meaning is its first actor's
    assert first.meaning == "Zustände — " + tomllib.loads(text)["actors"][first.name]["meaning"]
