"""The runtime end to end through the real platform sink, on every store (docs/design.md#the-runtime).

The sink runs without idempotency-key dedupe, so a resend would be a visible
second object: ``creates_by_key`` must never exceed one.
"""

from __future__ import annotations

import dataclasses

import pytest

from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, SimulatedCrash, Sweeper
from atmostonce_http import HttpTransport, PlatformSink, sink_config
from tests.helpers import submit

CONFIG = RuntimeConfig(
    lease_seconds=10, send_lease_seconds=10, retries_per_tick=100, reconcile_interval=0, retry_backoff=0
)  # a proven not-sent is retried on the next pass


@pytest.fixture(params=[True, False], ids=["fenced", "unfenced"])
def platform(request):
    fenced = request.param
    # the planned delay outlasts the client's read timeout by a wide margin, and an answer that is not delayed
    # never comes near it, even on a loaded machine
    with PlatformSink(dedupe=False, fenced_lookup=fenced, delay_seconds=3.0, read_lag_seconds=0.3) as sink:
        cfg = sink_config(sink.url, key_field="/delivery_key", lookup_fenced=fenced, read_timeout=1.5)
        with HttpTransport(cfg) as transport:
            yield sink, transport, fenced


def settle(store, transport, advance, rounds=8):
    """Run maintenance the way a deployment would: sweep, reconcile, retry, dispatch what is pending."""
    d = Dispatcher(store, transport, CONFIG)
    for _ in range(rounds):
        advance(11)
        Sweeper(store, CONFIG).tick()
        Reconciler(store, transport, CONFIG).run()
        for key in store.claimable():
            d.dispatch(key)


def no_duplicates(sink):
    assert all(n <= 1 for n in sink.creates_by_key.values()), sink.creates_by_key


FAULTS = {
    # fault: (outcome of the first dispatch, final state with a fenced lookup, final state unfenced)
    None: ("read_back.match", "published", "published"),
    "error_before_write": ("send.unknown", "published", "parked"),
    "error_after_write": ("send.unknown", "published", "published"),
    "drop_before_write": ("send.unknown", "published", "parked"),
    "drop_after_write": ("send.unknown", "published", "published"),
    "reset": ("send.unknown", "published", "parked"),
    "delay": ("send.unknown", None, None),  # it may land before or after the lookup: either is fine
    "read_lag": ("read_back.not_found", "published", "published"),
}


@pytest.mark.parametrize("fault", list(FAULTS), ids=lambda f: f or "none")
def test_every_fault_kind_settles_without_a_duplicate(any_store, platform, fault):
    sink, transport, fenced = platform
    store = any_store.store
    it = submit(store, text=f"fault {fault}")
    if fault == "read_lag":
        sink.plan(fault, seconds=600)  # visible only when the test says so: no race with the clock
    elif fault:
        sink.plan(fault)
    first, final_fenced, final_unfenced = FAULTS[fault]
    assert Dispatcher(store, transport, CONFIG).dispatch(it.key) == first
    if fault == "read_lag":
        assert store.get(it.key).remote_id is not None  # kept for the reconciler
        sink.settle_reads()  # the platform catches up before reconciliation
    settle(store, transport, any_store.advance)
    final = store.get(it.key)
    expected = final_fenced if fenced else final_unfenced
    if expected is not None:
        assert final.state == expected
    no_duplicates(sink)
    assert sink.creates == (1 if final.state == "published" else sink.creates)
    if final.state == "published":
        assert sink.creates_by_key == {it.key: 1}


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "step-by-step"])
def test_a_read_back_that_finds_nothing_is_a_failed_read_back_never_a_confirmation(any_store, platform, fused):
    # the platform took the request but does not show the object yet: on either path the send is unknown
    # (read_back_failed, its object id kept for the reconciler), never published on the strength of the answer
    sink, transport, _ = platform
    store = any_store.store
    it = submit(store, text=f"read lag {fused}")
    sink.plan("read_lag", seconds=600)
    assert Dispatcher(store, transport, CONFIG, fused=fused).dispatch(it.key) == "read_back.not_found"
    after = store.get(it.key)
    assert (after.state, after.remote_id is not None) == ("indeterminate", True)
    assert [h.event for h in store.history(it.key)][-2:] == ["record_success", "read_back_failed"]


def test_connect_refused_is_not_sent_and_retried(any_store):
    store = any_store.store
    it = submit(store)
    sink = PlatformSink(dedupe=False).start()
    url = sink.url
    sink.stop()  # nothing listens there now
    with HttpTransport(sink_config(url, connect_timeout=1)) as transport:
        assert Dispatcher(store, transport, CONFIG).dispatch(it.key) == "send.not_sent"
    assert store.get(it.key).state == "failed"
    assert Sweeper(store, CONFIG).retry_failed() == {"retried": 1, "exhausted": 0, "waiting": 0, "skipped": 0}
    assert store.get(it.key).state == "pending"


@pytest.mark.parametrize(
    "point", ["after_begin", "after_work", "after_authorize", "after_send", "after_record_success"]
)
def test_a_worker_killed_at_each_step_boundary_never_causes_a_second_send(any_store, platform, point):
    sink, transport, fenced = platform
    store = any_store.store
    it = submit(store, text=f"crash {point}")

    def crash(p):
        if p == point:
            raise SimulatedCrash(p)

    with pytest.raises(SimulatedCrash):
        Dispatcher(store, transport, CONFIG, crash=crash).dispatch(it.key)
    settle(store, transport, any_store.advance)
    no_duplicates(sink)
    final = store.get(it.key).state
    if point in ("after_begin", "after_work"):
        assert final == "published"  # nothing was sent: the attempt was abandoned and begun again
        assert [a.outcomes for a in store.attempts(it.key)][0] == ("abandon_attempt",)
    elif point == "after_authorize":
        assert final == ("published" if fenced else "parked")
    else:
        assert final == "published"  # the send landed; reconciliation found it
    if final == "published":
        assert sink.creates_by_key == {it.key: 1}
    else:
        assert sink.creates == 0


def test_recovery_descriptor_drift_parks_instead_of_guessing(any_store, platform):
    sink, transport, _ = platform
    store = any_store.store
    it = submit(store)
    sink.plan("error_before_write")
    Dispatcher(store, transport, CONFIG).dispatch(it.key)
    assert store.get(it.key).descriptor["transport_version"] == transport.protocol_version

    class Upgraded:
        name, protocol_version, capabilities = transport.name, transport.protocol_version + 1, transport.capabilities

    assert Reconciler(store, Upgraded()).reconcile_one(store.get(it.key)) == "reconcile.descriptor_drift"
    assert store.get(it.key).state == "parked"
    assert sink.creates == 0


def test_raising_a_cap_releases_the_backlog_at_the_configured_rate(any_store):
    store = any_store.store
    sink = PlatformSink(dedupe=False).start()
    url = sink.url
    sink.stop()
    with HttpTransport(sink_config(url, connect_timeout=1)) as transport:
        d = Dispatcher(store, transport, CONFIG)
        keys = [submit(store, text=f"b{i}").key for i in range(10)]
        for k in keys:
            d.dispatch(k)
    assert store.count_by_state()["failed"] == 10
    sweeper = Sweeper(store, dataclasses.replace(CONFIG, retries_per_tick=3))
    assert sweeper.retry_failed()["retried"] == 3
    assert store.count_by_state()["pending"] == 3
    assert sweeper.retry_failed()["retried"] == 3
    assert store.count_by_state()["failed"] == 4


def test_a_lookup_that_errors_is_no_evidence_and_writes_nothing(any_store, platform):
    sink, transport, _ = platform
    store = any_store.store
    it = submit(store)
    sink.plan("error_before_write")
    Dispatcher(store, transport, CONFIG).dispatch(it.key)
    before = (store.get(it.key), store.reconciliations(it.key))
    sink.stop()  # the platform is unreachable during reconciliation
    assert Reconciler(store, transport, CONFIG).run() == {"lookup.error": 1}
    assert (store.get(it.key), store.reconciliations(it.key)) == before


def test_reconcile_lookups_of_one_intent_are_spaced_by_the_store_clock(any_store, platform):
    sink, transport, _ = platform
    store = any_store.store
    it = submit(store)
    sink.plan("error_before_write")
    Dispatcher(store, transport, CONFIG).dispatch(it.key)
    paced = Reconciler(store, transport, dataclasses.replace(CONFIG, reconcile_interval=3600))
    first = paced.run()  # the first look at an unknown send is made at once, not an interval later
    assert "deferred" not in first and sum(first.values()) == 1
    looked = len(store.reconciliations(it.key))
    if store.get(it.key).state == "indeterminate":  # a second look waits for the interval (store clock)
        assert paced.run() == {"deferred": 1}
        assert len(store.reconciliations(it.key)) == looked  # no lookup, no record


def test_the_first_look_waits_for_first_look_after(any_store, platform):
    sink, transport, _ = platform
    store = any_store.store
    it = submit(store)
    sink.plan("error_before_write")
    Dispatcher(store, transport, CONFIG).dispatch(it.key)
    late = Reconciler(store, transport, dataclasses.replace(CONFIG, first_look_after=3600))
    assert late.run() == {"deferred": 1}
    assert [r.result for r in store.reconciliations(it.key)] == ["unknown"]  # the open record, no lookup


def test_a_read_back_that_differs_is_not_published(any_store, platform):
    sink, transport, _ = platform
    store = any_store.store
    it = submit(store, text="as approved")

    def someone_edits_the_post(point):
        if point == "after_record_success":
            [oid] = sink.objects
            sink.edit(oid, {"text": "edited by someone", "delivery_key": it.key})

    d = Dispatcher(store, transport, CONFIG, crash=someone_edits_the_post)
    assert d.dispatch(it.key) == "read_back.differs"
    final = store.get(it.key)
    assert final.state == "indeterminate" and final.remote_id is not None
    assert store.history(it.key)[-1].detail["reason"] == "read_back.differs"
