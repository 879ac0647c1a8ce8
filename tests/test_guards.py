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
