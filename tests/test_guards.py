"""Every catalogued guard has a model predicate and a SQL fragment, and nothing else does."""

from atmostonce.guards import GUARDS
from atmostonce.table import table
from atmostonce_sql.guards import SQL_GUARDS


def test_model_guards_cover_exactly_the_catalogue():
    assert set(GUARDS) == set(table().guards)


def test_sql_guards_cover_exactly_the_catalogue():
    assert set(SQL_GUARDS) == set(table().guards)


def test_every_effect_has_a_model_implementation():
    from atmostonce.model import MemoryStore

    for eff in table().effects:
        assert hasattr(MemoryStore, f"_eff_{eff}"), eff
