"""A late outcome is evidence, never a move (docs/design.md#late-outcomes-are-evidence).

The scenario: the send lease lapses while the send is still on the wire, the sweeper makes the send
unknown, and only then does the platform answer 201 with an object id. The worker's ``record_success``
is refused; the id must still be kept (on the attempt), and the reconciler must settle the intent by one
read-back of that id, on a platform without lookup by key.
"""

from __future__ import annotations

import pytest

from atmostonce import IllegalMove, IntakeError, Rejected, UnknownIntent
from atmostonce.identity import canonical_json
from atmostonce.records import Lease
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Unsupported
from tests.helpers import begin_authorize, submit


def _lapse_and_sweep(any_store, lease: Lease) -> None:
    any_store.advance(31)  # past the 30 s send lease of begin_authorize
    assert Sweeper(any_store.store).sweep_leases()["expired"] == 1


def test_a_refused_late_success_is_kept_on_its_attempt_and_moves_nothing(any_store):
    store = any_store.store
    it = submit(store)
    lease = begin_authorize(store, it.key)
    _lapse_and_sweep(any_store, lease)
    with pytest.raises(IllegalMove) as refused:
        store.record_success(lease, remote_id="obj-9", response_digest="d" * 64)
    assert (refused.value.event, refused.value.guard) == ("record_success", "source_state")
    before = (store.get(it.key), store.history(it.key), store.attempts(it.key), store.reconciliations(it.key))

    ev = store.record_late_outcome(
        lease,
        outcome="send.success",
        refused=refused.value,
        remote_id="obj-9",
        response_digest="d" * 64,
        worker_time=1234.5,
    )

    assert (ev.key, ev.attempt_token, ev.generation, ev.epoch) == (
        it.key,
        lease.attempt_token,
        lease.generation,
        lease.epoch,
    )
    assert (ev.outcome, ev.refused_event, ev.refused_by) == ("send.success", "record_success", "source_state")
    assert (ev.remote_id, ev.response_digest, ev.worker_time) == ("obj-9", "d" * 64, 1234.5)
    assert ev.recorded_at >= before[0].updated_at  # the store's clock, not the worker's
    assert store.evidence(it.key) == [ev]
    after = (store.get(it.key), store.history(it.key), store.attempts(it.key), store.reconciliations(it.key))
    assert after == before  # state, history, attempts and reconciliation records untouched
    assert after[0].state == "indeterminate" and after[0].remote_id is None


@pytest.mark.parametrize("outcome", ["send.not_sent", "send.unknown", "read_back.not_found"])
def test_every_late_send_or_read_back_outcome_is_kept_without_moving(any_store, outcome):
    store = any_store.store
    it = submit(store)
    lease = begin_authorize(store, it.key)
    _lapse_and_sweep(any_store, lease)
    with pytest.raises(Rejected) as refused:
        store.record_not_sent(lease, reason="connect refused")
    ev = store.record_late_outcome(lease, outcome=outcome, refused=refused.value, reason="late")
    assert (ev.outcome, ev.reason, ev.remote_id) == (outcome, "late", None)
    assert store.get(it.key).state == "indeterminate"  # a late not-sent does not make the send retryable


def test_a_late_outcome_for_no_attempt_of_the_intent_is_refused_and_writes_nothing(any_store):
    store = any_store.store
    it = submit(store)
    lease = begin_authorize(store, it.key)
    _lapse_and_sweep(any_store, lease)
    with pytest.raises(IllegalMove) as refused:
        store.record_success(lease, remote_id="obj-1")
    forged = Lease(it.key, "att_forged", lease.generation, lease.expires_at, lease.epoch)
    wrong_generation = Lease(it.key, lease.attempt_token, lease.generation + 1000, lease.expires_at, lease.epoch)
    for bad in (forged, wrong_generation):
        with pytest.raises(UnknownIntent) as exc:
            store.record_late_outcome(bad, outcome="send.success", refused=refused.value, remote_id="obj-1")
        assert (exc.value.event, exc.value.guard) == ("record_late_outcome", "attempt_exists")
    assert store.evidence(it.key) == []


@pytest.mark.parametrize("outcome", ["lookup.found", "operator.park", "no.such"])
def test_only_send_and_read_back_outcomes_are_late_outcomes(any_store, outcome):
    store = any_store.store
    it = submit(store)
    lease = begin_authorize(store, it.key)
    _lapse_and_sweep(any_store, lease)
    with pytest.raises(IllegalMove) as refused:
        store.record_success(lease, remote_id="obj-1")
    with pytest.raises(IntakeError):
        store.record_late_outcome(lease, outcome=outcome, refused=refused.value, remote_id="obj-1")
    with pytest.raises(IntakeError):  # a success without the platform's id is no evidence of anything
        store.record_late_outcome(lease, outcome="send.success", refused=refused.value)
    assert store.evidence(it.key) == []


class ReadBackOnly:
    """A platform with read-back but no lookup by key; the send answers only after the hook ran."""

    name = "read-back-only"
    protocol_version = 1
    capabilities = Capabilities(read_back=True, lookup_by_key=False)

    def __init__(self, during_send=None):
        self.objects: dict[str, dict] = {}
        self.during_send = during_send
        self.lookups = 0

    def send(self, request):
        oid = f"obj-{len(self.objects) + 1}"
        self.objects[oid] = dict(request.body)
        if self.during_send is not None:
            self.during_send()
        return Sent(oid, "digest")

    def read_back(self, remote_id):
        body = self.objects.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, delivery_key, resend_epoch=0):
        self.lookups += 1
        return Unsupported()

    def matches(self, request, found):
        return canonical_json(dict(request.body)) == canonical_json(dict(found.body or {}))

    def close(self):
        pass


def test_the_reconciler_settles_a_late_success_by_one_read_back_of_the_recorded_id(any_store):
    store = any_store.store
    cfg = RuntimeConfig(send_lease_seconds=2, reconcile_interval=0)
    transport = ReadBackOnly()

    def lease_lapses_while_sending():
        any_store.advance(3)
        assert Sweeper(store, cfg).sweep_leases()["expired"] == 1

    transport.during_send = lease_lapses_while_sending
    it = submit(store)
    with pytest.raises(IllegalMove) as exc:
        Dispatcher(store, transport, cfg).dispatch(it.key)
    assert (exc.value.event, exc.value.guard) == ("record_success", "source_state")
    [ev] = store.evidence(it.key)
    assert (ev.outcome, ev.remote_id, ev.refused_event) == ("send.success", "obj-1", "record_success")

    assert Reconciler(store, transport, cfg).run() == {"lookup.found": 1}
    done = store.get(it.key)
    assert (done.state, done.remote_id, done.reconcile_count) == ("published", "obj-1", 1)
    assert transport.lookups == 0 and len(transport.objects) == 1


def test_a_recorded_id_that_does_not_read_back_as_sent_is_a_difference_never_absence(any_store):
    store = any_store.store
    cfg = RuntimeConfig(send_lease_seconds=2, reconcile_interval=0)
    transport = ReadBackOnly()
    transport.during_send = lambda: (any_store.advance(3), Sweeper(store, cfg).sweep_leases())
    it = submit(store)
    with pytest.raises(IllegalMove):
        Dispatcher(store, transport, cfg).dispatch(it.key)
    transport.objects["obj-1"] = {"text": "edited on the platform"}
    assert Reconciler(store, transport, cfg).run() == {
        "lookup.differs": 1
    }  # found, but not what was sent: neither proof
    after = store.get(it.key)
    assert (after.state, after.reconcile_count, after.remote_id) == ("indeterminate", 1, None)
    assert [r.event for r in store.reconciliations(it.key)] == ["expire_lease", "reconcile_not_found"]


def test_an_id_of_an_earlier_attempt_is_not_used_for_the_current_send(any_store):
    store = any_store.store
    it = submit(store, text=None)  # no text slot: the resent attempt is not held off by the first one's
    lease = begin_authorize(store, it.key)
    _lapse_and_sweep(any_store, lease)
    with pytest.raises(IllegalMove) as refused:
        store.record_success(lease, remote_id="obj-old")
    store.record_late_outcome(lease, outcome="send.success", refused=refused.value, remote_id="obj-old")
    store.park(it.key, operator="alice")
    store.resend(it.key, operator="alice")  # a new resend epoch: the old id names another send
    lease2 = begin_authorize(store, it.key)
    store.record_unknown(lease2, reason="read timeout")
    transport = ReadBackOnly()
    transport.objects["obj-old"] = dict(store.get(it.key).request)
    assert Reconciler(store, transport, RuntimeConfig(reconcile_interval=0)).run() == {"lookup.unsupported": 1}
    assert store.get(it.key).state == "parked"


@pytest.mark.slow
def test_late_201_over_http_is_published_by_the_reconciler_via_the_recorded_id(sql_store):
    """The reported case on a real database and a real HTTP platform: lease 2 s, the platform answers
    after 3 s; the sweeper runs when the answer is in (the lease has lapsed by the database clock by
    then, whatever the machine's load), before the worker records it."""
    from atmostonce_http import HttpTransport, PlatformSink, sink_config

    class NoKeyLookup(HttpTransport):
        def lookup(self, delivery_key, resend_epoch=0):  # pragma: no cover - the test fails if it is called
            raise AssertionError("the reconciler looked the key up")

    cfg = RuntimeConfig(send_lease_seconds=2, reconcile_interval=0)
    swept: list[dict] = []

    def crash(point):
        if point == "after_send":
            swept.append(Sweeper(sql_store, cfg).sweep_leases())

    with PlatformSink(lookup=False) as sink:
        transport = NoKeyLookup(sink_config(sink.url, lookup_path=None))
        try:
            assert not transport.capabilities.lookup_by_key and transport.capabilities.read_back
            it = sql_store.submit("acct", "post", "room-1", {"text": "late answer"})
            sink.plan("delay", 3.0)
            with pytest.raises(IllegalMove) as exc:
                Dispatcher(sql_store, transport, cfg, crash=crash).dispatch(it.key)
            assert (exc.value.event, exc.value.guard) == ("record_success", "source_state")
            assert swept == [{"expired": 1, "abandoned": 0, "skipped": 0}]
            [oid] = sink.objects
            [ev] = sql_store.evidence(it.key)
            assert (ev.outcome, ev.remote_id, ev.attempt_token) == (
                "send.success",
                oid,
                sql_store.attempts(it.key)[0].attempt_token,
            )
            assert ev.response_digest is not None and ev.worker_time is not None
            assert sql_store.get(it.key).state == "indeterminate"

            assert Reconciler(sql_store, transport, cfg).run() == {"lookup.found": 1}
            done = sql_store.get(it.key)
            assert (done.state, done.remote_id) == ("published", oid)
            assert [h.actor for h in sql_store.history(it.key)][-1] == "reconciler"
            assert sink.creates == 1
        finally:
            transport.close()


def test_the_conformance_driver_records_and_reads_late_outcomes_under_its_evidence_feature():
    from atmostonce import MemoryStore
    from atmostonce.conformance.drivers import StoreDriver, encode
    from atmostonce.testing.stateful import FakeClock, StoreUnderTest

    clock = FakeClock()
    driver = StoreDriver(lambda: StoreUnderTest(MemoryStore(clock=clock), clock.advance))
    driver.reset()
    it = submit(driver.store)
    lease = begin_authorize(driver.store, it.key)
    clock.advance(31)
    Sweeper(driver.store).sweep_leases()
    args = {
        "lease": encode(lease),
        "outcome": "send.success",
        "refused_event": "record_success",
        "refused_by": "source_state",
        "remote_id": "obj-3",
    }
    out = driver.call("record_late_outcome", args)
    assert (out["outcome"], out["remote_id"], out["attempt_token"]) == ("send.success", "obj-3", lease.attempt_token)
    [item] = driver.call("evidence", {"key": it.key})["items"]
    assert item == out
    without = StoreDriver(driver.factory, features={"store"})
    without.reset()
    assert without.call("evidence", {"key": it.key})["error"]["type"] == "unsupported"
