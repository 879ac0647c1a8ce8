"""Observability (docs/operations.md): one structured log record per move and per refusal, OpenTelemetry
metrics read through the SDK's in-memory reader, spans around authorize, send and read-back, and nothing
secret in any of them."""

from __future__ import annotations

import logging

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from atmostonce import MemoryStore, observe
from atmostonce.errors import Rejected
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig
from atmostonce.testing.stateful import FakeClock
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Unknown


class Platform:
    """A transport whose send answers are scripted; it holds the objects it created."""

    name, protocol_version = "scripted", 1
    capabilities = Capabilities(read_back=True, lookup_by_key=True)

    def __init__(self, answers):
        self.answers, self.objects = list(answers), {}

    def send(self, wire):
        answer = self.answers.pop(0)
        if answer == "ok":
            rid = f"obj-{len(self.objects)}"
            self.objects[rid] = dict(wire.body)
            return Sent(rid, None)
        return Unknown("connection reset after the bytes left")

    def read_back(self, remote_id):
        body = self.objects.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, key, resend_epoch=0, fence_epoch=0):
        return NotFound()

    def matches(self, wire, found):
        return dict(wire.body) == dict(found.body)

    def close(self):
        pass


@pytest.fixture
def otel():
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    tracer = TracerProvider()
    tracer.add_span_processor(SimpleSpanProcessor(spans))
    observe.configure(meter_provider=MeterProvider(metric_readers=[reader]), tracer_provider=tracer)
    yield reader, spans
    observe.configure()


def _points(reader):
    out = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                for p in m.data.data_points:
                    out[(m.name, tuple(sorted(p.attributes.items())))] = p.value
    return out


def test_metrics_count_sends_by_outcome_lookups_refusals_and_states(otel):
    reader, spans = otel
    store = MemoryStore(clock=FakeClock())
    observe.observe_store(store)
    config = RuntimeConfig(reconcile_interval=0)
    t = Platform(["ok", "unknown"])
    ok = store.submit("acct", "post", "room", {"text": "one"})
    lost = store.submit("acct", "post", "room", {"text": "two"})
    d = Dispatcher(store, t, config)
    assert d.dispatch(ok.key) == "read_back.match"
    assert d.dispatch(lost.key) == "send.unknown"
    with pytest.raises(Rejected):
        store.retry(ok.key)  # published: refused by its source state
    assert Reconciler(store, t, config).run() == {"lookup.not_found": 1}
    p = _points(reader)
    assert p[("atmostonce.sends", (("outcome", "send.success"),))] == 1
    assert p[("atmostonce.sends", (("outcome", "send.unknown"),))] == 1
    assert p[("atmostonce.reconcile.lookups", (("outcome", "lookup.not_found"),))] == 1
    refusal = [k for k in p if k[0] == "atmostonce.refusals"]
    assert refusal == [("atmostonce.refusals", (("event", "retry"), ("guard", "source_state")))]
    assert p[("atmostonce.intents", (("state", "published"),))] == 1
    assert p[("atmostonce.moves", (("event", "confirm_read_back"),))] == 1
    states = {dict(k[1])["state"] for k in p if k[0] == "atmostonce.intents"}
    assert states == set(store.table.states)
    names = [s.name for s in spans.get_finished_spans()]
    assert names.count("atmostonce.authorize") == 2 and names.count("atmostonce.send") == 2
    assert names.count("atmostonce.read_back") == 1 and names.count("atmostonce.lookup") == 1
    sent = [s for s in spans.get_finished_spans() if s.name == "atmostonce.send"]
    assert {s.attributes["atmostonce.outcome"] for s in sent} == {"send.success", "send.unknown"}


def test_the_oldest_age_gauge_reports_each_human_owned_state_by_the_store_clock(otel):
    reader, _ = otel
    clock = FakeClock()
    store = MemoryStore(clock=clock)
    observe.observe_store(store)
    first = store.submit("acct", "post", "room", {"text": "a"})
    store.park(first.key, operator="alice")
    clock.advance(100)
    second = store.submit("acct", "post", "room", {"text": "b"})
    store.park(second.key, operator="alice")
    clock.advance(20)
    p = _points(reader)
    assert p[("atmostonce.oldest_age_seconds", (("state", "parked"),))] == pytest.approx(120)
    assert ("atmostonce.oldest_age_seconds", (("state", "indeterminate"),)) not in p  # none waits there
    assert observe.figures(store)["oldest_age_seconds"] == {"indeterminate": None, "parked": pytest.approx(120)}


def test_one_log_record_per_move_with_its_fields_and_no_payload(caplog):
    store = MemoryStore(clock=FakeClock())
    caplog.set_level(logging.INFO, logger="atmostonce.moves")
    it = store.submit("acct", "post", "room", {"text": "private words"})
    lease = store.begin(it.key)
    with pytest.raises(Rejected):
        store.begin(it.key)
    recs = [r for r in caplog.records if r.name == "atmostonce.moves"]
    assert [(r.event, r.state, r.attempt) for r in recs] == [
        ("submit", "pending", 0),
        ("begin", "pending", 1),
        ("begin", "pending", None),
    ]
    assert recs[1].key == it.key and recs[1].generation == store.get(it.key).generation
    assert recs[2].guard == "no_open_attempt" and recs[2].outcome == "refused:no_open_attempt"
    text = " ".join(r.getMessage() + str(r.__dict__) for r in recs)
    assert "private words" not in text and lease.attempt_token not in text


def test_without_a_provider_the_calls_are_no_ops():
    store = MemoryStore(clock=FakeClock())
    observe.record_send("send.success")
    with observe.span("send", key="k") as s:
        observe.set_outcome(s, "send.success")
    assert observe.observe_store(store) is not None  # gauges on the API's no-op provider


GLOBAL_LATER = r"""
import json
from opentelemetry import metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from atmostonce import observe

observe.record_send("read_back.match")  # no SDK yet: counted on the API's proxy, into nothing
reader = InMemoryMetricReader()
metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))  # the application installs its SDK
observe.record_send("read_back.match")
observe.record_send("send.unknown")
points = {}
for rm in reader.get_metrics_data().resource_metrics:
    for sm in rm.scope_metrics:
        for m in sm.metrics:
            for p in m.data.data_points:
                points[m.name + " " + p.attributes["outcome"]] = p.value
print(json.dumps(points, sort_keys=True))
"""


def test_counters_made_before_the_application_installs_its_meter_provider_count_on_it_afterwards():
    """The counters are made once; made on the global proxy before an SDK is installed, they count on the SDK's
    provider from the moment it is set (in a child process: the global provider can be set only once)."""
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", GLOBAL_LATER], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == {"atmostonce.sends read_back.match": 1, "atmostonce.sends send.unknown": 1}


def test_status_counts_the_reconcilers_lookups_not_the_record_an_unknown_send_opens(any_store):
    from tests.helpers import to_state

    s = any_store.store
    it, _ = to_state(s, "indeterminate")  # opens the send's reconciliation record: no lookup yet
    assert observe.figures(s)["reconcile_lookups"] == {}
    s.reconcile_not_found(s.get(it.key).plan)
    s.reconcile_found(s.get(it.key).plan, remote_id="r-1")
    assert observe.figures(s)["reconcile_lookups"] == {"confirmed": 1, "unknown": 1}  # two lookups, two counted
    assert [r.result for r in s.reconciliations(it.key)] == ["unknown", "unknown", "confirmed"]
