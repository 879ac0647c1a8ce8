"""A refused conditional write is diagnosed by a second statement with its own reading of the database clock
(docs/design.md#the-gate-is-the-conditional-write). When a guard judged on that clock crosses its edge between
the two, the store tries the write once more instead of reporting a race: the duplicate-text window that
refused the write and had cleared by the diagnosis lets the second write authorize."""

from __future__ import annotations

import pytest

from atmostonce import Rejected
from tests.conftest import MOVING_CLOCK_START

T0 = MOVING_CLOCK_START
WINDOW = 86_400  # the table's duplicate-text window (test_policy_gate.py's edges)


def _pending(store, target):
    it = store.submit("acct", "post", target, {"text": "same text"})
    return it, store.begin(it.key)


def test_a_window_clearing_between_the_refused_write_and_its_diagnosis_authorizes(moving_clock_store, monkeypatch):
    store, set_clock = moving_clock_store
    first, lease = _pending(store, "room-1")
    store.authorize_dispatch(lease, request_digest=first.request_digest)
    set_clock(T0 + WINDOW - 0.5)  # the write is judged inside the window (and the new lease is live)
    second, lease2 = _pending(store, "room-2")
    diagnose = type(store)._diagnose
    diagnosed = []

    def clock_crosses_the_edge_first(self, *a, **kw):
        if not diagnosed:
            set_clock(T0 + WINDOW + 0.5)
        diagnosed.append(a[1].name)
        return diagnose(self, *a, **kw)

    monkeypatch.setattr(type(store), "_diagnose", clock_crosses_the_edge_first)
    moved = store.authorize_dispatch(lease2, request_digest=second.request_digest)
    assert moved.state == "authorized"
    assert diagnosed == ["authorize_dispatch"]  # the second write moved the row: nothing left to diagnose
    assert [h.event for h in store.history(second.key)][-1] == "authorize_dispatch"


def test_a_window_still_closed_is_named_after_the_second_write(moving_clock_store):
    store, set_clock = moving_clock_store
    first, lease = _pending(store, "room-1")
    store.authorize_dispatch(lease, request_digest=first.request_digest)
    set_clock(T0 + WINDOW - 0.5)
    second, lease2 = _pending(store, "room-2")
    with pytest.raises(Rejected) as e:
        store.authorize_dispatch(lease2, request_digest=second.request_digest)
    assert (e.value.guard, e.value.state) == ("text_window_clear", "pending")
