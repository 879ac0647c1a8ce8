"""The differential machine owns the clock it compares: the store's database clock is the model's at every
step, so a judgement (a due lease, an expired approval, a rate window) never moves with real time."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import invariant

from atmostonce.testing.stateful import StoreUnderTest, make_machine


def test_a_store_under_test_needs_a_clock_hook():
    with pytest.raises(TypeError):
        StoreUnderTest(store=object())  # type: ignore[arg-type]


def test_the_machine_sets_the_sql_store_clock_to_the_model_clock(sqlite_databases):
    from atmostonce_sql import make_engine
    from atmostonce_sql.testing import SetClockStore

    def factory():
        url = sqlite_databases.fresh()
        engine = make_engine(url, pool_size=1)
        store = SetClockStore(engine)

        def close():
            store.close()
            engine.dispose()
            sqlite_databases.drop(url)

        return StoreUnderTest(store, close=close, set_clock=store.set_clock)

    class Checked(make_machine(factory)):
        @invariant()
        def store_clock_is_the_model_clock(self):
            if self.store is not None:
                assert self.store.now() == self.clock()

    Checked.TestCase.settings = settings(
        max_examples=5, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    Checked.TestCase().runTest()
