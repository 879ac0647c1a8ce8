"""The rate window's edge and the order of refusals for a rate-limited account (``window_full`` and
``rate_limit_clear``, adapters/atmostonce_sql/guards.py), on the model and SQLite (and PostgreSQL).

The window is read by the store's clock: the model's injected clock, or for the SQL stores a database clock
the test sets (``set_clock_store`` in tests/conftest.py), so the edge is hit exactly, without sleeping.
"""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused

WINDOW = 60.0
START = 1_000.0


def _send(s, it):
    lease = s.begin(it.key, lease_seconds=3_600)
    return s.authorize_dispatch(lease, request_digest=it.request_digest)


def test_a_window_ends_exactly_window_seconds_after_its_first_send(set_clock_store):
    s, set_clock = set_clock_store
    set_clock(START)
    s.set_rate_limit("acct", 2, window_seconds=WINDOW)
    a, b, c, d, e = (s.submit("acct", "post", f"room-{i}", {"text": f"m{i}"}) for i in range(5))
    assert not s.rate_limited("acct")  # no send yet: no window running
    _send(s, a)
    set_clock(START + 30)
    _send(s, b)  # the second send of the window that began at START
    assert s.rate_limited("acct")
    set_clock(START + WINDOW - 0.5)  # still inside: the window is [START, START + WINDOW)
    assert s.rate_limited("acct")
    lease = s.begin(c.key, lease_seconds=3_600)
    with pytest.raises(GuardRefused) as refused:
        s.authorize_dispatch(lease, request_digest=c.request_digest)
    assert refused.value.guard == "rate_limit_clear" and s.get(c.key).state == "pending"
    set_clock(START + WINDOW)  # the very instant it ends, a new window may begin
    assert not s.rate_limited("acct")
    assert s.authorize_dispatch(lease, request_digest=c.request_digest).state == "authorized"
    # the new window began at START + WINDOW with one send: one more fits, then it is full until it ends
    assert not s.rate_limited("acct")
    _send(s, d)
    assert s.rate_limited("acct")
    set_clock(START + 2 * WINDOW - 0.5)
    assert s.rate_limited("acct")
    set_clock(START + 2 * WINDOW)
    assert not s.rate_limited("acct")
    assert _send(s, e).state == "authorized"


def test_a_full_window_is_named_before_the_missing_claim_of_an_approval_gated_intent(any_store):
    """The intent's own gate refuses first: it waits for the next window (rate_limit_clear), on every store,
    rather than being told its claim cannot start sending."""
    s = any_store.store
    s.set_rate_limit("acct", 1, window_seconds=WINDOW)
    _send(s, s.submit("acct", "post", "room-1", {"text": "first"}))
    assert s.rate_limited("acct")
    gated = s.submit("acct", "post", "room-2", {"text": "needs approval"}, requires_approval=True)
    lease = s.begin(gated.key, lease_seconds=3_600)
    claim_before = s.claim("room-2")
    with pytest.raises(GuardRefused) as refused:
        s.authorize_dispatch(lease, request_digest=gated.request_digest)
    assert (refused.value.event, refused.value.guard) == ("authorize_dispatch", "rate_limit_clear")
    assert s.get(gated.key).state == "pending" and s.claim("room-2") == claim_before
    assert s.rate_limited("acct") and not s.rate_limited("another-account")
