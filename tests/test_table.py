"""The table loader, its schema, its immutability, and every static check (docs/design.md#one-table-read-by-everything)."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from atmostonce.checks import CHECKS, check_table
from atmostonce.errors import TableCode
from atmostonce.table import TableError, load_table, parse_table, table
from tests.fixtures.broken_tables import BROKEN, raw_table

SIX = {"pending", "authorized", "published", "failed", "indeterminate", "parked"}


def test_table_declares_the_six_states_and_which_are_terminal():
    t = table()
    assert set(t.states) == SIX
    assert set(t.terminal_states) == {"published", "parked"}
    assert t.initial == "pending"


def test_shipped_table_passes_every_static_check():
    assert check_table(table()) == {}


def test_table_is_immutable():
    t = table()
    with pytest.raises(TypeError):
        t.states["new"] = t.states["pending"]  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.events["begin"].target = "published"  # type: ignore[misc]
    assert isinstance(t.events["begin"].guards, tuple)


def test_schema_rejects_unknown_keys_and_a_second_name_for_a_state():
    raw = raw_table()
    raw["states"]["pending"]["kind"] = "initial"  # the intent table's states carry no alias for themselves
    with pytest.raises(TableError) as e:
        parse_table(raw)
    assert (e.value.code, e.value.where) == (TableCode.SCHEMA, "states/pending")
    raw = raw_table()
    raw["surprise"] = 1
    with pytest.raises(TableError) as e:
        parse_table(raw)
    assert (e.value.code, e.value.where) == (TableCode.SCHEMA, "<root>")


def test_missing_and_malformed_files_raise_table_error(tmp_path):
    with pytest.raises(TableError) as e:
        load_table(tmp_path / "absent.toml")
    assert e.value.code == TableCode.NOT_FOUND
    bad = tmp_path / "bad.toml"
    bad.write_text("this is = = not toml")
    with pytest.raises(TableError) as e:
        load_table(bad)
    assert e.value.code == TableCode.NOT_TOML


def test_duplicate_event_names_are_refused():
    raw = raw_table()
    raw["events"].append(copy.deepcopy(raw["events"][1]))
    with pytest.raises(TableError) as e:
        parse_table(raw)
    assert (e.value.code, e.value.name) == (TableCode.DUPLICATE_EVENT, raw["events"][1]["name"])


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_each_broken_table_fails_its_check(name):
    check_name, breaker = BROKEN[name]
    raw = raw_table()
    breaker(raw)
    problems = check_table(parse_table(raw))
    assert check_name in problems, f"{name} should fail {check_name}; got {problems}"


def test_every_check_has_a_broken_fixture():
    assert {c for c, _ in BROKEN.values()} == set(CHECKS)


def test_every_outcome_maps_to_exactly_one_declared_state():
    t = table()
    for o in t.outcomes.values():
        assert o.state in t.states
        if o.event is not None:  # an outcome that records a move lands where its event lands
            assert t.events[o.event].target == o.state


def test_only_machine_edge_into_pending_is_retry_from_failed():
    t = table()
    edges = [
        (e.name, s)
        for e in t.events.values()
        if e.target == "pending" and not t.actors[e.actor].human
        for s in e.sources
        if s != "pending"
    ]
    assert edges == [("retry", "failed")]
