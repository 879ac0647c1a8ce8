"""The runtime's loops as a caller sees them: which path a dispatch takes (fused, or step by step), what a
reconciler pass reports and counts (its result, the lookup spans and metrics), what a sweeper pass reads
and returns. On the model (the runtime is the same over every store)."""

from __future__ import annotations

import pytest

from atmostonce import MemoryStore
from atmostonce.errors import AtMostOnceError
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.testing.stateful import FakeClock
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Unknown
from tests import test_observe
from tests.helpers import submit, to_state

_points = test_observe._points
otel = test_observe.otel  # the fixture, shared

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, retry_backoff=0)


class Platform:
    """An in-memory platform: ``answer`` decides each send; read-back returns what was stored."""

    name, protocol_version = "memory-platform", 1

    def __init__(self, answer="sent", lookup=None):
        self.answer, self.objects, self.sends, self.lookups = answer, {}, 0, 0
        self.on_lookup = lookup
        self.capabilities = Capabilities(read_back=True, lookup_by_key=True, fenced_lookup=False)

    def send(self, wire):
        self.sends += 1
        rid = f"r{self.sends}"
        self.objects[rid] = dict(wire.body)
        return Unknown("read timeout") if self.answer == "unknown" else Sent(rid, response_digest="d")

    def read_back(self, remote_id):
        body = self.objects.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        self.lookups += 1
        if self.on_lookup is not None:
            self.on_lookup(self.lookups, delivery_key)
        return NotFound()

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


class LookupFailed(AtMostOnceError):
    """The platform lookup itself failed (no evidence either way)."""


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def store(clock):
    return MemoryStore(clock=clock)


def _lookup_points(reader):
    return {attrs: v for (name, attrs), v in _points(reader).items() if name == "atmostonce.reconcile.lookups"}


# ---------------------------------------------------------------- Dispatcher: which path
def test_a_stale_snapshot_of_an_intent_sent_again_since_is_caught_after_the_authorization(store, clock):
    """The default dispatcher (no work, no crash hook) takes the fused path, which compares the request it
    read with the one it authorized: a snapshot taken before a resend (new resend epoch) sends nothing."""
    store.set_text_window(1, operator="ops")  # the resend's text slot is free again a second later
    snapshot = submit(store)
    assert Dispatcher(store, Platform(answer="unknown"), CONFIG).dispatch(snapshot.key) == "send.unknown"
    store.park(snapshot.key, operator="alice")
    again = store.resend(snapshot.key, operator="alice")
    clock.advance(5)
    assert again.resend_epoch != snapshot.resend_epoch
    platform = Platform()
    assert Dispatcher(store, platform, CONFIG).dispatch(snapshot) == "send.not_sent"
    assert platform.sends == 0
    assert store.get(snapshot.key).state == "failed"


def test_on_the_fused_path_a_crash_hook_sees_only_the_points_around_the_send(store):
    it = submit(store)
    seen: list[str] = []
    platform = Platform()
    assert Dispatcher(store, platform, CONFIG, crash=seen.append, fused=True).dispatch(it.key) == "read_back.match"
    assert seen == ["after_authorize", "after_send"]
    assert platform.sends == 1


# ---------------------------------------------------------------- Reconciler: result, spans, metrics
def test_a_lookup_span_names_the_intent_the_transport_and_the_outcome(store, otel):
    _, spans = otel
    it, _ = to_state(store, "indeterminate")
    assert Reconciler(store, Platform(), CONFIG).run() == {"lookup.not_found": 1}
    (span,) = [s for s in spans.get_finished_spans() if s.name == "atmostonce.lookup"]
    attrs = dict(span.attributes)
    assert attrs == {
        "atmostonce.key": it.key,
        "atmostonce.transport": "memory-platform",
        "atmostonce.outcome": "lookup.not_found",
    }


def test_every_failed_lookup_is_counted_and_the_rest_of_the_batch_is_still_looked_up(store, otel):
    reader, _ = otel
    for i in range(3):
        to_state(store, "indeterminate", text=f"m{i}", target=f"room-{i}")

    def fail_twice(n, key):
        if n <= 2:
            raise LookupFailed(f"lookup {n} failed")

    platform = Platform(lookup=fail_twice)
    assert Reconciler(store, platform, CONFIG).run() == {"lookup.error": 2, "lookup.not_found": 1}
    assert platform.lookups == 3
    assert _lookup_points(reader) == {(("outcome", "lookup.error"),): 2, (("outcome", "lookup.not_found"),): 1}


def test_a_lookup_whose_record_is_refused_is_reported_skipped_and_not_counted_as_a_lookup(store, otel):
    reader, _ = otel
    it, _ = to_state(store, "indeterminate")

    def someone_parks_it(n, key):  # the intent moves on while the platform answers: the plan is stale
        store.park(key, operator="alice")

    assert Reconciler(store, Platform(lookup=someone_parks_it), CONFIG).run() == {"skipped": 1}
    assert store.get(it.key).state == "parked"
    assert _lookup_points(reader) == {}


# ---------------------------------------------------------------- Sweeper
class WithoutApprovals:
    """A store without the approval feature (no due_approvals / expire_approval), as docs/conformance.md allows."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name in ("due_approvals", "expire_approval"):
            raise AttributeError(name)
        return getattr(self._store, name)


def test_a_store_without_approvals_has_none_to_expire(store):
    sweeper = Sweeper(WithoutApprovals(store), CONFIG)
    assert sweeper.expire_approvals() == {"approvals_expired": 0}
    assert sweeper.tick() == {
        "expired": 0,
        "abandoned": 0,
        "skipped": 0,
        "retried": 0,
        "exhausted": 0,
        "waiting": 0,
        "approvals_expired": 0,
    }


def test_a_retry_pass_reads_at_most_its_limit_of_failed_intents_exhausted_ones_included(store, clock):
    spent, _ = to_state(store, "failed", text="spent", target="room-1", max_attempts=1)
    clock.advance(1)
    fresh, _ = to_state(store, "failed", text="fresh", target="room-2", max_attempts=3)
    assert [i.key for i in store.list_intents(state="failed")] == [spent.key, fresh.key]
    assert Sweeper(store, CONFIG).retry_failed(limit=1) == {"retried": 0, "exhausted": 1, "waiting": 0, "skipped": 0}
    assert store.get(spent.key).state == "parked"
    assert store.get(fresh.key).state == "failed"  # left for the next pass


def test_a_retry_pass_stops_at_its_limit_across_every_state_the_tables_retry_leaves(clock):
    """A table whose retry also leaves ``pending`` (the static checks accept it: the edge stays inside the
    initial state): the budget is spent over both states, not per state."""
    import tomllib

    from atmostonce.checks import check_table
    from atmostonce.table import parse_table, spec_dir

    raw = tomllib.loads((spec_dir() / "table.toml").read_text(encoding="utf-8"))
    for e in raw["events"]:
        if e["name"] == "retry":
            e["from"] = ["failed", "pending"]
    table = parse_table(raw)
    assert check_table(table) == {}
    store = MemoryStore(clock=clock, table=table)
    failed, _ = to_state(store, "failed", text="a", target="room-1")
    clock.advance(1)
    waiting = submit(store, text="b", target="room-2")
    assert Sweeper(store, CONFIG).retry_failed(limit=1) == {"retried": 1, "exhausted": 0, "waiting": 0, "skipped": 0}
    assert [h.event for h in store.history(failed.key)].count("retry") == 1
    assert "retry" not in [h.event for h in store.history(waiting.key)]
