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


def test_every_sql_guard_of_every_machine_has_one_calling_convention():
    # (c, now, x): the moved table's columns, the database clock, the GuardRefs; intent, approval and claim alike
    import inspect

    import sqlalchemy as sa

    from atmostonce.table import machine
    from atmostonce_sql.claims import APPROVAL_SQL_GUARDS, CLAIM_SQL_GUARDS
    from atmostonce_sql.guards import GuardRefs
    from atmostonce_sql.schema import approvals, claims, intents
    from atmostonce_sql.store import db_now

    x = GuardRefs(sa.bindparam("c_key"), sa.bindparam("c_approval_id"), table(), machine("approval"))
    for registry, cols in ((SQL_GUARDS, intents.c), (APPROVAL_SQL_GUARDS, approvals.c), (CLAIM_SQL_GUARDS, claims.c)):
        for name, fragment in registry.items():
            assert list(inspect.signature(fragment).parameters) == ["c", "now", "x"], name
            assert isinstance(fragment(cols, db_now("sqlite"), x), sa.ColumnElement), name
