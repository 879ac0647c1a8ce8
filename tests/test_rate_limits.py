"""Per-account rate limits in the policy layer (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract: caps and rate limits are read
before anything fires, so raising one releases a backlog at the configured rate, not at once). On every store."""

from __future__ import annotations

import threading

import pytest

from atmostonce import GuardRefused, IntakeError, Rejected
from atmostonce.runtime import Dispatcher, RuntimeConfig
from atmostonce_http import HttpTransport, PlatformSink, sink_config

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10)


def queued(s, n, account="acct"):
    return [s.submit(account, "post", f"room-{i}", {"text": f"message {i}"}) for i in range(n)]


def authorize(s, it):
    lease = s.begin(it.key, lease_seconds=30)
    return s.authorize_dispatch(lease, request_digest=it.request_digest), lease


def test_the_gate_refuses_past_the_limit_and_the_window_frees_it(any_store):
    s = any_store.store
    s.set_rate_limit("acct", 2, window_seconds=60)
    a, b, c = queued(s, 3)
    authorize(s, a)
    authorize(s, b)
    lease = s.begin(c.key, lease_seconds=600)
    before = (s.get(c.key), len(s.history(c.key)), s.attempts(c.key))
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=c.request_digest)
    assert e.value.guard == "rate_limit_clear"
    assert (s.get(c.key), len(s.history(c.key)), s.attempts(c.key)) == before  # nothing moved
    assert s.rate_limited("acct") and not s.rate_limited("other-account")
    any_store.advance(61)
    assert not s.rate_limited("acct")
    assert s.authorize_dispatch(lease, request_digest=c.request_digest).state == "authorized"


def test_other_accounts_and_removing_the_limit(any_store):
    s = any_store.store
    s.set_rate_limit("acct", 1, window_seconds=60)
    a, b = queued(s, 2)
    (other,) = queued(s, 1, account="other")
    authorize(s, a)
    authorize(s, other)  # no limit for this account
    with pytest.raises(GuardRefused):
        authorize(s, b)
    s.set_rate_limit("acct", None)
    assert not s.rate_limited("acct")
    lease = s.begin(b.key, lease_seconds=30) if s.get(b.key).attempt_token is None else None
    assert lease is None  # b still holds the attempt the refused authorization left open
    [due] = [it for it in s.list_intents(state="pending") if it.key == b.key]
    assert due.attempt_token is not None


def test_bad_limits_are_refused(any_store):
    s = any_store.store
    for bad in (0, -1, True, 1.5, "3"):
        with pytest.raises(IntakeError):
            s.set_rate_limit("acct", bad)
    for window in (0, -5, float("nan"), float("inf")):
        with pytest.raises(IntakeError):
            s.set_rate_limit("acct", 1, window_seconds=window)
    with pytest.raises(IntakeError):
        s.set_rate_limit("", 1)


@pytest.fixture
def platform():
    with PlatformSink(dedupe=False) as sink, HttpTransport(sink_config(sink.url, key_field="/delivery_key")) as t:
        yield sink, t


def test_a_raised_cap_releases_the_backlog_at_the_configured_rate(any_store, platform):
    sink, transport = platform
    s = any_store.store
    s.set_rate_limit("acct", 3, window_seconds=60)
    backlog = queued(s, 8)
    d = Dispatcher(s, transport, CONFIG)
    first = [d.dispatch(it.key) for it in backlog]
    assert first.count("read_back.match") == 3 and first.count("gate.rate_limited") == 5
    assert sum(len(s.attempts(it.key)) for it in backlog) == 3  # the paused ones spent nothing
    s.set_rate_limit("acct", 5, window_seconds=60)  # the cap is raised inside the running window
    second = [d.dispatch(it.key) for it in s.list_intents(state="pending")]
    assert second.count("read_back.match") == 2 and second.count("gate.rate_limited") == 3
    any_store.advance(61)  # the next window: up to five more, and only three remain
    third = [d.dispatch(it.key) for it in s.list_intents(state="pending")]
    assert third == ["read_back.match"] * 3
    assert sink.creates == 8 and all(n == 1 for n in sink.creates_by_key.values())


@pytest.mark.postgres
def test_concurrent_sends_of_one_account_never_exceed_the_limit(pg_databases):
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    s = open_store(url, migrate=False, pool_size=8)
    try:
        for rnd in range(5):
            account = f"acct-{rnd}"
            s.set_rate_limit(account, 3, window_seconds=600)
            its = queued(s, 8, account=account)
            leases = [s.begin(it.key, lease_seconds=60) for it in its]
            barrier, won, errors = threading.Barrier(8), [], []

            def go(it, lease, barrier=barrier, won=won, errors=errors):
                try:
                    barrier.wait()
                    s.authorize_dispatch(lease, request_digest=it.request_digest)
                    won.append(it.key)
                except Rejected as exc:
                    if exc.guard != "rate_limit_clear":
                        errors.append(exc)
                except BaseException as exc:  # surfaced below
                    errors.append(exc)

            threads = [threading.Thread(target=go, args=p) for p in zip(its, leases, strict=True)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == [] and len(won) == 3, (won, errors)
            assert sum(s.get(it.key).state == "authorized" for it in its) == 3
    finally:
        s.close()
        pg_databases.drop(url)
