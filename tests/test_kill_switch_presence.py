"""A kill switch is engaged while its row exists (migration 0014, docs/design.md#the-gate-is-the-conditional-write):
the upgrade keeps every engaged switch engaged and leaves a switch written false by hand released."""

from __future__ import annotations

import pytest

from tests.helpers import empty_database_url


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_upgrade_keeps_engaged_switches_and_releases_ones_written_false(request, dialect, tmp_path):
    from atmostonce_sql import make_engine, open_store, upgrade

    url, cleanup = empty_database_url(request, dialect, tmp_path)
    engine = make_engine(url)
    try:
        upgrade(engine, "0013")
        with engine.begin() as conn:
            conn.exec_driver_sql(
                "INSERT INTO aom_kill_switches (scope, engaged) VALUES ('account:held', true), ('global', false)"
            )
        store = open_store(url)  # upgrades to head
        try:
            assert (store.kill_switch_engaged("held"), store.kill_switch_engaged("other")) == (True, False)
            assert store.policies()["kill_switches"] == {"account:held": True}
            store.set_kill_switch("account:held", False, operator="ann")
            assert store.kill_switch_engaged("held") is False
        finally:
            store.close()
    finally:
        engine.dispose()
        if cleanup:
            cleanup()
