"""The asyncio HTTP transport on real sockets: the sync transport's classification (one outcome table, one reading
of the answer), one connection and one request per send counted at the server, and a send task cancelled after
its bytes left is never "not sent"."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from http_helpers import (
    PATIENT,
    SHORT,
    answer,
    close_after_request,
    hang_after_request,
    reset_after_request,
    wire,
)

from atmostonce.transport import AsyncTransport, Found, NotFound, NotSent, Sent, Unknown, cancelled_send
from atmostonce_http import AsyncHttpTransport, HttpPlatformConfig, HttpTransport, sink_config


def row(result) -> str:
    """The table row that decided (a Sent carries none: its remote id stands for it)."""
    return result.remote_id if isinstance(result, Sent) else result.reason.split(": ", 1)[0]


def config(base_url: str, **fields) -> HttpPlatformConfig:
    return HttpPlatformConfig(base_url=base_url, **{"create_path": "/items", **PATIENT, **fields})


def send_async(cfg: HttpPlatformConfig, request=None):
    async def go():
        async with AsyncHttpTransport(cfg) as t:
            return await t.send(request if request is not None else wire())

    return asyncio.run(go())


def test_the_async_transport_is_an_async_transport():
    t = AsyncHttpTransport(config("http://127.0.0.1:9"))
    try:
        assert isinstance(t, AsyncTransport)
        assert (t.name, t.protocol_version) == (HttpTransport.name, HttpTransport.protocol_version)
    finally:
        asyncio.run(t.aclose())


BEHAVIOURS: list[tuple[str, Callable]] = [
    ("201-with-id", answer(201, {"id": "obj-1"})),
    ("201-without-id", answer(201, {"nothing": True})),
    ("409-may-exist", answer(409, {"error": "exists"})),
    ("422-rejected", answer(422, {"error": "bad"})),
    ("503", answer(503, {"error": "busy"}, {"Retry-After": "0"})),
    ("close-after-request", close_after_request),
    ("reset-after-request", reset_after_request),
    ("no-answer", hang_after_request),
]


@pytest.mark.parametrize("behaviour", [b for _, b in BEHAVIOURS], ids=[n for n, _ in BEHAVIOURS])
def test_each_answer_is_classified_by_the_same_row_as_the_sync_transport(raw_server, behaviour):
    sync_server, async_server = raw_server(behaviour), raw_server(behaviour)
    waits = {"read_timeout": SHORT} if behaviour is hang_after_request else {}  # only the silent server times out
    with HttpTransport(config(sync_server.url(), **waits)) as t:
        expected = t.send(wire())
    got = send_async(config(async_server.url(), **waits))
    assert type(got) is type(expected) and row(got) == row(expected)
    assert got.outcome == expected.outcome
    # no automatic retry: one connection, one request, counted at the server
    assert async_server.connections == 1 and len(async_server.requests) == 1


def test_connect_refused_is_not_sent(refused_port):
    result = send_async(config(f"http://127.0.0.1:{refused_port}"))
    assert isinstance(result, NotSent) and row(result) == "error:connect_refused"


def test_an_invalid_request_is_not_sent_and_opens_no_connection(raw_server):
    server = raw_server(answer(201, {"id": "x"}))
    result = send_async(config(server.url()), wire({"x": float("nan")}))
    assert isinstance(result, NotSent) and row(result) == "error:invalid_request"
    assert server.connections == 0


def test_a_created_object_carries_the_remote_id_and_the_idempotency_key(raw_server):
    server = raw_server(answer(201, {"id": "obj-7"}))
    result = send_async(config(server.url()), wire(key="dk-async"))
    assert isinstance(result, Sent) and result.remote_id == "obj-7"
    assert b"\r\nIdempotency-Key: dk-async\r\n" in server.requests[0]


def test_a_send_task_cancelled_after_its_bytes_left_is_never_not_sent(raw_server):
    server = raw_server(hang_after_request)

    async def go():
        async with AsyncHttpTransport(config(server.url(), read_timeout=30)) as t:
            task = asyncio.create_task(t.send(wire()))
            assert await asyncio.to_thread(server.wait_requests, 1)  # the request is at the server
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task  # no result at all: nothing can say "not sent"
            assert task.cancelled()

    asyncio.run(go())
    assert server.connections == 1 and len(server.requests) == 1
    recorded = cancelled_send("dk-1")  # what the lease holder records for it
    assert isinstance(recorded, Unknown) and recorded.outcome == "send.unknown"


def test_read_back_and_lookup_against_the_sink(sink):
    async def go():
        async with AsyncHttpTransport(sink_config(sink.url)) as t:
            request = wire({"text": "hello async"}, key="dk-rb")
            sent = await t.send(request)
            assert isinstance(sent, Sent)
            await asyncio.sleep(0.35)  # the sink's read lag
            found = await t.read_back(sent.remote_id)
            assert isinstance(found, Found) and t.matches(request, found)
            by_key = await t.lookup("dk-rb")
            assert isinstance(by_key, Found) and by_key.remote_id == sent.remote_id
            assert isinstance(await t.read_back("no-such-object"), NotFound)

    asyncio.run(go())
    assert sink.creates == 1
