"""A history row's ``recorded_at`` is its move's own clock reading: the ``updated_at`` the move's conditional
write set on the intent (docs/design.md#the-audit-order-tamper-evidence-the-role-reconciliation-records). The
sweeper measures a failed intent's pause (its backoff, the ``Retry-After`` its platform asked for) from
``updated_at``; a person reading the history must see the same instant, even when the machine is slow between
the move and its history row."""

from __future__ import annotations

import pytest

from tests.conftest import MOVING_CLOCK_START
from tests.helpers import begin_authorize


def _moves_and_their_rows(store):
    """``(updated_at, recorded_at of the newest history row)`` after each move of a rate-limited send."""
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    seen = [(store.get(it.key).updated_at, store.history(it.key)[-1].recorded_at)]
    lease = begin_authorize(store, it.key)
    seen.append((store.get(it.key).updated_at, store.history(it.key)[-1].recorded_at))
    store.record_not_sent(lease, reason="HTTP 429", retry_after=1)
    seen.append((store.get(it.key).updated_at, store.history(it.key)[-1].recorded_at))
    store.retry(it.key)
    seen.append((store.get(it.key).updated_at, store.history(it.key)[-1].recorded_at))
    assert [h.event for h in store.history(it.key)][-2:] == ["record_not_sent", "retry"]
    return seen


def test_each_moves_history_row_carries_the_time_its_write_set_on_the_intent(any_store):
    """On the stores' own clocks (PostgreSQL's ``clock_timestamp()`` reads anew at each call in a statement)."""
    seen = _moves_and_their_rows(any_store.store)
    assert [updated == recorded for updated, recorded in seen] == [True] * 4


@pytest.mark.parametrize("moving_clock_store", ["sqlite"], indirect=True)  # PostgreSQL's set clock: one per statement
def test_a_clock_moving_between_the_write_and_its_history_row_does_not_part_them(moving_clock_store):
    store, set_clock = moving_clock_store
    set_clock(MOVING_CLOCK_START, tick_per_read=0.5)  # a slow machine: half a second between any two readings
    seen = _moves_and_their_rows(store)
    assert [updated == recorded for updated, recorded in seen] == [True] * 4
    assert seen[-1][0] > seen[-2][0]  # the clock did move between the moves
