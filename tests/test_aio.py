"""The asyncio pieces of the core without a network: a send cancelled after authorization is unknown
(``cancelled_send``), the threaded transport bridge maps a cancelled call to that (a send) or to
``TransportCancelled`` (a read-back or lookup), and ``atmostonce.open_async`` runs the memory store to idle."""

from __future__ import annotations

import asyncio
import threading

import pytest

import atmostonce
from atmostonce.aio import ThreadedTransport, TransportCancelled
from atmostonce.runtime import RuntimeConfig
from atmostonce.transport import (
    CANCELLED_SEND,
    AsyncTransport,
    Capabilities,
    Found,
    NotFound,
    Sent,
    Unknown,
    WireRequest,
    cancelled_send,
)

QUICK = {"sweep_every": 0.05, "reconcile_every": 0.05, "poll_every": 0.01, "backoff_base": 0.01, "backoff_max": 0.1}


class AsyncEcho:
    """An async platform in memory: every send creates one object; ``hold`` makes each call wait on an event
    (``entered`` is set on the way in) until it is cancelled or released."""

    name, protocol_version = "async-echo", 1
    capabilities = Capabilities(read_back=True, lookup_by_key=True)

    def __init__(self, hold: bool = False):
        self.hold, self.entered = hold, threading.Event()
        self.objects: dict[str, dict] = {}
        self.by_key: dict[str, str] = {}
        self.sends = 0
        self.closed = False

    async def _maybe_hold(self) -> None:
        self.entered.set()
        if self.hold:
            await asyncio.Event().wait()  # only a cancellation ends it

    async def send(self, request: WireRequest):
        self.sends += 1
        await self._maybe_hold()
        rid = f"obj-{len(self.objects)}"
        self.objects[rid] = dict(request.body)
        self.by_key[request.delivery_key] = rid
        return Sent(rid)

    async def read_back(self, remote_id: str):
        await self._maybe_hold()
        return Found(remote_id, self.objects[remote_id]) if remote_id in self.objects else NotFound()

    async def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0):
        await self._maybe_hold()
        rid = self.by_key.get(delivery_key)
        return NotFound() if rid is None else Found(rid, self.objects[rid])

    def matches(self, request: WireRequest, found: Found) -> bool:
        return dict(found.body or {}) == dict(request.body)

    async def aclose(self) -> None:
        self.closed = True


def test_a_cancelled_send_is_unknown_with_the_cancel_reason():
    plain, detailed = cancelled_send(), cancelled_send("dk-1")
    assert isinstance(plain, Unknown) and plain.outcome == "send.unknown" and plain.reason == CANCELLED_SEND
    assert detailed.reason == CANCELLED_SEND + " (dk-1)"
    assert "send.unknown" in atmostonce.table().outcomes


def test_the_echo_platform_is_an_async_transport():
    assert isinstance(AsyncEcho(), AsyncTransport)


def _bridge_call(method: str, *args):
    """Call ``method`` of a holding AsyncEcho through the bridge from a worker thread, cancel it once it
    has entered, and return what the thread got (a result, or the exception it raised)."""
    echo = AsyncEcho(hold=True)

    async def go():
        bridge = ThreadedTransport(echo, asyncio.get_running_loop())
        call = asyncio.create_task(asyncio.to_thread(_outcome, getattr(bridge, method), *args))
        assert await asyncio.to_thread(echo.entered.wait, 5)
        assert bridge.cancel_in_flight() == 1
        return await call

    return asyncio.run(go())


def _outcome(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - the test inspects it
        return exc


def test_the_bridge_records_a_cancelled_send_as_unknown():
    got = _bridge_call("send", WireRequest(body={"text": "x"}, delivery_key="dk-9"))
    assert isinstance(got, Unknown) and got.reason == CANCELLED_SEND + " (dk-9)"


@pytest.mark.parametrize(("method", "args"), [("read_back", ("obj-0",)), ("lookup", ("dk-9",))])
def test_a_cancelled_read_back_or_lookup_is_no_evidence(method, args):
    got = _bridge_call(method, *args)
    assert isinstance(got, TransportCancelled) and isinstance(got, atmostonce.AtMostOnceError)


def test_open_async_runs_the_memory_store_to_idle_and_closes_the_transport():
    echo = AsyncEcho()

    async def go():
        async with atmostonce.open_async("memory://", transport=echo, config=RuntimeConfig(), **QUICK) as outbox:
            it = await outbox.submit("acct", "post", "room-1", {"text": "hi"})
            again = await outbox.submit("acct", "post", "room-1", {"text": "hi"})
            report = await outbox.run(until_idle=True, timeout=20)
            return it.key == again.key, report, (await outbox.get(it.key)).state

    same, report, kind = asyncio.run(go())
    assert same and report.idle and kind == "published"
    assert echo.sends == 1 and echo.closed


def test_an_async_outbox_must_be_opened_before_use():
    outbox = atmostonce.open_async("memory://", transport=AsyncEcho())
    with pytest.raises(RuntimeError):
        outbox.store  # noqa: B018 - the property raises
