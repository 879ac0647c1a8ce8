"""A lease is live strictly before its deadline: at the exact instant it expires, the worker holding it may no
longer authorize a send (``lease_live``, reference/atmostonce/guards.py and adapters/atmostonce_sql/guards.py),
on the model, SQLite and PostgreSQL (docs/design.md#leases-fencing-and-the-database-clock).

The store's clock is set by the test (``set_clock_store`` in tests/conftest.py), so the deadline is hit exactly.
"""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused

START = 1_000.0
LEASE = 30.0


def test_a_lease_cannot_authorize_at_its_exact_deadline(set_clock_store):
    s, set_clock = set_clock_store
    set_clock(START)
    it = s.submit("acct", "post", "room-1", {"text": "at the deadline"})
    lease = s.begin(it.key, lease_seconds=LEASE)
    before = s.get(it.key).state
    set_clock(START + LEASE)  # the very instant the lease expires
    with pytest.raises(GuardRefused) as refused:
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert refused.value.guard == "lease_live"
    assert s.get(it.key).state == before  # refused: nothing moved


def test_a_lease_authorizes_just_before_its_deadline(set_clock_store):
    s, set_clock = set_clock_store
    set_clock(START)
    it = s.submit("acct", "post", "room-2", {"text": "just in time"})
    lease = s.begin(it.key, lease_seconds=LEASE)
    set_clock(START + LEASE - 0.25)
    assert s.authorize_dispatch(lease, request_digest=it.request_digest).state == "authorized"
