"""HttpPlatformConfig as data, an arbitrary REST API configured without code, read-back and lookup errors."""

from __future__ import annotations

import json

import pytest
from http_helpers import answer, close_after_request, parse_request, wire

from atmostonce.identity import canonical_json
from atmostonce.transport import Capabilities, Found, NotFound, Sent, Transport, Unsupported
from atmostonce_http import HttpPlatformConfig, HttpTransport, HttpTransportError, sink_config


def test_from_mapping_round_trip():
    data = {
        "base_url": "https://api.example.test/v1",
        "create_path": "/things",
        "create_method": "put",
        "id_pointer": "/data/id",
        "read_back_path": "/things/{id}",
        "lookup_path": "/things?ref={key}",
        "may_exist_statuses": [409, 422],
        "headers": {"Authorization": "Bearer x"},
        "lookup_fenced": True,
        "read_timeout": 2.5,
    }
    cfg = HttpPlatformConfig.from_mapping(data)
    assert cfg.create_method == "PUT"
    assert cfg.may_exist_statuses == (409, 422)
    assert cfg.headers == (("Authorization", "Bearer x"),)
    assert HttpPlatformConfig.from_mapping(cfg.as_mapping()) == cfg
    assert cfg.capabilities == Capabilities(read_back=True, lookup_by_key=True, fenced_lookup=True)


def test_capabilities_follow_config():
    bare = HttpPlatformConfig(base_url="http://h")
    assert bare.capabilities == Capabilities(read_back=False, lookup_by_key=False)
    sink = sink_config("http://127.0.0.1:1")
    assert sink.capabilities == Capabilities(read_back=True, lookup_by_key=True, retract=True)
    no_retraction = sink_config("http://127.0.0.1:1", delete_path=None, update_path=None)
    assert no_retraction.capabilities.retract is False
    assert sink_config("http://127.0.0.1:1", update_path=None).capabilities.retract is True
    with pytest.raises(ValueError, match="delete_path must contain"):
        sink_config("http://127.0.0.1:1", delete_path="/posts")
    with pytest.raises(ValueError, match="update_method"):
        sink_config("http://127.0.0.1:1", update_method="POST")
    with HttpTransport(sink) as t:
        assert isinstance(t, Transport)
        assert (t.name, t.protocol_version, t.capabilities) == ("http", 1, sink.capabilities)


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"base_url": "http://h", "typo": 1},
        {"base_url": "ftp://h"},
        {"base_url": "http://h", "create_path": "posts"},
        {"base_url": "http://h", "create_method": "GET"},
        {"base_url": "http://h", "id_pointer": None},
        {"base_url": "http://h", "id_pointer": "id"},
        {"base_url": "http://h", "read_back_path": "/posts"},
        {"base_url": "http://h", "lookup_path": "/posts"},
        {"base_url": "http://h", "lookup_fenced": True},
        {"base_url": "http://h", "key_field": ""},
        {"base_url": "http://h", "idempotency_header": "Bad Header"},
        {"base_url": "http://h", "may_exist_statuses": [500]},
        {"base_url": "http://h", "read_timeout": 0},
        {"base_url": "http://h", "connect_timeout": float("inf")},
        {"base_url": "http://h", "write_timeout": "1"},
        {"base_url": "http://h", "headers": {"X": "a\nb"}},
        {"base_url": "http://h", "max_connections": 0},
    ],
)
def test_invalid_config_raises_value_error(data):
    with pytest.raises(ValueError):
        HttpPlatformConfig.from_mapping(data)


def test_arbitrary_api_without_code(transport, raw_server):
    server = raw_server(answer(200, {"data": {"id": "abc"}}))
    t = transport(
        server.url() + "/api/",
        create_method="PUT",
        create_path="/v2/items/{key}",
        id_pointer="/data/id",
        idempotency_header="X-Request-Id",
        key_field="/meta/ref",
        headers=(("Authorization", "Bearer t0k"),),
    )
    request = wire({"text": "héllo", "tags": ["a", "b"]}, key="dk/1", epoch=2)
    result = t.send(request)
    assert isinstance(result, Sent) and result.remote_id == "abc"
    method, target, headers, body = parse_request(server.requests[0])
    assert (method, target) == ("PUT", "/api/v2/items/dk%2F1.r2")
    assert headers["x-request-id"] == "dk/1.r2" == request.idempotency_key
    assert headers["authorization"] == "Bearer t0k"
    assert headers["content-type"] == "application/json"
    assert "idempotency-key" not in headers
    assert body == canonical_json({"text": "héllo", "tags": ["a", "b"], "meta": {"ref": "dk/1.r2"}})
    assert t.matches(request, Found("abc", json.loads(body)))


def test_no_idempotency_header(transport, raw_server):
    server = raw_server(answer(201, {"id": "1"}))
    transport(server.url(), idempotency_header=None).send(wire())
    assert "idempotency-key" not in parse_request(server.requests[0])[2]


def test_request_headers_cannot_override_the_idempotency_key(transport, raw_server):
    from atmostonce.transport import WireRequest

    server = raw_server(answer(201, {"id": "1"}))
    transport(server.url()).send(
        WireRequest(body={}, delivery_key="real", headers={"idempotency-KEY": "forged", "content-type": "text/plain"})
    )
    raw = server.requests[0].lower()
    assert raw.count(b"idempotency-key:") == 1 and b"idempotency-key: real" in raw
    assert raw.count(b"content-type:") == 1 and b"content-type: application/json" in raw


# ---------------------------------------------------------------- read-back and lookup against raw servers


def test_read_back_statuses(transport, raw_server):
    ok = raw_server(answer(200, {"item": {"text": "hi"}}))
    t = transport(ok.url(), read_back_path="/items/{id}", body_pointer="/item")
    assert t.read_back("a b") == Found("a b", {"text": "hi"})
    assert parse_request(ok.requests[0])[1] == "/items/a%20b"
    gone = raw_server(answer(410))
    assert isinstance(transport(gone.url(), read_back_path="/i/{id}").read_back("x"), NotFound)
    broken = raw_server(answer(500))
    with pytest.raises(HttpTransportError) as info:
        transport(broken.url(), read_back_path="/i/{id}").read_back("x")
    assert info.value.status == 500
    not_json = raw_server(answer(200, b"<html>"))
    assert transport(not_json.url(), read_back_path="/i/{id}").read_back("x") == Found("x", None)


def test_read_back_and_lookup_network_failures_raise(transport, raw_server, refused_port):
    t = transport(f"http://127.0.0.1:{refused_port}", read_back_path="/i/{id}", lookup_path="/i?k={key}")
    with pytest.raises(HttpTransportError):
        t.read_back("x")
    with pytest.raises(HttpTransportError):  # never NotFound: that could pass for proven absence
        t.lookup("x")
    dropper = raw_server(close_after_request)
    with pytest.raises(HttpTransportError):
        transport(dropper.url(), lookup_path="/i?k={key}", lookup_fenced=True).lookup("x")


def test_read_back_not_configured_raises(transport):
    with pytest.raises(HttpTransportError):
        transport("http://127.0.0.1:1").read_back("x")


def test_lookup_statuses(transport, raw_server):
    assert isinstance(transport("http://127.0.0.1:1").lookup("k"), Unsupported)
    found = raw_server(answer(200, {"id": "o1", "body": {"a": 1}}))
    t = transport(found.url(), lookup_path="/find?ref={key}", body_pointer="/body")
    assert t.lookup("dk", resend_epoch=3) == Found("o1", {"a": 1})
    assert parse_request(found.requests[0])[1] == "/find?ref=dk.r3"
    missing = raw_server(answer(404))
    assert isinstance(transport(missing.url(), lookup_path="/f?k={key}").lookup("k"), NotFound)
    off = raw_server(answer(501))
    assert isinstance(transport(off.url(), lookup_path="/f?k={key}").lookup("k"), Unsupported)
    for status, body in ((200, {"no": "id"}), (200, b"nope"), (503, None)):
        server = raw_server(answer(status, body))
        with pytest.raises(HttpTransportError):
            transport(server.url(), lookup_path="/f?k={key}").lookup("k")
