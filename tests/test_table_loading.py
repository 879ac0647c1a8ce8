"""Loading the table afresh gives the table every module uses; each catalogue entry is named by its key.

``table()`` is cached once per process, so most tests only ever see the table parsed at start-up; these call
the loader itself.
"""

from __future__ import annotations

import tomllib

import pytest

from atmostonce.errors import TableCode
from atmostonce.table import TableError, load_table, parse_table, spec_dir, table


def test_a_fresh_load_of_the_default_table_equals_the_cached_one():
    fresh = load_table()
    assert fresh == table()
    assert fresh == load_table(spec_dir() / "table.toml")


def test_every_catalogue_entry_carries_its_own_name():
    t = load_table()
    for catalogue in (t.actors, t.states, t.guards, t.effects, t.events, t.outcomes):
        assert catalogue and all(v.name == k for k, v in catalogue.items())


def test_the_spec_folder_holds_the_table_and_its_schema():
    d = spec_dir()
    assert (d / "table.toml").is_file() and (d / "table.schema.json").is_file()


def test_a_missing_or_malformed_file_is_a_table_error_naming_it(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(TableError) as e:
        load_table(missing)
    assert (e.value.code, e.value.path) == (TableCode.NOT_FOUND, str(missing))
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [unclosed", "utf-8")
    with pytest.raises(TableError) as e:
        load_table(bad)
    assert (e.value.code, e.value.path) == (TableCode.NOT_TOML, str(bad))


def test_a_table_file_in_utf8_with_non_ascii_text_loads(tmp_path):
    raw = (spec_dir() / "table.toml").read_text("utf-8")
    copy = tmp_path / "t.toml"
    copy.write_bytes(raw.replace('name = "', 'name = "\u00e9', 1).encode("utf-8"))
    assert load_table(copy).name.startswith("\u00e9")


def test_with_several_schema_violations_the_first_by_path_is_named():
    raw = tomllib.loads((spec_dir() / "table.toml").read_text("utf-8"))
    raw["version"] = "not a number"
    raw["initial"] = 7
    with pytest.raises(TableError) as e:
        parse_table(raw)
    assert (e.value.code, e.value.where) == (TableCode.SCHEMA, "initial")


def test_a_violation_at_the_top_level_is_located_at_the_root():
    raw = tomllib.loads((spec_dir() / "table.toml").read_text("utf-8"))
    del raw["name"]
    with pytest.raises(TableError) as e:
        parse_table(raw)
    assert e.value.as_dict() == {"code": TableCode.SCHEMA, "path": None, "where": "<root>", "name": None}
