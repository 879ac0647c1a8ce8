"""A fence is a tombstone (docs/design.md, "A fence is a tombstone"), end to end on the real databases.

The demo's platform (the local sink without dedupe, its lookup fenced) behind a real TCP relay on
loopback that holds the first create's bytes for a few seconds after the client's write completed.
The client's read times out (``indeterminate``), the fenced lookup answers "absent" (``failed``), the
sweeper retries and the dispatcher publishes; then the held original reaches the platform. It must be
refused by the tombstone its key carries, and the retry, sent under the next fence epoch, must be
the one object for the delivery key.
"""

from __future__ import annotations

from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce_http import HttpTransport, PlatformSink, sink_config
from atmostonce_matrix.proxy import FaultProxy

HOLD_SECONDS = 3.0  # how long the relay holds the first create (the client's read timeout is 0.8 s)
CONFIG = RuntimeConfig(reconcile_interval=0.0, retry_backoff=0)  # a proven absence is retried on the next pass


def test_a_create_held_in_the_network_past_a_fenced_absence_is_refused_and_the_retry_is_the_one_object(sql_store):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "held in the network"}, max_attempts=2)
    with (
        PlatformSink(dedupe=False, fenced_lookup=True) as sink,
        FaultProxy("127.0.0.1", sink.port, io_timeout=10.0) as relay,
    ):
        relay.plan("delay", match="POST ", seconds=HOLD_SECONDS)  # the first create only
        cfg = sink_config(
            relay.url,
            key_field="/delivery_key",
            lookup_fenced=True,
            connect_timeout=2.0,
            write_timeout=2.0,
            read_timeout=0.8,
        )
        with HttpTransport(cfg) as transport:
            dispatcher = Dispatcher(store, transport, CONFIG)
            assert dispatcher.dispatch(it.key) == "send.unknown"  # the read timed out: bytes are out
            assert sink.requests == 0  # still held by the relay
            assert Reconciler(store, transport, CONFIG).run() == {"lookup.not_found_fenced": 1}
            failed = store.get(it.key)
            assert (failed.state, failed.fence_epoch) == ("failed", 1)
            assert Sweeper(store, CONFIG).tick()["retried"] == 1
            assert dispatcher.dispatch(it.key) == "read_back.match"  # the retry, under the next fence epoch
            assert sink.requests == 1  # the original is still in the network
            # the original arrives now, after the fence: the tombstone on its key refuses it
            assert sink.wait_for_tombstone_refusals(1, timeout=HOLD_SECONDS + 10), "the late original was not refused"
            assert relay.wait_idle(timeout=10)

    done = store.get(it.key)
    objects = sink.objects
    assert len(objects) == 1, f"two objects for one delivery key: {objects}"
    (obj,) = objects.values()
    assert (done.state, done.key, done.remote_id) == ("published", it.key, obj["id"])
    assert obj["idempotency_key"] == f"{it.key}.f1"
    assert sink.creates_by_key == {it.key: 1}
    assert (sink.requests, sink.tombstone_refusals) == (2, 1)
    assert [a.idempotency_key for a in store.attempts(it.key)] == [it.key, f"{it.key}.f1"]
