"""Every row of spec/http_outcomes.toml against a real socket, and the retries-off proof.

Each test names the row it exercises; ``reason`` starts with the row that decided.
"""

from __future__ import annotations

import threading

import pytest
from http_helpers import (
    SHORT,
    answer,
    close_after_request,
    hang_after_request,
    never_read,
    reset_after_request,
    reset_mid_body,
    tls_garbage,
    tls_reset,
    wire,
)

from atmostonce.transport import NotSent, Sent, Unknown, WireRequest


def row(result) -> str:
    return result.reason.split(": ", 1)[0]


# ---------------------------------------------------------------- not_sent: nothing reached the platform


def test_connect_refused_is_not_sent(transport, refused_port):
    result = transport(f"http://127.0.0.1:{refused_port}").send(wire())
    assert isinstance(result, NotSent) and result.outcome == "send.not_sent"
    assert row(result) == "error:connect_refused"


def test_connect_timeout_is_not_sent(transport, full_backlog_port):
    result = transport(f"http://127.0.0.1:{full_backlog_port}", connect_timeout=SHORT).send(wire())
    assert isinstance(result, NotSent)
    assert row(result) == "error:connect_timeout"


def test_dns_failure_is_not_sent(transport):
    result = transport("http://atmostonce-nowhere.invalid").send(wire())
    assert isinstance(result, NotSent)
    assert row(result) == "error:dns_failure"


def test_tls_handshake_failure_is_not_sent(transport, raw_server):
    server = raw_server(tls_garbage)
    result = transport(server.url("https")).send(wire())
    assert isinstance(result, NotSent)
    assert row(result) == "error:tls_handshake"
    assert server.received[0][:1] == b"\x16"  # a TLS handshake record, not an HTTP request
    assert server.requests == []


def test_reset_during_tls_handshake_is_connect_error_not_sent(transport, raw_server):
    server = raw_server(tls_reset)
    result = transport(server.url("https")).send(wire())
    assert isinstance(result, NotSent)
    assert row(result) == "error:connect_error"
    assert server.received[0][:1] == b"\x16"


def test_pool_timeout_is_not_sent(transport, raw_server):
    server = raw_server(hang_after_request)
    t = transport(server.url(), max_connections=1, connect_timeout=SHORT)
    first: list = []
    worker = threading.Thread(target=lambda: first.append(t.send(wire(key="first"))))
    worker.start()
    assert server.wait_requests(1)  # the only connection is now busy
    result = t.send(wire(key="second"))
    assert isinstance(result, NotSent)
    assert row(result) == "error:pool_timeout"
    server.release.set()
    worker.join()
    assert isinstance(first[0], Unknown)
    assert len(server.requests) == 1 and server.connections == 1


@pytest.mark.parametrize(
    "request_",
    [
        wire({"x": float("nan")}),  # no canonical JSON form
        WireRequest(body={"x": 1}, delivery_key="k", headers={"X-Bad": "a\r\nInjected: 1"}),
        WireRequest(body={"x": 1}, delivery_key="k\nnewline"),  # idempotency header value
        WireRequest(body={"x": 1}, delivery_key="k", headers={"Content-Length": "1"}),  # framing is ours
    ],
    ids=["nan-body", "header-injection", "bad-key", "framing-header"],
)
def test_invalid_request_is_not_sent_and_opens_no_connection(transport, raw_server, request_):
    server = raw_server(answer(201, {"id": "x"}))
    result = transport(server.url()).send(request_)
    assert isinstance(result, NotSent)
    assert row(result) == "error:invalid_request"
    assert server.connections == 0


def test_send_on_a_closed_transport_is_not_sent(transport, raw_server):
    server = raw_server(answer(201, {"id": "x"}))
    t = transport(server.url())
    t.close()
    result = t.send(wire())
    assert isinstance(result, NotSent) and row(result) == "error:invalid_request"
    assert server.connections == 0


# ---------------------------------------------------------------- unknown: bytes may have left


def test_write_timeout_mid_body_is_unknown(transport, raw_server):
    server = raw_server(never_read, rcvbuf=4096)
    result = transport(server.url(), write_timeout=SHORT).send(wire({"text": "x" * 16_000_000}))
    assert isinstance(result, Unknown) and result.outcome == "send.unknown"
    assert row(result) == "error:write_timeout"
    assert server.connections == 1


def test_reset_mid_body_is_unknown(transport, raw_server):
    # httpcore swallows the WriteError and tries to read a response, so the row
    # that decides is the read-side one; either way the outcome must be unknown.
    server = raw_server(reset_mid_body, rcvbuf=4096)
    result = transport(server.url(), write_timeout=5).send(wire({"text": "x" * 16_000_000}))
    assert isinstance(result, Unknown)
    assert row(result) in {"error:write_error", "error:read_error", "error:remote_protocol"}


def test_read_timeout_is_unknown(transport, raw_server):
    server = raw_server(hang_after_request)
    result = transport(server.url(), read_timeout=SHORT).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "error:read_timeout"
    assert server.wait_requests(1) and len(server.requests) == 1


def test_close_after_request_is_unknown(transport, raw_server):
    server = raw_server(close_after_request)
    result = transport(server.url()).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "error:remote_protocol"


def test_reset_after_request_is_unknown(transport, raw_server):
    server = raw_server(reset_after_request)
    result = transport(server.url()).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "error:read_error"


def test_garbled_response_is_unknown(transport, raw_server):
    def garbage(server, conn):
        server.read_request(conn)
        conn.sendall(b"this is not HTTP\r\n\r\n")

    server = raw_server(garbage)
    result = transport(server.url()).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "error:remote_protocol"


def test_undecodable_2xx_body_is_other_unknown(transport, raw_server):
    server = raw_server(answer(201, b"not gzip at all", {"Content-Encoding": "gzip"}))
    result = transport(server.url()).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "error:other"


# ---------------------------------------------------------------- statuses


@pytest.mark.parametrize(
    ("status", "expected", "row_name"),
    [
        (500, Unknown, "status:500-599"),
        (502, Unknown, "status:500-599"),
        (503, Unknown, "status:500-599"),
        (409, Unknown, "status:may_exist"),
        (400, NotSent, "status:400-499"),
        (403, NotSent, "status:400-499"),
        (422, NotSent, "status:400-499"),
        (429, NotSent, "status:429"),
        (303, Unknown, "status:300-399"),
        (600, Unknown, "default"),
    ],
)
def test_status_rows(transport, raw_server, status, expected, row_name):
    server = raw_server(answer(status, {"id": "ignored"}, {"Location": "/elsewhere"}))
    result = transport(server.url()).send(wire())
    assert isinstance(result, expected)
    assert row(result) == row_name
    assert len(server.requests) == 1 and server.connections == 1  # a 3xx is not followed either


def test_may_exist_statuses_come_from_config(transport, raw_server):
    server = raw_server(answer(422, {"error": "duplicate"}))
    result = transport(server.url(), may_exist_statuses=(409, 422)).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "status:may_exist"
    server409 = raw_server(answer(409, {"error": "conflict"}))
    result = transport(server409.url(), may_exist_statuses=()).send(wire())
    assert isinstance(result, NotSent)


def test_2xx_with_id_is_success(transport, raw_server):
    server = raw_server(answer(201, {"id": "abc"}))
    result = transport(server.url()).send(wire())
    assert isinstance(result, Sent) and result.outcome == "send.success"
    assert result.remote_id == "abc"
    assert result.response_digest is not None and len(result.response_digest) == 64


def test_2xx_with_integer_id_is_success(transport, raw_server):
    server = raw_server(answer(200, {"data": {"id": 42}}))
    result = transport(server.url(), id_pointer="/data/id").send(wire())
    assert result == Sent("42", result.response_digest)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"id": ""},
        {"id": "  "},
        {"id": None},
        {"id": True},
        {"id": ["a"]},
        b"not json",
        b"",
        {"id": "x" * 4097},
        b'{"id": "a\\ud800b"}',
    ],
    ids=["no-id", "empty", "blank", "null", "bool", "list", "not-json", "no-body", "too-long", "lone-surrogate"],
)
def test_2xx_without_usable_id_is_unknown(transport, raw_server, body):
    server = raw_server(answer(201, body))
    result = transport(server.url()).send(wire())
    assert isinstance(result, Unknown)
    assert row(result) == "status:200-299:without_id"


def test_a_created_id_the_store_cannot_keep_leaves_the_send_unknown_not_lost(transport, raw_server, sqlite_store):
    # the platform created the object but answered an id over the store's 4,096-character limit: taken as the
    # send's id, the store's refusal of it after the send would lose the record of a send that happened
    from atmostonce.runtime import Dispatcher

    server = raw_server(answer(201, {"id": "x" * 5000}))
    it = sqlite_store.submit("acct", "post", "room-1", {"text": "hello"})
    assert Dispatcher(sqlite_store, transport(server.url())).dispatch(it.key) == "send.unknown"
    after = sqlite_store.get(it.key)
    assert (after.state, after.remote_id) == ("indeterminate", None)
    assert [h.event for h in sqlite_store.history(it.key)][-1] == "record_unknown"


def test_2xx_id_from_location(transport, raw_server):
    server = raw_server(answer(201, b"", {"Location": "http://elsewhere/things/ab%20c/"}))
    result = transport(server.url(), id_from_location=True).send(wire())
    assert isinstance(result, Sent) and result.remote_id == "ab c"
    server = raw_server(answer(201, {"id": "in-body-but-not-configured"}))
    result = transport(server.url(), id_from_location=True).send(wire())
    assert isinstance(result, Unknown) and row(result) == "status:200-299:without_id"


# ---------------------------------------------------------------- retries off


@pytest.mark.parametrize("method", ["POST", "PUT"])
@pytest.mark.parametrize("behaviour", [close_after_request, reset_after_request], ids=["close", "reset"])
def test_one_send_puts_exactly_one_request_on_the_wire(transport, raw_server, method, behaviour):
    server = raw_server(behaviour)
    t = transport(server.url(), create_method=method, create_path="/items/{key}")
    result = t.send(wire(key="dk-retry"))
    assert isinstance(result, Unknown)
    assert len(server.requests) == 1
    assert server.connections == 1
    assert server.requests[0].startswith(f"{method} /items/dk-retry HTTP/1.1".encode())


def test_one_send_one_request_even_for_5xx(transport, raw_server):
    server = raw_server(answer(503, {"error": "busy"}, {"Retry-After": "0"}))
    result = transport(server.url(), create_method="PUT").send(wire())
    assert isinstance(result, Unknown)
    assert len(server.requests) == 1 and server.connections == 1
