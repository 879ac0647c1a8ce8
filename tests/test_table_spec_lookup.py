"""Where the transition table is found (atmostonce.table.spec_dir), how its schema is read, and the auxiliary
machines' states by kind."""

from __future__ import annotations

import importlib
import json
import shutil
import tomllib
import types

import pytest

from atmostonce.errors import TableCode
from atmostonce.table import TableError, load_table, machine, spec_dir, table

table_module = importlib.import_module("atmostonce.table")  # the package's `table` attribute is the loader function


def _package_resources(root):
    """What importlib.resources answers for the installed package: ``files("atmostonce")`` is ``root``."""
    return types.SimpleNamespace(files=lambda package: root)


def test_spec_dir_prefers_the_copy_shipped_in_the_package(tmp_path, monkeypatch):
    source = spec_dir()
    shipped = tmp_path / "site-packages" / "atmostonce" / "_spec"
    shutil.copytree(source, shipped)
    monkeypatch.setattr(table_module, "resources", _package_resources(shipped.parent))
    assert spec_dir() == shipped
    assert load_table().version == table().version  # the shipped copy loads, schema and all


def test_spec_dir_falls_back_to_the_source_tree_when_the_package_ships_no_table(tmp_path, monkeypatch):
    source = spec_dir()
    (tmp_path / "atmostonce" / "_spec").mkdir(parents=True)  # the folder without table.toml
    monkeypatch.setattr(table_module, "resources", _package_resources(tmp_path / "atmostonce"))
    assert spec_dir() == source


def test_no_table_in_the_package_or_the_source_tree_is_a_not_found_table_error(tmp_path, monkeypatch):
    (tmp_path / "pkg" / "atmostonce").mkdir(parents=True)
    monkeypatch.setattr(table_module, "resources", _package_resources(tmp_path / "pkg" / "atmostonce"))
    # a source tree with no spec/ beside the package: <tmp>/src/atmostonce/table.py, <tmp>/spec absent
    monkeypatch.setattr(table_module, "__file__", str(tmp_path / "src" / "atmostonce" / "table.py"))
    with pytest.raises(TableError) as missing:
        spec_dir()
    assert (missing.value.code, missing.value.path, missing.value.where, missing.value.name) == (
        TableCode.NOT_FOUND,
        str(tmp_path / "spec"),
        None,
        None,
    )
    assert missing.value.as_dict() == {
        "code": TableCode.NOT_FOUND,
        "path": str(tmp_path / "spec"),
        "where": None,
        "name": None,
    }


def test_a_schema_with_text_outside_ascii_is_read_as_utf8_whatever_the_locale(tmp_path, ascii_locale):
    schema = json.loads((spec_dir() / "table.schema.json").read_text("utf-8"))
    schema["description"] = "Zustände — " + str(schema.get("description", ""))
    custom = tmp_path / "custom.schema.json"
    custom.write_text(json.dumps(schema, ensure_ascii=False), "utf-8")
    assert custom.read_bytes().isascii() is False
    t = load_table(spec_dir() / "table.toml", schema=str(custom))  # an absolute name: spec_dir() / it is it
    assert t.version == table().version


@pytest.mark.parametrize("name", ["claim", "approval"])
def test_states_of_kind_names_a_machines_states_of_those_kinds_in_table_order(name):
    raw = tomllib.loads((spec_dir() / f"{name}.toml").read_text("utf-8"))
    kinds = {s["kind"] for s in raw["states"].values()}
    m = machine(name)
    for kind in kinds:
        assert m.states_of_kind(kind) == tuple(n for n, s in raw["states"].items() if s["kind"] == kind)
    assert m.states_of_kind(*kinds) == tuple(raw["states"])
    assert m.states_of_kind() == ()
    assert m.states_of_kind("no_such_kind") == ()
    assert table().states_of_kind(*kinds) == ()  # the intent table's states have no kind


def test_the_shipped_table_schema_is_read_as_utf8_whatever_the_locale(tmp_path, monkeypatch, ascii_locale):
    # today's schema is ASCII; a description with an em dash or an umlaut must not break a C-locale process
    shipped = tmp_path / "atmostonce" / "_spec"
    shutil.copytree(spec_dir(), shipped)
    schema = json.loads((shipped / "table.schema.json").read_text("utf-8"))
    schema["description"] = "Zustände — " + str(schema.get("description", ""))
    (shipped / "table.schema.json").write_text(json.dumps(schema, ensure_ascii=False), "utf-8")
    monkeypatch.setattr(table_module, "resources", _package_resources(shipped.parent))
    raw = tomllib.loads((shipped / "table.toml").read_text("utf-8"))
    assert table_module.parse_table(raw).version == table().version  # schema=None: the shipped schema
    assert load_table().version == table().version
