"""The outbox service (docs/design.md#the-outbox-service): one object runs dispatch workers, the sweeper and the reconciler; it runs until
idle, starts and stops gracefully, outlives database errors with backoff, and reports what it did."""

from __future__ import annotations

import threading
import time

import pytest

import atmostonce
from atmostonce import MemoryStore, Outbox
from atmostonce.errors import StoreError
from atmostonce.identity import canonical_json
from atmostonce.runtime import RuntimeConfig
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Unknown
from atmostonce_http import HttpTransport, PlatformSink, sink_config

FAST = RuntimeConfig(lease_seconds=2, send_lease_seconds=3, reconcile_interval=0.2)
QUICK = {"sweep_every": 0.05, "reconcile_every": 0.05, "poll_every": 0.01, "backoff_base": 0.01, "backoff_max": 0.1}


class Echo:
    """A platform in memory: every send creates one object (counted by key) and is read back as sent.
    ``gate``: when given, each send waits for it (``entered`` is set on the way in); ``unknown_first``: the
    first send of each key lands but answers as unknown, so a lookup settles it."""

    name, protocol_version = "echo", 1
    capabilities = Capabilities(read_back=True, lookup_by_key=True)

    def __init__(self, gate=None, unknown_first=False):
        self.gate, self.entered, self.unknown_first = gate, threading.Event(), unknown_first
        self.objects, self.by_key, self.lock, self.closed = {}, {}, threading.Lock(), False

    def send(self, request):
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        with self.lock:
            rid = f"obj-{len(self.objects)}"
            self.objects[rid] = dict(request.body)
            first = request.delivery_key not in self.by_key
            self.by_key.setdefault(request.delivery_key, []).append(rid)
        if self.unknown_first and first:
            return Unknown("the answer was lost")
        return Sent(rid, canonical_json(request.body).hex()[:16])

    def read_back(self, remote_id):
        return Found(remote_id, self.objects[remote_id]) if remote_id in self.objects else NotFound()

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        ids = self.by_key.get(delivery_key)
        return Found(ids[0], self.objects[ids[0]]) if ids else NotFound()

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        self.closed = True


def kinds(store):
    t = store.table
    out: dict[str, int] = {}
    for state, n in store.count_by_state().items():
        out[t.states[state].kind] = out.get(t.states[state].kind, 0) + n
    return {k: v for k, v in out.items() if v}


@pytest.fixture(params=["memory", "sqlite"])
def store(request, tmp_path):
    s = MemoryStore() if request.param == "memory" else atmostonce.open_store(f"sqlite:///{tmp_path / 'o.sqlite3'}")
    yield s
    s.close()


def test_run_until_idle_publishes_everything_once_and_reports_it(store):
    platform = Echo(unknown_first=True)
    outbox = Outbox(store, platform, workers=3, config=FAST, seed=1, **QUICK)
    keys = {outbox.submit("acct", "post", "room", {"text": f"hello {i}"}).key for i in range(12)}
    report = outbox.run(until_idle=True, timeout=30)
    assert report.idle and not outbox.running
    assert kinds(store) == {"terminal": 12}
    assert all(len(platform.by_key[k]) == 1 for k in keys)  # every unknown send settled by lookup, none resent
    assert report.dispatched == {"send.unknown": 12}
    assert report.reconciled == {"lookup.found": 12}
    assert report.errors == {} and report.still_running == 0
    assert set(report.as_dict()) >= {"dispatched", "reconciled", "swept", "errors", "idle", "seconds"}
    assert "lookup.found 12" in str(report)


def test_submit_is_idempotent_and_a_second_run_has_nothing_to_do(store):
    outbox = Outbox(store, Echo(), config=FAST, **QUICK)
    a = outbox.submit("acct", "post", "room", {"text": "hello"})
    assert outbox.submit("acct", "post", "room", {"text": "hello"}).key == a.key
    assert outbox.run(until_idle=True, timeout=30).dispatched == {"read_back.match": 1}
    again = Outbox(store, Echo(), config=FAST, **QUICK)
    assert again.submit("acct", "post", "room", {"text": "hello"}).key == a.key
    second = again.run(until_idle=True, timeout=30)
    assert second.idle and second.dispatched == {} and second.reconciled == {}


def test_an_intent_that_waits_for_a_person_does_not_keep_the_run_from_being_idle(store):
    outbox = Outbox(store, Echo(), config=FAST, **QUICK)
    gated = outbox.submit("acct", "reply", "review-1", {"text": "thanks"}, requires_approval=True)
    outbox.submit("acct", "post", "room", {"text": "free"})
    report = outbox.run(until_idle=True, timeout=30)
    assert report.idle and report.dispatched == {"read_back.match": 1}
    assert report.waited["gate.awaiting_approval"] >= 2  # seen held twice in a row
    assert store.get(gated.key).state == store.table.initial
    store.approve(gated.key, approver="alice", expires_in=600)
    assert outbox.run(until_idle=True, timeout=30).idle
    assert kinds(store) == {"terminal": 2}


def test_run_without_until_idle_runs_to_its_timeout():
    outbox = Outbox(MemoryStore(), Echo(), **QUICK)
    started = time.monotonic()
    report = outbox.run(until_idle=False, timeout=0.3)
    assert 0.3 <= time.monotonic() - started < 5
    assert not report.idle and not outbox.running


def test_start_and_stop_in_the_background():
    store = MemoryStore()
    outbox = Outbox(store, Echo(), workers=2, config=FAST, **QUICK).start()
    assert outbox.running
    with pytest.raises(RuntimeError, match="already running"):
        outbox.start()
    key = outbox.submit("acct", "post", "room", {"text": "later"}).key
    deadline = time.monotonic() + 10
    while store.get(key).state == store.table.initial and time.monotonic() < deadline:
        time.sleep(0.02)
    report = outbox.stop()
    assert not outbox.running and report.dispatched == {"read_back.match": 1}
    assert store.table.states[store.get(key).state].kind == "terminal"


def test_stop_finishes_the_send_in_flight_and_records_its_outcome():
    store, gate = MemoryStore(), threading.Event()
    platform = Echo(gate=gate)
    outbox = Outbox(store, platform, config=FAST, **QUICK)
    key = outbox.submit("acct", "post", "room", {"text": "slow"}).key
    outbox.start()
    assert platform.entered.wait(10)  # authorized, bytes on their way
    assert store.table.states[store.get(key).state].kind == "in_flight"
    done: list = []
    stopper = threading.Thread(target=lambda: done.append(outbox.stop()))
    stopper.start()
    time.sleep(0.3)
    assert not done  # stop waits for the dispatch it interrupted nothing of
    gate.set()
    stopper.join(10)
    assert done and done[0].still_running == 0 and done[0].dispatched == {"read_back.match": 1}
    assert store.table.states[store.get(key).state].kind == "terminal"
    assert len(platform.by_key[key]) == 1


def test_stop_with_a_timeout_counts_a_dispatch_still_running():
    gate = threading.Event()
    platform = Echo(gate=gate)
    outbox = Outbox(MemoryStore(), platform, config=FAST, **QUICK)
    outbox.submit("acct", "post", "room", {"text": "stuck"})
    outbox.start()
    assert platform.entered.wait(10)
    assert outbox.stop(timeout=0.1).still_running == 1
    gate.set()


class Outage:
    """A store whose every call but intake fails while ``down`` (a database that stopped)."""

    def __init__(self, store):
        self._store, self.down, self.calls_refused = store, True, 0

    def __getattr__(self, name):
        attr = getattr(self._store, name)
        if not callable(attr) or name in ("submit", "close"):
            return attr

        def call(*a, **kw):
            if self.down:
                self.calls_refused += 1
                raise StoreError("connection to server failed: the database is down")
            return attr(*a, **kw)

        return call


def test_the_service_outlives_a_database_outage_with_backoff():
    real = MemoryStore()
    flaky = Outage(real)
    errors: list[BaseException] = []
    outbox = Outbox(flaky, Echo(), workers=2, config=FAST, on_error=errors.append, **QUICK)
    keys = [outbox.submit("acct", "post", "room", {"text": f"during {i}"}).key for i in range(4)]
    threading.Timer(0.5, lambda: setattr(flaky, "down", False)).start()
    report = outbox.run(until_idle=True, timeout=30)
    assert report.idle
    assert report.errors["poll"] >= 2 and report.errors["sweep"] >= 1 and report.errors["reconcile"] >= 1
    assert all(isinstance(e, StoreError) for e in errors)
    # backoff: far fewer refused calls than a tight loop over 0.5 s would make
    assert flaky.calls_refused < 200
    assert all(real.table.states[real.get(k).state].kind == "terminal" for k in keys)


def test_bad_arguments_are_refused():
    for kw in ({"workers": 0}, {"sweep_every": 0}, {"poll_batch": 0}, {"backoff_base": 2, "backoff_max": 1}):
        with pytest.raises(ValueError):
            Outbox(MemoryStore(), Echo(), **kw)


def test_atmostonce_open_owns_the_store_and_the_transport(tmp_path):
    url = f"sqlite:///{tmp_path / 'front.sqlite3'}"
    with PlatformSink() as sink:
        transport = HttpTransport(sink_config(sink.url))
        with atmostonce.open(url, transport=transport, **QUICK) as outbox:
            intent = outbox.submit("my-account", "post", "room-42", {"text": "hello"})
            assert outbox.run(until_idle=True, timeout=30).dispatched == {"read_back.match": 1}
            assert outbox.store.get(intent.key).state in outbox.store.table.terminal_states
        assert outbox._closed
        with pytest.raises(RuntimeError, match="closed"):
            outbox.run()
    with pytest.raises(ValueError):
        atmostonce.open(url, transport=Echo(), workers=0)
