"""The asyncio outbox (``atmostonce.open_async``) on SQLite and the local platform sink over
``AsyncHttpTransport``: the front door runs twice without a second send, and cancelling a run while a send is
at the platform records that send unknown (never not sent), which reconciliation then settles without a resend.
The store is the native async one (aiosqlite), the service threaded (docs/design.md#asyncio-the-async-outbox-and-stores)."""

from __future__ import annotations

import asyncio

import pytest

import atmostonce
from atmostonce.runtime import RuntimeConfig
from atmostonce.transport import CANCELLED_SEND
from atmostonce_http import AsyncHttpTransport, sink_config

FAST = RuntimeConfig(lease_seconds=2, send_lease_seconds=5, reconcile_interval=0.2)
QUICK = {"sweep_every": 0.05, "reconcile_every": 0.05, "poll_every": 0.01, "backoff_base": 0.01, "backoff_max": 0.1}


def test_the_async_front_door_publishes_once_and_a_second_run_sends_nothing(tmp_path, sink):
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"

    async def once() -> tuple[str, str, atmostonce.OutboxReport]:
        transport = AsyncHttpTransport(sink_config(sink.url))
        async with atmostonce.open_async(url, transport=transport, config=FAST, **QUICK) as outbox:
            it = await outbox.submit("my-account", "post", "room-42", {"text": "hello async"})
            report = await outbox.run(until_idle=True, timeout=30)
            state = (await outbox.get(it.key)).state
            return it.key, state, report

    key1, kind1, report1 = asyncio.run(once())
    assert kind1 == "published" and report1.idle
    assert report1.dispatched == {"read_back.match": 1}
    key2, kind2, report2 = asyncio.run(once())
    assert key2 == key1 and kind2 == "published" and report2.idle
    assert sum(report2.dispatched.values()) == 0
    assert sink.creates == 1 and sink.requests == 1


def test_cancelling_a_run_during_a_send_records_it_unknown_and_reconciliation_settles_it(tmp_path, sink):
    url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    sink.plan("delay", 2.0)  # the request arrives, the sink sits on it, then writes the object anyway

    async def cancel_mid_send() -> str:
        async with atmostonce.open_async(
            url, transport=AsyncHttpTransport(sink_config(sink.url, read_timeout=30)), config=FAST, **QUICK
        ) as outbox:
            it = await outbox.submit("my-account", "post", "room-7", {"text": "cancel me"})
            run = asyncio.create_task(outbox.run(until_idle=True, timeout=30))
            while sink.requests < 1:  # the bytes are at the platform
                await asyncio.sleep(0.01)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
            after = await outbox.get(it.key)
            t = outbox.store.table
            assert after.state == "indeterminate"  # never retryable (not sent)
            # the send's outcome is recorded unknown with the cancellation as its reason (a reconciler pass may
            # already have looked and found nothing yet: the sink is still sitting on the request)
            history = await outbox.async_store.history(it.key)
            unknown = [h for h in history if h.event == t.outcomes["send.unknown"].event]
            assert len(unknown) == 1
            assert str(unknown[0].detail["reason"]).startswith(CANCELLED_SEND)
            assert after.attempt_count == 1
            return it.key

    key = asyncio.run(cancel_mid_send())
    assert sink.requests == 1
    assert sink.wait_for_creates(1, 10)  # the platform acted on the bytes after all

    async def settle() -> str:
        async with atmostonce.open_async(
            url, transport=AsyncHttpTransport(sink_config(sink.url)), config=FAST, **QUICK
        ) as outbox:
            report = await outbox.run(until_idle=True, timeout=30)
            assert report.idle
            return (await outbox.get(key)).state

    assert asyncio.run(settle()) == "published"  # found by its key, not sent again
    assert sink.creates == 1 and sink.requests == 1
