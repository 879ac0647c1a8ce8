"""The local platform sink: API, idempotency, every fault kind, lookup switch, dry run, CLI."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from http_helpers import wire

from atmostonce.transport import Found, NotFound, NotSent, Sent, Unknown, Unsupported, WireRequest
from atmostonce_http import HttpTransport, PlatformSink, sink_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def client(sink):
    with httpx.Client(base_url=sink.url, timeout=5) as c:
        yield c


@pytest.fixture
def t(sink):
    with HttpTransport(sink_config(sink.url, connect_timeout=2, write_timeout=2, read_timeout=2)) as tr:
        yield tr


def post(client, body, key=None):
    return client.post("/posts", json=body, headers={"Idempotency-Key": key} if key else {})


# ---------------------------------------------------------------- the API


def test_create_read_lookup_delete(sink, client):
    r = post(client, {"text": "hi"}, "k1")
    assert r.status_code == 201
    obj = r.json()
    assert obj["body"] == {"text": "hi"} and obj["id"]
    assert r.headers["location"] == f"/posts/{obj['id']}"
    assert client.get(f"/posts/{obj['id']}").json() == {
        "id": obj["id"],
        "body": {"text": "hi"},
        "idempotency_key": "k1",
    }
    assert client.get("/posts", params={"key": "k1"}).json()["id"] == obj["id"]
    assert client.get("/posts", params={"key": "nope"}).status_code == 404
    assert client.get("/posts/nope").status_code == 404
    assert client.get("/posts").status_code == 400
    assert client.delete(f"/posts/{obj['id']}").status_code == 204
    assert client.get(f"/posts/{obj['id']}").status_code == 404
    assert client.delete(f"/posts/{obj['id']}").status_code == 404
    assert sink.creates == 1 and sink.objects == {}


def test_bad_bodies_are_refused_and_write_nothing(sink, client):
    assert client.post("/posts", content=b"not json", headers={"Content-Type": "application/json"}).status_code == 400
    assert client.post("/posts", json=[1, 2]).status_code == 400
    assert client.post("/elsewhere", json={}).status_code == 404
    assert sink.creates == 0


def test_same_idempotency_key_creates_once(sink, client):
    first = post(client, {"text": "a"}, "same")
    second = post(client, {"text": "a"}, "same")
    assert (first.status_code, second.status_code) == (201, 200)
    assert first.json()["id"] == second.json()["id"]
    assert sink.creates == 1 and sink.requests == 2
    assert sink.creates_by_key == {"same": 1}


def test_without_a_key_every_post_creates(sink, client):
    post(client, {"text": "a"})
    post(client, {"text": "a"})
    assert sink.creates == 2 and len(sink.objects) == 2


def test_creates_by_key_counts_per_delivery_key_to_expose_duplicates(sink, client):
    post(client, {"delivery_key": "dk", "text": "a"}, "dk")
    post(client, {"delivery_key": "dk", "text": "a"}, "dk.r1")  # a second object for one delivery
    post(client, {"text": "b"}, "other")
    assert sink.creates_by_key == {"dk": 2, "other": 1}


def test_transport_round_trip(sink, t):
    request = wire()
    sent = t.send(request)
    assert isinstance(sent, Sent)
    assert t.send(request) == sent  # same idempotency key: the same object, nothing new
    found = t.read_back(sent.remote_id)
    assert isinstance(found, Found) and t.matches(request, found)
    assert t.lookup(request.delivery_key) == Found(sent.remote_id, dict(request.body))
    assert isinstance(t.lookup("never-sent"), NotFound)
    assert sink.creates == 1 and sink.requests == 2


def test_resend_epoch_is_a_new_idempotency_key(sink, t):
    first = t.send(wire(epoch=0))
    again = t.send(wire(epoch=1))
    assert isinstance(first, Sent) and isinstance(again, Sent) and first.remote_id != again.remote_id
    assert sink.objects[again.remote_id]["idempotency_key"] == "dk-1.r1"
    assert t.lookup("dk-1", resend_epoch=1) == Found(again.remote_id, dict(wire().body))
    assert sink.creates_by_key == {"dk-1": 2}


def test_key_field_is_embedded_and_ignored_by_the_read_back_compare(sink):
    with HttpTransport(sink_config(sink.url, key_field="/meta/idempotency_key")) as tr:
        request = wire(epoch=2)
        sent = tr.send(request)
        assert isinstance(sent, Sent)
        assert sink.objects[sent.remote_id]["body"]["meta"] == {"idempotency_key": "dk-1.r2"}
        found = tr.read_back(sent.remote_id)
        assert tr.matches(request, found)
        assert tr.matches(request, Found(sent.remote_id, {**request.body}))  # key field absent: still equal
        other_key = {**request.body, "meta": {"idempotency_key": "something-else"}}
        assert tr.matches(request, Found(sent.remote_id, other_key))
        # a field the platform holds beyond the request (here where the key would sit) is not compared
        assert tr.matches(request, Found(sent.remote_id, {**request.body, "meta": "not an object"}))
        assert not tr.matches(request, Found(sent.remote_id, {**request.body, "text": "edited"}))
        assert not tr.matches(request, Found(sent.remote_id, None))


# ---------------------------------------------------------------- faults, one per kind


@pytest.mark.parametrize(
    ("fault", "expected", "row", "creates"),
    [
        ("none", Sent, None, 1),
        ("delay", Sent, None, 1),
        ("error_before_write", Unknown, "status:500-599", 0),
        ("error_after_write", Unknown, "status:500-599", 1),
        ("drop_before_write", Unknown, "error:remote_protocol", 0),
        ("drop_after_write", Unknown, "error:remote_protocol", 1),
        ("reset", Unknown, "error:read_error", 0),
        ("read_lag", Sent, None, 1),
    ],
)
def test_each_fault(sink, t, fault, expected, row, creates):
    sink.plan(fault)
    result = t.send(wire())
    assert isinstance(result, expected)
    if row is not None:
        assert result.reason.startswith(row + ":")
    assert sink.requests == 1
    assert sink.creates == creates
    assert sink.faults_applied == ({} if fault == "none" else {fault: 1})
    lookup = t.lookup("dk-1")
    if creates and fault != "read_lag":
        assert isinstance(lookup, Found)  # the platform holds it even when the answer was lost
        assert t.matches(wire(), t.read_back(lookup.remote_id))
    elif not creates:
        assert isinstance(lookup, NotFound)


def test_delay_longer_than_read_timeout_is_unknown_but_lands(sink):
    sink.plan("delay", seconds=1.0)
    with HttpTransport(sink_config(sink.url, read_timeout=0.2)) as tr, HttpTransport(sink_config(sink.url)) as patient:
        result = tr.send(wire())
        assert isinstance(result, Unknown) and result.reason.startswith("error:read_timeout:")
        assert sink.wait_for_creates(1, timeout=5)
        assert isinstance(patient.lookup("dk-1"), Found)  # the lookup is answered at once: a patient client


def test_read_lag_hides_a_new_object_for_a_while(sink, t):
    sink.plan("read_lag", seconds=60)  # long enough that "not visible yet" cannot race the clock
    hidden = t.send(wire(key="hidden"))
    assert isinstance(hidden, Sent)
    assert isinstance(t.read_back(hidden.remote_id), NotFound)
    assert isinstance(t.lookup("hidden"), NotFound)
    assert hidden.remote_id in sink.objects  # it exists; it is only not visible yet

    sink.plan("read_lag", seconds=0.2)
    lagging = t.send(wire(key="lagging"))
    assert isinstance(lagging, Sent)
    deadline = time.monotonic() + 5
    while isinstance(t.read_back(lagging.remote_id), NotFound) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert isinstance(t.read_back(lagging.remote_id), Found)  # eventually consistent
    assert isinstance(t.lookup("lagging"), Found)
    assert isinstance(t.lookup("hidden"), NotFound)


def test_planned_faults_are_fifo_then_normal(sink, client):
    sink.plan("error_before_write")
    sink.plan("error_after_write")
    statuses = [post(client, {"n": i}, f"k{i}").status_code for i in range(3)]
    assert statuses == [503, 500, 201]
    assert sink.creates == 2


def test_plan_and_mix_refuse_unknown_faults(sink):
    with pytest.raises(ValueError):
        sink.plan("explode")
    with pytest.raises(ValueError):
        sink.plan("delay", seconds=-1)
    with pytest.raises(ValueError):
        sink.set_fault_mix({"explode": 0.1})
    with pytest.raises(ValueError):
        sink.set_fault_mix({"reset": 0.6, "drop_after_write": 0.6})
    with pytest.raises(ValueError):
        sink.set_fault_mix({"reset": -0.1})


def statuses_under_mix(seed: int, n: int = 30) -> list[int]:
    with PlatformSink() as s, httpx.Client(base_url=s.url, timeout=5) as c:
        s.set_fault_mix({"error_before_write": 0.3, "error_after_write": 0.3}, seed=seed)
        out = [post(c, {"n": i}, f"k{i}").status_code for i in range(n)]
        assert s.creates == out.count(201) + out.count(500)
        assert s.faults_applied == {
            k: v for k, v in {"error_before_write": out.count(503), "error_after_write": out.count(500)}.items() if v
        }
        return out


def test_fault_mix_is_reproducible_by_seed():
    a, b = statuses_under_mix(7), statuses_under_mix(7)
    assert a == b
    assert {503, 500, 201} <= set(a)


def test_fault_mix_ratio_one_faults_every_request_and_plan_comes_first(sink, client):
    sink.set_fault_mix({"drop_before_write": 1.0}, seed=1)
    sink.plan("none")
    assert post(client, {"n": 0}, "k0").status_code == 201
    for i in range(1, 4):
        with pytest.raises(httpx.RemoteProtocolError):
            post(client, {"n": i}, f"k{i}")
    assert sink.creates == 1 and sink.requests == 4
    sink.clear_faults()
    assert post(client, {"n": 9}, "k9").status_code == 201


# ---------------------------------------------------------------- switches


def test_lookup_switch(sink, t):
    sent = t.send(wire())
    sink.lookup_enabled = False
    assert isinstance(t.lookup("dk-1"), Unsupported)
    assert httpx.get(f"{sink.url}/posts", params={"key": "dk-1"}).status_code == 501
    assert isinstance(t.read_back(sent.remote_id), Found)  # read by id still works
    sink.lookup_enabled = True
    assert t.lookup("dk-1") == Found(sent.remote_id, dict(wire().body))


def test_lookup_off_from_the_constructor():
    with PlatformSink(lookup=False) as s, HttpTransport(sink_config(s.url)) as tr:
        assert isinstance(tr.lookup("anything"), Unsupported)


def test_dry_run_writes_nothing_at_all(sink, client, t):
    sink.dry_run = True
    sink.plan("drop_after_write")
    for i in range(5):
        assert post(client, {"n": i}, f"k{i}").status_code == 403
    result = t.send(wire())
    assert isinstance(result, NotSent) and result.reason.startswith("status:400-499:")
    assert sink.requests == 6
    assert sink.creates == 0 and sink.objects == {} and sink.creates_by_key == {}
    assert sink.faults_applied == {}
    sink.dry_run = False  # the planned fault was not used up by refused requests
    assert isinstance(t.send(wire()), Unknown)
    assert sink.creates == 1


def test_dry_run_from_the_constructor():
    with PlatformSink(dry_run=True) as s, httpx.Client(base_url=s.url) as c:
        assert all(post(c, {"n": i}).status_code == 403 for i in range(3))
        assert s.creates == 0 and s.objects == {}


# ---------------------------------------------------------------- concurrency and lifecycle


def test_counters_are_thread_safe(sink):
    def worker(w: int) -> None:
        with httpx.Client(base_url=sink.url, timeout=10) as c:
            for i in range(20):
                assert post(c, {"w": w, "i": i}, f"w{w}-{i}").status_code == 201
                assert post(c, {"shared": True}, "shared").status_code in (200, 201)

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sink.requests == 8 * 20 * 2
    assert sink.creates == 8 * 20 + 1
    assert len(sink.objects) == 8 * 20 + 1
    assert sink.creates_by_key["shared"] == 1


def test_lifecycle():
    s = PlatformSink()
    with pytest.raises(RuntimeError):
        _ = s.url
    s.start()
    with pytest.raises(RuntimeError):
        s.start()
    assert s.url.startswith("http://127.0.0.1:")
    s.stop()
    s.stop()


def test_standalone_cli():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "reference"), str(REPO / "adapters")])}
    proc = subprocess.Popen(
        [sys.executable, "-m", "atmostonce_http.sink", "--port", "0", "--no-lookup"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("atmostonce sink listening on http://127.0.0.1:")
        url = line.rsplit(" ", 1)[1].strip()
        with httpx.Client(base_url=url, timeout=5) as c:
            assert post(c, {"text": "hi"}, "k").status_code == 201
            assert c.get("/posts", params={"key": "k"}).status_code == 501
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    assert "RuntimeWarning" not in proc.stderr.read()


# ---------------------------------------------------------------- dedupe off, fenced lookup


def test_without_dedupe_every_resend_is_a_visible_duplicate():
    with PlatformSink(dedupe=False) as s, httpx.Client(base_url=s.url, timeout=5) as c:
        for _ in range(2):
            post(c, {"text": "x", "delivery_key": "k1"}, key="k1")
        assert s.creates == 2
        assert s.creates_by_key == {"k1": 2}


def test_fenced_lookup_tombstones_the_key_for_every_later_create():
    with PlatformSink(fenced_lookup=True, delay_seconds=2.0) as s:
        s.plan("delay")
        cfg = sink_config(s.url, read_timeout=0.2, lookup_fenced=True)
        # only the first send is meant to time out; everything after it is answered at once (a patient client)
        with HttpTransport(cfg) as short, HttpTransport(sink_config(s.url, lookup_fenced=True)) as tr:
            res = short.send(wire({"text": "late"}, "k-late"))
            assert isinstance(res, Unknown)  # the client gave up; the server is still sleeping
            assert isinstance(tr.lookup("k-late"), NotFound)  # the fence: absent now, and tombstoned
            assert s.wait_for_tombstone_refusals(1, timeout=10)  # the delayed request reached its write
            assert s.creates == 0, "a request older than the fenced not-found answer still wrote"
            again = tr.send(wire({"text": "late"}, "k-late"))  # the same key after the fence: refused
            assert isinstance(again, Unknown) and s.creates == 0 and s.tombstone_refusals == 2
            fresh = tr.send(WireRequest({"text": "late"}, "k-late", fence_epoch=1))  # the next fence epoch
            assert isinstance(fresh, Sent)
            assert s.objects[fresh.remote_id]["idempotency_key"] == "k-late.f1" and s.creates == 1


def test_fenced_lookup_ignores_read_lag():
    with PlatformSink(fenced_lookup=True, read_lag_seconds=5) as s:
        s.plan("read_lag")
        with HttpTransport(sink_config(s.url, lookup_fenced=True)) as tr:
            sent = tr.send(wire({"text": "x"}, "k-lag"))
            assert isinstance(sent, Sent)
            assert isinstance(tr.read_back(sent.remote_id), NotFound)  # reads by id still lag
            found = tr.lookup("k-lag")
            assert isinstance(found, Found) and found.remote_id == sent.remote_id
