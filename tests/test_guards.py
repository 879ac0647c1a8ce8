"""Every catalogued guard and effect has exactly one model implementation and one SQL implementation, and
nothing else does (the registries beside each other: atmostonce.guards / atmostonce.effects and
atmostonce_sql.guards / atmostonce_sql.effects)."""

from atmostonce.effects import EFFECTS
from atmostonce.guards import GUARDS
from atmostonce.table import table
from atmostonce_sql.effects import SQL_EFFECTS
from atmostonce_sql.guards import SQL_GUARDS


def test_model_guards_cover_exactly_the_catalogue():
    assert set(GUARDS) == set(table().guards)


def test_sql_guards_cover_exactly_the_catalogue():
    assert set(SQL_GUARDS) == set(table().guards)


def test_model_effects_cover_exactly_the_catalogue():
    assert sorted(EFFECTS) == sorted(table().effects)


def test_sql_effects_cover_exactly_the_catalogue():
    assert sorted(SQL_EFFECTS) == sorted(table().effects)
    assert all(entry.name == name for name, entry in SQL_EFFECTS.items())


def test_every_effect_an_event_names_is_in_both_registries():
    named = {eff for ev in table().events.values() for eff in ev.effects}
    assert named <= set(EFFECTS) & set(SQL_EFFECTS)
