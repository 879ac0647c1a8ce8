"""Every proxy fault, through the runtime, on SQLite and PostgreSQL: the room ends with exactly one
event per published intent and none for an intent that ended failed; an unknown outcome ends
indeterminate and is reconciled by evidence only (docs/matrix.md)."""

from __future__ import annotations

import uuid

import pytest

from atmostonce.runtime import Dispatcher, Reconciler, Sweeper
from atmostonce_matrix import MatrixTransport
from tests.matrix.conftest import CONFIG, DELAY, assert_at_most_once, settle

TEXT = {"msgtype": "m.text"}


def last_reason(db, key) -> str:
    return [h.detail.get("reason", "") for h in db.store.history(key) if "reason" in h.detail][-1]


def submit(db, room_id, text):
    return db.store.submit("acct", "post", room_id, {**TEXT, "body": text})


FAULTS = {
    # proxy mode: (first dispatch outcome, final state, events in the room for the intent)
    "pass": ("read_back.match", "published", 1),
    "drop_before_forward": ("send.unknown", "parked", 0),  # never reached Synapse; not found is no proof
    "drop_after_forward": ("send.unknown", "published", 1),  # posted, answer lost: found
    "delay": ("send.unknown", "published", 1),  # lands after the client gave up: found later
    "reset": ("send.unknown", "parked", 0),  # incomplete request upstream: nothing posted
    "gateway_error": ("send.unknown", "published", 1),  # posted, then a 502: 5xx is unknown, found
}


@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_proxy_fault_settles_with_one_event_per_published_intent(db, proxy, transport, room, room_view, fault):
    it = submit(db, room, f"fault {fault}")
    proxy.plan(fault, match="PUT ")
    first, final, events = FAULTS[fault]
    assert Dispatcher(db.store, transport, CONFIG).dispatch(it.key) == first
    assert proxy.pending_plans == 0
    if first == "send.unknown":
        assert db.store.get(it.key).state == "indeterminate"
        assert db.store.get(it.key).remote_id is None
    assert proxy.wait_idle(DELAY + 10)  # a delayed request has landed (or been dropped) before we look
    settle(db, transport)
    got = db.store.get(it.key)
    assert got.state == final
    assert len(room_view.by_key().get(it.key, [])) == events
    assert_at_most_once(db, room_view, [it.key])
    puts = [r for r in proxy.records if r.request_line.startswith("PUT ")]
    assert len(puts) == 1, "an unknown outcome was resent"
    if final == "published" and first == "send.unknown":  # settled by evidence: the lookup found the event
        assert [(r.result, r.remote_id) for r in db.store.reconciliations(it.key)] == [
            ("unknown", None),  # opened by record_unknown
            ("confirmed", got.remote_id),
        ]


def test_a_not_found_history_lookup_is_not_fenced(db, proxy, transport, room, room_view):
    """The delayed send is still in the proxy when the reconciler looks: nothing is found, and the
    intent stays indeterminate (never failed, never resent). Then the event lands and is found."""
    assert transport.capabilities.fenced_lookup is False
    it = submit(db, room, "held in the proxy")
    proxy.plan("delay", match="PUT ", seconds=120)  # held until released below
    assert Dispatcher(db.store, transport, CONFIG).dispatch(it.key) == "send.unknown"
    reconciler = Reconciler(db.store, transport, CONFIG)
    assert reconciler.run() == {"lookup.not_found": 1}
    assert db.store.get(it.key).state == "indeterminate"  # not failed: a not-found proves nothing
    assert db.store.claimable() == []
    proxy.release()
    assert proxy.wait_idle(30)
    assert [r.upstream_status for r in proxy.records if r.mode == "delay"] == [200]  # it did land, later
    assert reconciler.run() == {"lookup.found": 1}
    final = db.store.get(it.key)
    assert final.state == "published"
    assert room_view.by_key() == {it.key: [final.remote_id]}


def test_a_batch_with_every_fault_and_concurrent_workers(db, proxy, transport, room, room_view):
    """Twelve intents, four worker threads sharing one transport, a fault on half of the sends."""
    import threading

    from atmostonce.runtime import Worker

    keys = [submit(db, room, f"batch {i}").key for i in range(12)]
    for mode in ("drop_before_forward", "drop_after_forward", "delay", "reset", "gateway_error", "drop_after_forward"):
        proxy.plan(mode, match="PUT ")
    stop = threading.Event()
    dispatcher = Dispatcher(db.store, transport, CONFIG)
    workers = [Worker(dispatcher, lambda: db.store.claimable(4), stop=stop, seed=i) for i in range(4)]
    for w in workers:
        w.start()
    try:
        for _ in range(600):  # at most 30 s; normally a few seconds
            if not db.store.claimable() and proxy.pending_plans == 0:
                break
            stop.wait(0.05)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=10)
    assert proxy.pending_plans == 0
    assert proxy.wait_idle(DELAY + 10)
    settle(db, transport)
    finals = assert_at_most_once(db, room_view, keys)
    # the four faults that reach Synapse are found; the two that never do end parked, with no event
    assert sorted(finals.values()).count("published") == 10
    assert sorted(finals.values()).count("parked") == 2
    assert len(room_view.events()) == 10


def test_rate_limited_send_is_not_sent_then_retried_under_the_same_txnid(
    db, synapse, admin, user, proxy, transport, room, room_view
):
    """A real 429 M_LIMIT_EXCEEDED: not sent, failed, no event; the retry (same txnId) posts it once.

    Synapse's limiter leaks at the override's rate (at least 1 message/s): twenty quick messages
    to another room under a burst of 100 fill the user's bucket, and a burst of 1 then refuses
    every message for about twenty seconds."""
    import httpx

    elsewhere = synapse.create_room(user.access_token, name="burst")
    limited = submit(db, room, "rate limited")
    synapse.override_ratelimit(admin.access_token, user.user_id, messages_per_second=1, burst_count=100)
    with httpx.Client(base_url=synapse.url, trust_env=False) as c:
        for i in range(20):
            r = c.put(
                f"/_matrix/client/v3/rooms/{elsewhere}/send/m.room.message/fill{i}",
                json={**TEXT, "body": "fill the bucket"},
                headers={"Authorization": f"Bearer {user.access_token}"},
            )
            assert r.status_code == 200, r.text
    synapse.override_ratelimit(admin.access_token, user.user_id, messages_per_second=1, burst_count=1)
    assert Dispatcher(db.store, transport, CONFIG).dispatch(limited.key) == "send.not_sent"
    assert db.store.get(limited.key).state == "failed"
    reason = last_reason(db, limited.key)
    assert "errcode:M_LIMIT_EXCEEDED" in reason and "HTTP 429" in reason and "retry_after_ms=" in reason
    # the pause Synapse asked for is kept with the not-sent (whole seconds), and the retry waits for it
    (row,) = [h for h in db.store.history(limited.key) if h.event == "record_not_sent"]
    assert isinstance(row.detail["retry_after"], int) and row.detail["retry_after"] >= 1
    assert Sweeper(db.store, CONFIG).retry_failed()["waiting"] == 1
    assert room_view.events() == []
    assert_at_most_once(db, room_view, [limited.key])
    synapse.override_ratelimit(admin.access_token, user.user_id, messages_per_second=0, burst_count=0)
    settle(db, transport)
    assert db.store.get(limited.key).state == "published"
    status = transport.resend_status(limited.key)
    assert status.first_sent_at is not None and status.may_send  # the retry reused the journalled txnId
    assert_at_most_once(db, room_view, [limited.key])
    assert len(room_view.events()) == 1


def test_forbidden_send_is_not_sent_and_ends_failed_with_no_event(db, synapse, proxy, room, room_view, tmp_path):
    """A user who is not in the room: 403 M_FORBIDDEN, not sent, failed; retries end parked, no event."""
    from atmostonce_matrix import MatrixConfig

    outsider = synapse.register_user(f"outsider-{uuid.uuid4().hex[:8]}", "outsider-password")
    cfg = MatrixConfig(
        homeserver_url=proxy.url,
        room_id=room,
        user=outsider.localpart,
        password=outsider.password,
        state_path=str(tmp_path / "outsider.json"),
    )
    with MatrixTransport(cfg) as t:
        it = submit(db, room, "from outside")
        assert Dispatcher(db.store, t, CONFIG).dispatch(it.key) == "send.not_sent"
        assert db.store.get(it.key).state == "failed"
        assert "errcode:M_FORBIDDEN" in last_reason(db, it.key)
        assert_at_most_once(db, room_view, [it.key])
        settle(db, t)
        assert db.store.get(it.key).state == "parked"  # three refusals, then the attempt cap
    assert room_view.events() == []


def test_connect_refused_is_not_sent(db, proxy, transport, room, room_view):
    it = submit(db, room, "nobody listens")
    proxy.close()  # the transport is logged in; now nothing accepts connections on that port
    assert Dispatcher(db.store, transport, CONFIG).dispatch(it.key) == "send.not_sent"
    assert "error:connect_refused" in last_reason(db, it.key)
    assert db.store.get(it.key).state == "failed"
    assert room_view.events() == []
