"""The runtime's loops: what the worker, the sweeper, the reconciler and one dispatch do and count.

The worker loop is driven in the test's own thread (``Worker.run()``, not ``start()``) with a stop
event that records every idle wait and stops after a given number of them, so a round that did work
and a round that only waited are told apart without a clock. The sweeper and the reconciler run
against the model with its fake clock and a scripted in-process transport that records each call.
"""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest

from atmostonce import GuardRefused, IllegalMove, MemoryStore
from atmostonce.identity import request_digest
from atmostonce.names import CLAIM_GUARD
from atmostonce.runtime import (
    RECONCILER_NAME,
    RECONCILER_VERSION,
    Dispatcher,
    Reconciler,
    RuntimeConfig,
    SimulatedCrash,
    Sweeper,
    Worker,
    wire_request,
)
from atmostonce.table import machine
from atmostonce.testing.stateful import FakeClock
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Unsupported
from tests.helpers import begin_authorize, submit, to_state

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, retry_backoff=0)


# ---------------------------------------------------------------- the worker loop
class Stop:
    """A stop event that records each idle wait and is set after ``after_waits`` of them."""

    def __init__(self, after_waits=1):
        self.waits, self.after, self.flag = [], after_waits, False

    def is_set(self):
        return self.flag

    def set(self):
        self.flag = True

    def wait(self, seconds):
        self.waits.append(seconds)
        if len(self.waits) >= self.after:
            self.flag = True


class Script:
    """A dispatcher stand-in: each key's dispatches return (or raise) the next scripted result."""

    def __init__(self, store, script):
        self.store, self.script, self.calls = store, {k: list(v) for k, v in script.items()}, []

    def dispatch(self, key):
        self.calls.append(key)
        result = self.script[key].pop(0)
        if isinstance(result, BaseException):
            raise result
        return result


def run_worker(script, keys, *, store=None, after_waits=1, **kw):
    results = []
    d = Script(store if store is not None else MemoryStore(clock=FakeClock()), script)
    stop = Stop(after_waits)
    w = Worker(d, lambda: list(keys), stop=stop, on_result=lambda k, r: results.append((k, r)), **kw)
    w.run()
    return d, stop, results


def test_an_idle_worker_is_a_daemon_thread_that_waits_before_polling_again():
    # a daemon thread: a process whose main thread ends is not kept alive by its workers
    d = Script(None, {})
    w = Worker(d, lambda: [], stop=Stop())
    assert w.daemon is True
    w.run()
    assert d.calls == []
    assert w.stop_event.waits == [w.idle_sleep] and w.idle_sleep > 0


def test_a_worker_with_nothing_to_do_polls_once_then_waits_for_its_wake():
    # an empty round did nothing: the worker waits (idle_sleep, cut short by its wake) instead of polling again at
    # once, so an idle outbox does not spin on the database
    import threading

    polls = []
    stop, wake = threading.Event(), threading.Event()
    w = Worker(Script(None, {}), lambda: polls.append(1) or [], stop=stop, idle_sleep=60, wake=wake)
    w.start()
    try:
        for _ in range(200):
            if polls:
                break
            stop.wait(0.01)
        stop.wait(0.2)  # long enough for a loop that does not wait to poll thousands of times
        assert len(polls) == 1
        wake.set()
        for _ in range(200):
            if len(polls) == 2:
                break
            stop.wait(0.01)
        assert len(polls) == 2
    finally:
        stop.set()
        wake.set()
        w.join(5)


def test_the_seed_fixes_the_order_a_worker_tries_its_keys():
    keys = [f"k{i}" for i in range(12)]
    script = {k: ["gate.paused"] for k in keys}
    first, again, other = (run_worker(script, keys, seed=seed)[0].calls for seed in (7, 7, 8))
    assert sorted(first) == sorted(keys)  # every key once a round
    assert again == first  # a seed reproduces a run
    assert other != first and sorted(other) == sorted(keys)


def test_a_round_that_did_work_polls_again_at_once_and_an_idle_round_waits():
    d, stop, results = run_worker({"a": ["read_back.match", "gate.paused"]}, ["a"], idle_sleep=0.5)
    assert d.calls == ["a", "a"]  # no wait after the round that published
    assert stop.waits == [0.5]
    assert results == [("a", "read_back.match"), ("a", "gate.paused")]


def test_a_crash_counts_as_work_and_is_reported():
    crash = SimulatedCrash("after_send")
    d, stop, results = run_worker({"a": [crash, "claim.busy"]}, ["a"])
    assert d.calls == ["a", "a"]
    assert stop.waits == [0.02]
    assert results == [("a", crash), ("a", "claim.busy")]


def test_a_store_or_platform_failure_is_reported_and_the_worker_keeps_going():
    boom = RuntimeError("platform down")
    d, stop, results = run_worker({"a": [boom, "gate.paused"], "b": ["gate.paused"] * 2}, ["a", "b"], after_waits=2)
    assert sorted(d.calls) == ["a", "a", "b", "b"]
    assert stop.waits == [0.02, 0.02]  # a failure is no work done
    assert ("a", boom) in results and len(results) == 4


def test_a_refusal_after_begin_is_reported_but_a_lost_begin_is_not():
    lost = GuardRefused("begin", "a" * 64, "no_open_attempt", "pending")
    stale = GuardRefused("authorize_dispatch", "b" * 64, "lease_holder", "pending")
    d, stop, results = run_worker({"a": [lost], "b": [stale]}, ["a", "b"])
    assert sorted(d.calls) == ["a", "b"]
    assert results == [("b", stale)]  # nothing for the begin another worker won, and no exhaust
    assert stop.waits == [0.02]


def test_a_pending_intent_out_of_attempts_is_exhausted_and_the_parking_reported():
    clock = FakeClock()
    s = MemoryStore(clock=clock)
    it = submit(s, max_attempts=1)
    s.begin(it.key, lease_seconds=10)
    clock.advance(60)
    s.abandon_attempt(s.get(it.key))  # pending again, its one attempt spent
    out = GuardRefused("begin", it.key, "attempts_remaining", "pending")
    d, _, results = run_worker({it.key: [out]}, [it.key], store=s)
    assert results == [(it.key, "parked")]
    assert s.get(it.key).state == "parked"
    assert [h.event for h in s.history(it.key)][-1] == "exhaust"


def test_an_exhaust_the_store_refuses_is_reported_with_its_refusal():
    s = MemoryStore(clock=FakeClock())
    it, _ = to_state(s, "authorized")  # exhaust moves only failed or pending intents
    out = GuardRefused("begin", it.key, "attempts_remaining", "authorized")
    d, _, results = run_worker({it.key: [out]}, [it.key], store=s)
    [(key, exc)] = results
    assert key == it.key
    assert isinstance(exc, IllegalMove)
    assert (exc.event, exc.key, exc.state) == ("exhaust", it.key, "authorized")
    assert s.get(it.key).state == "authorized"


def test_a_worker_stopped_mid_round_dispatches_nothing_more():
    s = MemoryStore(clock=FakeClock())
    stop = Stop()
    calls = []

    class Once(Script):
        def dispatch(self, key):
            calls.append(key)
            stop.set()
            return "read_back.match"

    w = Worker(Once(s, {}), lambda: ["a", "b", "c"], stop=stop, seed=1)
    w.run()
    assert len(calls) == 1 and stop.waits == []


# ---------------------------------------------------------------- the sweeper's counts
class Leases:
    """A store whose ``due_leases`` also returns the given snapshots first (a stale view or a state the
    sweeper has no move for); everything else is the model's."""

    def __init__(self, store, extra):
        self._store, self._extra = store, extra

    def due_leases(self, limit=100):
        return list(self._extra) + self._store.due_leases(limit)

    def __getattr__(self, name):
        return getattr(self._store, name)


def test_sweep_leases_counts_expired_abandoned_and_skipped_exactly():
    clock = FakeClock()
    s = MemoryStore(clock=clock)
    authorized = [to_state(s, "authorized", text=f"a{i}")[0] for i in range(2)]
    leased = [submit(s, text=f"l{i}") for i in range(2)]
    for it in leased:
        s.begin(it.key, lease_seconds=10)
    published = to_state(s, "published", text="p")[0]  # the sweeper has no move from published
    clock.advance(120)
    stale = s.get(authorized[0].key)  # met three times: expired once, then refused as already moved
    sweeper = Sweeper(Leases(s, [published, published, stale, stale]), CONFIG)
    assert sweeper.sweep_leases() == {"expired": 2, "abandoned": 2, "skipped": 4}
    assert {s.get(i.key).state for i in authorized} == {"indeterminate"}
    assert {s.get(i.key).state for i in leased} == {"pending"}


def test_sweep_leases_takes_at_most_one_batch():
    clock = FakeClock()
    s = MemoryStore(clock=clock)
    for i in range(3):
        to_state(s, "authorized", text=f"a{i}")
    clock.advance(120)
    assert Sweeper(s, RuntimeConfig(sweep_batch=2)).sweep_leases() == {"expired": 2, "abandoned": 0, "skipped": 0}
    assert s.count_by_state().get("authorized") == 1


def test_expire_approvals_counts_every_expired_approval():
    clock = FakeClock()
    s = MemoryStore(clock=clock)
    for i in range(3):
        it = submit(s, text=f"x{i}", requires_approval=True)
        s.approve(it.key, approver="alice", expires_in=5)
    clock.advance(60)
    assert Sweeper(s, CONFIG).expire_approvals() == {"approvals_expired": 3}


# ---------------------------------------------------------------- the reconciler's decisions
class Platform:
    """A scripted transport: capabilities as given, ``read_back`` and ``lookup`` answer from dicts and
    record their calls."""

    name, protocol_version = "scripted", 1

    def __init__(self, caps, objects=None, by_key=None):
        self.capabilities, self.objects, self.by_key = caps, dict(objects or {}), dict(by_key or {})
        self.calls = []

    def send(self, request):  # pragma: no cover - the reconciler never sends
        raise AssertionError("no send")

    def read_back(self, remote_id):
        self.calls.append(("read_back", remote_id))
        return Found(remote_id, self.objects[remote_id]) if remote_id in self.objects else NotFound()

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        self.calls.append(("lookup", delivery_key, resend_epoch, fence_epoch))
        return self.by_key.get((delivery_key, resend_epoch, fence_epoch), NotFound())

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


def descriptor(**over):
    d = {
        "transport": Platform.name,
        "transport_version": Platform.protocol_version,
        "reconciler": RECONCILER_NAME,
        "reconciler_version": RECONCILER_VERSION,
        "idempotency_key": "k",
    }
    return d | over


def unknown(s, text="hello", desc=None, **kw):
    it = submit(s, text=text, **kw)
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest, send_lease_seconds=30, descriptor=desc)
    s.record_unknown(lease, reason="read timeout")
    return s.get(it.key)


def parked_reason(s, key):
    last = s.history(key)[-1]
    assert (last.event, last.to_state) == ("park_unreconcilable", "parked")
    return last.detail["reason"]


@pytest.mark.parametrize(
    "over", [{"reconciler": "other"}, {"reconciler_version": RECONCILER_VERSION + 1}, {"transport_version": 2}]
)
def test_one_changed_descriptor_field_parks_the_intent_as_drifted(over):
    s = MemoryStore(clock=FakeClock())
    it = unknown(s, desc=descriptor(**over))
    t = Platform(Capabilities(lookup_by_key=True))
    assert Reconciler(s, t, CONFIG).reconcile_one(it) == "reconcile.descriptor_drift"
    assert parked_reason(s, it.key) == "reconcile.descriptor_drift"
    assert t.calls == []


def test_a_spent_budget_parks_with_its_reason():
    s = MemoryStore(clock=FakeClock())
    it = unknown(s, desc=descriptor(), max_reconciles=1)
    s.reconcile_not_found(it.plan)
    t = Platform(Capabilities(lookup_by_key=True))
    assert Reconciler(s, t, CONFIG).reconcile_one(s.get(it.key)) == "reconcile.budget_spent"
    assert parked_reason(s, it.key) == "reconcile.budget_spent"


def test_a_known_remote_id_is_read_back_before_any_key_lookup():
    s = MemoryStore(clock=FakeClock())
    it = submit(s)
    lease = begin_authorize(s, it.key)
    s.record_success(lease, remote_id="r-1")
    s.read_back_failed(lease, reason="read_back.not_found")
    t = Platform(Capabilities(read_back=True, lookup_by_key=False), objects={"r-1": dict(it.request)})
    assert Reconciler(s, t, CONFIG).reconcile_one(s.get(it.key)) == "lookup.found"
    assert t.calls == [("read_back", "r-1")]
    assert (s.get(it.key).state, s.get(it.key).remote_id) == ("published", "r-1")


def test_a_retraction_without_read_back_is_parked_as_unsupported():
    s = MemoryStore(clock=FakeClock())
    orig, _ = to_state(s, "published")
    r = s.submit_retraction(orig.key)
    lease = begin_authorize(s, r.key)
    s.record_unknown(lease, reason="read timeout")
    t = Platform(Capabilities(read_back=False, lookup_by_key=True))
    assert Reconciler(s, t, CONFIG).reconcile_one(s.get(r.key)) == "lookup.unsupported"
    assert parked_reason(s, r.key) == "lookup.unsupported"
    assert t.calls == []


def test_a_transport_without_key_lookup_parks_as_unsupported():
    s = MemoryStore(clock=FakeClock())
    it = unknown(s)
    t = Platform(Capabilities(read_back=True, lookup_by_key=False))
    assert Reconciler(s, t, CONFIG).reconcile_one(it) == "lookup.unsupported"
    assert parked_reason(s, it.key) == "lookup.unsupported"
    assert t.calls == []


def test_a_lookup_the_platform_does_not_support_parks_as_unsupported():
    s = MemoryStore(clock=FakeClock())
    it = unknown(s)
    t = Platform(Capabilities(lookup_by_key=True), by_key={(it.key, 0, 0): Unsupported()})
    assert Reconciler(s, t, CONFIG).reconcile_one(it) == "lookup.unsupported"
    assert parked_reason(s, it.key) == "lookup.unsupported"
    assert t.calls == [("lookup", it.key, 0, 0)]


def test_the_key_lookup_asks_for_the_resend_epoch_of_the_send():
    clock = FakeClock()
    s = MemoryStore(clock=clock)
    it, _ = to_state(s, "parked")
    s.resend(it.key, operator="alice")
    clock.advance(s.text_window_seconds + 1)  # the same text again only after its window
    lease = begin_authorize(s, it.key)
    s.record_unknown(lease, reason="read timeout")
    again = s.get(it.key)
    assert again.resend_epoch == 1
    t = Platform(Capabilities(lookup_by_key=True), by_key={(it.key, 1, 0): Found("r-9")})
    assert Reconciler(s, t, CONFIG).reconcile_one(again) == "lookup.found"
    assert t.calls == [("lookup", it.key, 1, 0)]
    assert (s.get(it.key).state, s.get(it.key).remote_id) == ("published", "r-9")


@pytest.mark.parametrize(
    "fenced, outcome, state",
    [(True, "lookup.not_found_fenced", "failed"), (False, "lookup.not_found", "indeterminate")],
)
def test_a_key_lookup_that_finds_nothing_names_whether_absence_was_proven(fenced, outcome, state):
    s = MemoryStore(clock=FakeClock())
    it = unknown(s)
    t = Platform(Capabilities(lookup_by_key=True, fenced_lookup=fenced))
    assert Reconciler(s, t, CONFIG).reconcile_one(it) == outcome
    assert s.get(it.key).state == state
    assert t.calls == [("lookup", it.key, 0, 0)]


# ---------------------------------------------------------------- one dispatch, its arguments exactly
class Spy:
    """The store as the dispatcher sees it: every call is recorded with its arguments; ``over`` names
    calls answered (or raised) by the test instead of the store."""

    def __init__(self, store, **over):
        self.store, self.over, self.calls = store, over, []

    def __getattr__(self, name):
        real = getattr(self.store, name)
        if not callable(real):
            return real

        def call(*args, **kw):
            self.calls.append((name, args, kw))
            if name in self.over:
                return self.over[name](*args, **kw)
            return real(*args, **kw)

        return call

    def kw(self, name):
        return [kw for n, _, kw in self.calls if n == name]

    def args(self, name):
        return [args for n, args, _ in self.calls if n == name]


class Sink:
    """A recording transport that publishes in memory and answers read-backs from what it published."""

    name, protocol_version, contract_version = "sink", 1, "contract-7"

    def __init__(self, caps=None, digest="resp-digest"):
        self.capabilities, self.digest, self.objects, self.sent = caps or Capabilities(), digest, {}, []

    def send(self, request):
        self.sent.append(request)
        remote = f"r{len(self.sent)}"
        self.objects[remote] = dict(request.body)
        return Sent(remote, response_digest=self.digest)

    def read_back(self, remote_id):
        return Found(remote_id, self.objects[remote_id])

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):  # pragma: no cover - dispatch never looks up
        raise AssertionError("no lookup")

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


def dispatch_with(spy, transport=None, **kw):
    """A step-by-step dispatcher (each move its own call): these tests read the calls it makes;
    tests/test_fused_dispatch.py covers the fused path."""
    kw.setdefault("fused", False)
    return Dispatcher(spy, transport if transport is not None else Sink(), CONFIG, **kw)


def test_a_dispatch_passes_its_account_lease_lengths_contract_and_response_digest_on():
    base = MemoryStore(clock=FakeClock())
    it = submit(base, account="acct-9")
    spy, asked = Spy(base), []
    d = dispatch_with(spy, credential_version=lambda account: asked.append(account) or "cred-2")
    assert d.dispatch(it.key) == "read_back.match"
    assert spy.args("check") == [("authorize_dispatch", it.key)]
    assert asked == ["acct-9"]
    assert spy.kw("begin") == [{"lease_seconds": 10}]
    (auth,) = spy.kw("authorize_dispatch")
    assert auth["contract_version"] == "contract-7"
    assert auth["credential_version"] == "cred-2"
    assert auth["send_lease_seconds"] == 10
    (sent,) = spy.kw("record_success")
    assert sent == {"remote_id": "r1", "response_digest": "resp-digest"}


def test_a_create_goes_out_on_a_transport_that_cannot_retract():
    base = MemoryStore(clock=FakeClock())
    it = submit(base)
    sink = Sink(Capabilities(retract=False))
    assert dispatch_with(Spy(base), sink).dispatch(it.key) == "read_back.match"
    assert [r.body for r in sink.sent] == [dict(it.request)]


def approval(aid, digest, *, state="pending", expires_at=100.0):
    return SimpleNamespace(approval_id=aid, state=state, request_digest=digest, expires_at=expires_at)


def approved_intent():
    base = MemoryStore(clock=FakeClock())
    it = submit(base, requires_approval=True)
    return base, it, request_digest(wire_request(it).body)


@pytest.mark.parametrize("guard", machine("claim").preflight_guards)
def test_an_approval_the_stores_preflight_refuses_is_never_reserved_under(guard):
    base, it, digest = approved_intent()
    a = approval("a1", digest, state=base.approval_table.initial, expires_at=base.now() + 60)
    spy = Spy(base, check_approvals=lambda key, **kw: [(a, guard)])
    assert dispatch_with(spy).dispatch(it.key) == "gate.awaiting_approval"
    # the table's preflight guards, then the target's version (an approval at the current one is preferred)
    preflight = [*base.claim_table.preflight_guards, CLAIM_GUARD.target_version_current]
    assert spy.kw("check_approvals") == [{"request_digest": digest, "guards": preflight}]
    assert spy.kw("reserve_claim") == [] and spy.kw("begin") == []


def test_an_approval_is_no_longer_usable_at_its_exact_deadline():
    clock = FakeClock()
    base = MemoryStore(clock=clock)
    it = submit(base, requires_approval=True)
    base.approve(it.key, approver="alice", expires_in=5)
    clock.advance(5)  # the deadline is now: usable only while it is ahead of the store clock
    [(_, refused)] = base.check_approvals(it.key, request_digest=it.request_digest)
    assert refused == "approval_usable"


@pytest.mark.parametrize(("guard", "outcome"), [("claim_lease_expired", "claim.busy"), ("lost_race", "claim.refused")])
def test_the_reservation_takes_the_latest_expiring_approval_and_names_a_busy_claim(guard, outcome):
    base, it, digest = approved_intent()
    now, live = base.now(), base.approval_table.initial
    usable = [approval("a-late", digest, state=live, expires_at=now + 90)]
    usable[:0] = [approval("a-early", digest, state=live, expires_at=now + 30)]
    usable.append(approval("a-mid", digest, state=live, expires_at=now + 60))

    def refuse(*a, **kw):
        raise GuardRefused("reserve", it.key, guard, "free")

    spy = Spy(base, check_approvals=lambda key, **kw: [(a, None) for a in usable], reserve_claim=refuse)
    assert dispatch_with(spy, owner="w3").dispatch(it.key) == outcome
    assert spy.kw("reserve_claim") == [
        {"approval_id": "a-late", "request_digest": digest, "owner": "w3", "lease_seconds": 10}
    ]
    assert spy.kw("begin") == []


def claimed(guard, event="authorize_dispatch", cls=GuardRefused):
    """An approved intent whose authorization the test refuses with ``guard``; the claim is real."""
    base, it, _ = approved_intent()
    base.approve(it.key, approver="alice", expires_in=600)

    def refuse(lease, **kw):
        raise cls(event, it.key, guard, "leased")

    return base, it, Spy(base, authorize_dispatch=refuse)


def test_a_lost_rate_window_slot_gives_the_claim_back_and_waits():
    base, it, spy = claimed("rate_limit_clear")
    assert dispatch_with(spy).dispatch(it.key) == "gate.rate_limited"
    assert len(spy.args("release_claim")) == 1
    assert base.claim("room-1").state == "free"


@pytest.mark.parametrize("waits", ["gate.paused", None])
def test_which_refusal_at_authorization_is_a_wait_is_read_from_the_table(waits):
    import dataclasses
    from types import MappingProxyType

    from atmostonce.table import table

    t = table()
    guards = dict(t.guards)
    guards["rate_limit_clear"] = dataclasses.replace(guards["rate_limit_clear"], refusal_outcome=waits)
    base = MemoryStore(clock=FakeClock(), table=dataclasses.replace(t, guards=MappingProxyType(guards)))
    it = submit(base)

    def refuse(lease, **kw):
        raise GuardRefused("authorize_dispatch", it.key, "rate_limit_clear", "pending")

    spy = Spy(base, authorize_dispatch=refuse)
    if waits is None:  # not a wait and not a policy gate: a refusal the worker cannot explain is raised
        with pytest.raises(GuardRefused) as e:
            dispatch_with(spy).dispatch(it.key)
        assert e.value.guard == "rate_limit_clear"
    else:
        assert dispatch_with(spy).dispatch(it.key) == waits
    assert spy.args("block_at_gate") == []  # never parked
    assert base.get(it.key).state == "pending"


def test_a_claim_owner_refusal_of_a_claim_move_is_a_stale_worker_not_a_refused_claim():
    base, it, spy = claimed("claim_owner", event=next(iter(MemoryStore(clock=FakeClock()).claim_table.events)))
    with pytest.raises(GuardRefused) as e:
        dispatch_with(spy).dispatch(it.key)
    assert e.value.guard == "claim_owner"
    assert len(spy.args("release_claim")) == 1


def test_a_refusal_by_a_guard_that_is_no_policy_gate_is_raised_and_the_claim_given_back():
    base, it, spy = claimed("lease_holder")
    with pytest.raises(GuardRefused) as e:
        dispatch_with(spy).dispatch(it.key)
    assert e.value.guard == "lease_holder"
    assert len(spy.args("release_claim")) == 1
    assert spy.kw("block_at_gate") == []
    assert base.claim("room-1").state == "free"


# ---------------------------------------------------------------- retry_failed
def failed(s, n, **kw):
    return [to_state(s, "failed", text=f"t{i}", **kw)[0].key for i in range(n)]


def test_retry_failed_takes_at_most_the_given_limit_not_the_configured_one():
    s = MemoryStore(clock=FakeClock())
    failed(s, 3)
    assert Sweeper(s, CONFIG).retry_failed(limit=2) == {"retried": 2, "exhausted": 0, "waiting": 0, "skipped": 0}
    assert len(s.list_intents(state="failed")) == 1


def test_an_intent_whose_last_attempt_failed_is_exhausted_not_retried():
    s = MemoryStore(clock=FakeClock())
    keys = failed(s, 2, max_attempts=1)  # one attempt made, one allowed
    assert Sweeper(s, CONFIG).retry_failed() == {"retried": 0, "exhausted": 2, "waiting": 0, "skipped": 0}
    assert [s.get(k).state for k in keys] == ["parked", "parked"]


def test_an_intent_with_attempts_left_is_retried():
    s = MemoryStore(clock=FakeClock())
    (key,) = failed(s, 1, max_attempts=2)
    assert Sweeper(s, CONFIG).retry_failed() == {"retried": 1, "exhausted": 0, "waiting": 0, "skipped": 0}
    assert s.get(key).state == "pending"


def test_every_refused_retry_is_counted_as_skipped():
    base = MemoryStore(clock=FakeClock())
    keys = failed(base, 2)

    def refuse(key):
        raise GuardRefused("retry", key, "lost_race", "failed")

    spy = Spy(base, retry=refuse)
    assert Sweeper(spy, CONFIG).retry_failed() == {"retried": 0, "exhausted": 0, "waiting": 0, "skipped": 2}
    assert sorted(a for (a,) in spy.args("retry")) == sorted(keys)


# ---------------------------------------------------------------- Reconciler.run
def test_reconciler_run_defers_every_recent_intent_and_goes_on_to_the_due_ones():
    clock = FakeClock()
    base = MemoryStore(clock=clock)
    old = unknown(base, text="old")
    clock.advance(10)
    recent = [unknown(base, text=f"recent{i}") for i in range(2)]
    spy = Spy(base, list_intents=lambda state, limit, after=None: [recent[0], recent[1], old])
    r = Reconciler(spy, Platform(Capabilities()), RuntimeConfig(reconcile_interval=5, first_look_after=5))
    assert r.run() == {"deferred": 2, "lookup.unsupported": 1}
    assert base.get(old.key).state == "parked" and base.get(recent[0].key).state == "indeterminate"


def test_reconciler_run_settles_one_batch_or_the_given_limit():
    base = MemoryStore(clock=FakeClock())
    its = [unknown(base, text=f"t{i}") for i in range(12)]
    r = Reconciler(base, Platform(Capabilities()), RuntimeConfig(reconcile_batch=7))
    assert r.run() == {"lookup.unsupported": 7}  # no lookup on this transport: each one parked
    assert r.run(limit=3) == {"lookup.unsupported": 3}
    assert r.run(limit=0) == {}
    assert sorted(base.get(it.key).state for it in its) == ["indeterminate"] * 2 + ["parked"] * 10


def test_reconciler_run_counts_a_refused_settlement_as_skipped():
    base = MemoryStore(clock=FakeClock())
    its = [unknown(base, text=f"t{i}") for i in range(2)]

    def refuse(moves):  # the batch answers each move with its own refusal
        return [GuardRefused(event, plan.key, "plan_unchanged", "indeterminate") for event, plan, _ in moves]

    spy = Spy(base, reconcile_many=refuse)
    assert Reconciler(spy, Platform(Capabilities()), CONFIG).run() == {"skipped": 2}
    assert [event for [(event, _, _)] in ([m] for m in spy.args("reconcile_many")[0][0])] == [
        "park_unreconcilable",
        "park_unreconcilable",
    ]
    assert [base.get(it.key).state for it in its] == ["indeterminate", "indeterminate"]


# ---------------------------------------------------------------- the wire request and the descriptor
def test_a_post_whose_body_looks_like_a_retraction_is_still_a_create():
    s = MemoryStore(clock=FakeClock())
    it = s.submit("acct", "post", "room-1", {"retracts": "k", "remote_id": "r", "mode": "delete"})
    wire = wire_request(it)
    assert (wire.action, wire.object_id) == ("create", None)


def test_the_wire_request_carries_the_resend_epoch():
    s = MemoryStore(clock=FakeClock())
    it = dataclasses.replace(submit(s), resend_epoch=3)
    assert wire_request(it).resend_epoch == 3


def test_the_dispatch_descriptor_records_the_idempotency_key():
    base = MemoryStore(clock=FakeClock())
    it = submit(base)
    assert dispatch_with(Spy(base)).dispatch(it.key) == "read_back.match"
    assert base.get(it.key).descriptor["idempotency_key"] == wire_request(it).idempotency_key
