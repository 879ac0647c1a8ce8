"""Work that only waits at the head of a queue does not hold back the work behind it (docs/design.md#the-runtime).

The workers read the pending queue, and the reconciler the unknown sends, a page at a time and in turn
(``runtime.RoundRobin`` over ``claimable(limit, after=key)`` and ``list_intents(state, limit, after=key)``):
each page continues after the last intent of the one before, and the reading starts again from the oldest
when a page comes back short. A paused account's intents, drafts awaiting approval, or unknown sends whose
lookups keep failing therefore cannot fill every page and leave a newer intent unoffered for good.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from atmostonce.runtime import Dispatcher, Reconciler, RoundRobin, RuntimeConfig
from atmostonce.service import Outbox
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Unknown
from tests.helpers import submit


class Platform:
    """Takes every send (or answers unknown for the texts in ``unknown``); lookups by key find what was taken,
    except for the keys in ``failing``, whose lookup raises an exception no transport table lists."""

    name, protocol_version = "fair-platform", 1

    def __init__(self, unknown=(), failing=()):
        self.unknown, self.failing = set(unknown), set(failing)
        self.objects, self.by_key, self.lookups = {}, {}, []
        self.capabilities = Capabilities(read_back=True, lookup_by_key=True, fenced_lookup=False)

    def send(self, wire):
        rid = f"r{len(self.objects) + 1}"
        self.objects[rid] = dict(wire.body)
        self.by_key[wire.delivery_key] = rid
        return Unknown("read timeout") if wire.body.get("text") in self.unknown else Sent(rid)

    def read_back(self, remote_id):
        body = self.objects.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        self.lookups.append(delivery_key)
        if delivery_key in self.failing:
            raise ConnectionResetError("the platform hung up")
        rid = self.by_key.get(delivery_key)
        return NotFound() if rid is None else Found(rid, self.objects[rid])

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


@pytest.fixture(params=["memory", "sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store(request):
    if request.param == "memory":
        from atmostonce import MemoryStore

        return MemoryStore()
    return request.getfixturevalue("sqlite_store" if request.param == "sqlite" else "pg_store")


def test_pages_after_a_key_continue_in_creation_order_and_none_follow_an_unknown_key(store):
    for i in range(5):
        submit(store, text=f"t{i}", target=f"room-{i}")
    order = store.claimable(10)  # creation time, then key (intents made in the same clock tick sort by key)
    assert sorted(order) == sorted(it.key for it in store.list_intents(state="pending"))
    assert [it.key for it in store.list_intents(state="pending")] == order
    assert store.claimable(2) == order[:2]
    assert store.claimable(2, after=order[1]) == order[2:4]
    assert store.claimable(10, after=order[3]) == order[4:]
    assert store.claimable(10, after=order[4]) == []
    assert [it.key for it in store.list_intents(state="pending", limit=2, after=order[2])] == order[3:5]
    assert store.claimable(10, after="no-such-intent") == []
    assert store.list_intents(limit=10, after="no-such-intent") == []


class Queue:
    """A queue of keys read a page at a time (``page(limit, after)``), counting the reads."""

    def __init__(self, items):
        self.items, self.reads = list(items), 0

    def page(self, n, after):
        self.reads += 1
        start = 0 if after is None else self.items.index(after) + 1
        return self.items[start : start + n]


def test_a_round_robin_offers_every_item_once_per_round_and_starts_again():
    q = Queue(f"k{i}" for i in range(5))
    rr = RoundRobin(q.page, lambda k: k)
    assert [rr(2), rr(2), rr(2), rr(2)] == [["k0", "k1"], ["k2", "k3"], ["k4"], ["k0", "k1"]]
    assert q.reads == 4  # a short page ends the round: the next call starts from the oldest without a wasted read


def test_a_round_robin_that_reads_past_the_end_starts_again_in_the_same_call():
    q = Queue(f"k{i}" for i in range(4))
    rr = RoundRobin(q.page, lambda k: k)
    assert [rr(2), rr(2), rr(2)] == [["k0", "k1"], ["k2", "k3"], ["k0", "k1"]]
    assert q.reads == 4  # the empty page after k3, then the first page again
    empty = RoundRobin(Queue([]).page, lambda k: k)
    assert [empty(2), empty(2)] == [[], []]


def test_a_paused_account_at_the_head_of_the_queue_does_not_hold_back_another_accounts_intent(store):
    for i in range(40):
        submit(store, text=f"paused {i}", account="paused", target=f"room-{i}")
    store.set_kill_switch("account:paused", True, operator="ops")
    other = submit(store, text="behind them", account="other")
    platform = Platform()
    with Outbox(store, platform, workers=2, poll_batch=8, poll_every=0.01) as outbox:
        report = outbox.run(until_idle=True, timeout=60)
    assert report.idle
    assert store.get(other.key).state == "published"
    assert report.waited["gate.paused"] >= 40  # each paused intent was offered, and waited
    assert store.count_by_state()["pending"] == 40
    assert list(platform.by_key) == [other.key]


def _unknown_sends(store, platform, n, prefix):
    keys = []
    for i in range(n):
        it = submit(store, text=f"{prefix} {i}", target=f"{prefix}-{i}")
        platform.unknown.add(f"{prefix} {i}")
        assert Dispatcher(store, platform, RuntimeConfig()).dispatch(it.key) == "send.unknown"
        keys.append(it.key)
    return keys


def test_the_reconciler_looks_only_at_unknown_sends(store):
    platform = Platform()
    [unknown] = _unknown_sends(store, platform, 1, "unknown")
    published = submit(store, text="published", target="room-p")
    assert Dispatcher(store, platform, RuntimeConfig()).dispatch(published.key) == "read_back.match"
    pending = submit(store, text="pending", target="room-q")
    assert Reconciler(store, platform, RuntimeConfig(reconcile_interval=0)).run() == {"lookup.found": 1}
    assert platform.lookups == [unknown]
    assert store.get(pending.key).state == "pending"


def test_unknown_sends_whose_lookups_keep_failing_do_not_hold_back_a_newer_one(store):
    platform = Platform()
    stuck = _unknown_sends(store, platform, 6, "stuck")
    platform.failing = set(stuck)
    [newer] = _unknown_sends(store, platform, 1, "newer")
    config = RuntimeConfig(reconcile_interval=0, reconcile_batch=4, lookup_error_backoff=0)
    reconciler = Reconciler(store, platform, config)
    first, second = reconciler.run(), reconciler.run()
    assert first == {"lookup.error": 4}
    assert second == {"lookup.error": 2, "lookup.found": 1}
    assert store.get(newer).state == "published"
    assert {k: store.get(k).state for k in stuck} == dict.fromkeys(stuck, "indeterminate")  # nothing written
    assert set(reconciler.lookup_errors) == set(stuck)
    assert reconciler.lookup_errors[stuck[0]][2] == "ConnectionResetError: the platform hung up"


def test_a_failing_lookup_is_logged_with_its_intent_and_its_error(store, caplog):
    platform = Platform()
    [key] = _unknown_sends(store, platform, 1, "logged")
    platform.failing = {key}
    with caplog.at_level("WARNING", logger="atmostonce.runtime"):
        Reconciler(store, platform, RuntimeConfig(reconcile_interval=0)).run()
    [record] = [r for r in caplog.records if r.name == "atmostonce.runtime"]
    intent, failures, kind, error = record.args
    assert (intent, failures, kind, type(error)) == (key, 1, "ConnectionResetError", ConnectionResetError)


def test_a_failing_lookup_is_asked_again_only_after_a_doubling_backoff(set_clock_store):
    store, set_clock = set_clock_store
    set_clock(1000.0)
    platform = Platform()
    [key] = _unknown_sends(store, platform, 1, "failing")
    platform.failing = {key}
    config = RuntimeConfig(reconcile_interval=0, lookup_error_backoff=10, lookup_error_backoff_max=25)
    reconciler = Reconciler(store, platform, config)
    asked = []
    for t in (1000.0, 1009.0, 1010.0, 1029.0, 1030.0, 1054.0, 1055.0):
        set_clock(t)
        if reconciler.run().get("lookup.error"):
            asked.append(t)
    # the first failure waits 10 s, the second 20 s, the third 40 s capped at 25: never asked on every pass
    assert asked == [1000.0, 1010.0, 1030.0, 1055.0]
    assert reconciler.lookup_errors[key][0] == 4
    platform.failing = set()
    set_clock(1080.0)
    assert reconciler.run() == {"lookup.found": 1}
    assert key not in reconciler.lookup_errors and store.get(key).state == "published"


class Cancelling(Platform):
    """The first send raises a BaseException that is not an Exception (an async SDK's cancellation)."""

    def __init__(self):
        super().__init__()
        self.cancelled = False

    def send(self, wire):
        if not self.cancelled:
            self.cancelled = True
            raise KeyboardInterrupt
        return super().send(wire)


def test_a_transport_raising_a_base_exception_does_not_kill_the_worker(store):
    keys = [submit(store, text=f"w{i}", target=f"room-{i}").key for i in range(4)]
    platform = Cancelling()
    seen = []
    config = RuntimeConfig(send_lease_seconds=60)
    with Outbox(
        store, platform, workers=1, poll_every=0.01, config=config, on_result=lambda k, r: seen.append((k, r))
    ) as outbox:
        report = outbox.run(until_idle=False, timeout=3)
    assert report.dispatched["error:KeyboardInterrupt"] == 1
    [(cancelled, _)] = [(k, r) for k, r in seen if isinstance(r, KeyboardInterrupt)]
    assert store.get(cancelled).state == "authorized"  # reported with the intent whose send it cut short
    states = sorted(store.get(k).state for k in keys)
    assert states == ["authorized", "published", "published", "published"]  # the cancelled send waits for its lease
    assert len(platform.objects) == 3


class CancelledLookup(Platform):
    """The first lookup raises asyncio's CancelledError (a BaseException, not an Exception); later ones answer."""

    def __init__(self):
        super().__init__()
        self.cancels = 1

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        if self.cancels:
            self.cancels -= 1
            raise asyncio.CancelledError
        return super().lookup(delivery_key, resend_epoch, fence_epoch)


def test_a_lookup_raising_a_base_exception_does_not_end_the_background_maintenance(store):
    # the outbox's maintenance thread (start()) reports the cancelled pass and goes on: the unknown send it was
    # looking at is settled by a later pass instead of staying unknown with no reconciler left running
    platform = CancelledLookup()
    [key] = _unknown_sends(store, platform, 1, "cancelled")
    config = RuntimeConfig(reconcile_interval=0)
    with Outbox(store, platform, config=config, sweep_every=0.05, reconcile_every=0.05, backoff_max=0.1) as outbox:
        outbox.start()
        for _ in range(500):
            if store.get(key).state == "published":
                break
            threading.Event().wait(0.02)
        report = outbox.stop()
    assert report.errors["reconcile"] == 1
    assert store.get(key).state == "published"
