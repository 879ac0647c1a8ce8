"""The SQL guard fragments at their edges, against the model's predicates: a lease is over at its deadline
(``lease_expired``), the duplicate-text window is the half-open [start, start + window) of each claim seen
from ``now`` (``text_window_clear``), and a move presents the row's own restore epoch
(``restore_epoch_current``). The store clock is the one the test sets (the model's injected clock, or the
SQL stores' database clock read from a one-row table: conftest's ``set_clock_store``), so each edge is hit exactly, without sleeping."""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused
from atmostonce.runtime import RuntimeConfig, Sweeper

WINDOW = 60.0
START = 1_000.0


def _authorize(s, it, lease_seconds=3_600):
    lease = s.begin(it.key, lease_seconds=lease_seconds)
    return s.authorize_dispatch(lease, request_digest=it.request_digest, send_lease_seconds=lease_seconds)


def _window(s, set_clock):
    """One authorized send of "same text" at START (its claim spans [START, START + WINDOW)), and a second
    intent of the same text on the same account, pending."""
    set_clock(START)
    s.set_text_window(WINDOW, operator="ops")
    first = s.submit("acct", "post", "room-1", {"text": "same text"})
    assert _authorize(s, first).state == "authorized"
    return s.submit("acct", "post", "room-2", {"text": "same text"})


# ---------------------------------------------------------------- lease_expired
def test_a_lease_is_expired_at_its_deadline_and_the_sweeper_settles_it_then(set_clock_store):
    s, set_clock = set_clock_store
    set_clock(START)
    it = s.submit("acct", "post", "room-1", {"text": "hello"})
    lease = s.begin(it.key, lease_seconds=30)
    set_clock(START + 29.5)
    assert Sweeper(s, RuntimeConfig()).sweep_leases() == {"expired": 0, "abandoned": 0, "skipped": 0}
    set_clock(lease.expires_at)  # the very instant of the deadline
    assert Sweeper(s, RuntimeConfig()).sweep_leases() == {"expired": 0, "abandoned": 1, "skipped": 0}
    after = s.get(it.key)
    assert (after.state, after.attempt_token) == ("pending", None)


# ---------------------------------------------------------------- text_window_clear
def test_a_claim_of_the_same_text_inside_the_window_refuses_the_check_and_the_move(set_clock_store):
    s, set_clock = set_clock_store
    second = _window(s, set_clock)
    set_clock(START + 10)
    assert s.check("authorize_dispatch", second.key, guards=["text_window_clear"]) == "text_window_clear"
    lease = s.begin(second.key, lease_seconds=3_600)
    with pytest.raises(GuardRefused) as refused:
        s.authorize_dispatch(lease, request_digest=second.request_digest)
    assert (refused.value.event, refused.value.guard) == ("authorize_dispatch", "text_window_clear")
    assert s.get(second.key).state == "pending"


def test_the_window_ends_at_the_claims_end(set_clock_store):
    s, set_clock = set_clock_store
    second = _window(s, set_clock)
    set_clock(START + WINDOW - 0.5)
    assert s.check("authorize_dispatch", second.key, guards=["text_window_clear"]) == "text_window_clear"
    set_clock(START + WINDOW)  # the very instant the first claim ends
    assert s.check("authorize_dispatch", second.key, guards=["text_window_clear"]) is None
    assert _authorize(s, second).state == "authorized"


def test_a_claim_starting_a_window_or_more_after_now_does_not_refuse(set_clock_store):
    """With the clock set back (a database clock stepped back), a claim that starts at or after now + window
    does not overlap the window a send now would claim, [now, now + window)."""
    s, set_clock = set_clock_store
    second = _window(s, set_clock)
    set_clock(START - WINDOW + 0.5)  # the claim starts inside [now, now + window)
    assert s.check("authorize_dispatch", second.key, guards=["text_window_clear"]) == "text_window_clear"
    set_clock(START - WINDOW)  # the claim starts exactly at now + window
    assert s.check("authorize_dispatch", second.key, guards=["text_window_clear"]) is None
    set_clock(START - 2 * WINDOW)
    assert s.check("authorize_dispatch", second.key, guards=["text_window_clear"]) is None
    assert _authorize(s, second).state == "authorized"


# ---------------------------------------------------------------- restore_epoch_current
def test_the_epoch_presented_must_be_the_rows_own_not_only_the_current_one(set_clock_store):
    """An intent fenced by a restore and re-queued carries the epoch of its last attempt; a move presenting
    the current epoch (not the row's) is refused by restore_epoch_current, as the model refuses it."""
    s, set_clock = set_clock_store
    set_clock(START)
    it = s.submit("acct", "post", "room-1", {"text": "hello"})
    lease = s.begin(it.key, lease_seconds=30)
    epoch, fenced = s.declare_restore(operator="ops")
    assert (fenced, s.get(it.key).state) == (1, "indeterminate")
    s.park(it.key, operator="alice")
    s.resend(it.key, operator="alice")
    row = s.get(it.key)
    assert row.state == "pending" and row.epoch != epoch
    assert s.check("authorize_dispatch", it.key, {"epoch": epoch}, guards=["restore_epoch_current"]) == (
        "restore_epoch_current"
    )
    assert s.check("authorize_dispatch", it.key, {"epoch": lease.epoch}, guards=["restore_epoch_current"]) == (
        "restore_epoch_current"
    )
