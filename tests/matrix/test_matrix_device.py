"""The persisted device, the resend window, and what the transport's lookup can and cannot say (docs/matrix.md)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from atmostonce.runtime import Dispatcher, Reconciler, Sweeper
from atmostonce.transport import Found, NotFound, NotSent, Sent, WireRequest
from atmostonce_matrix import KEY_FIELD, MatrixConfig, MatrixTransport, MatrixTransportError
from tests.matrix.conftest import CONFIG, READ_TIMEOUT, assert_at_most_once, settle
from tests.matrix.publisher_process import CRASH_EXIT

ROOT = Path(__file__).resolve().parents[2]


def text(body: str) -> dict:
    return {"msgtype": "m.text", "body": body}


def submit(db, room_id, body):
    return db.store.submit("acct", "post", room_id, text(body))


def last_reason(db, key) -> str:
    return [h.detail.get("reason", "") for h in db.store.history(key) if "reason" in h.detail][-1]


def puts(proxy) -> int:
    return sum(1 for r in proxy.records if r.request_line.startswith("PUT "))


# ---------------------------------------------------------------- restart of the publisher process
def _publisher(db, config: dict, keys: list[str], die_after_send: int = 0) -> tuple[int, list[dict]]:
    cmd = [
        sys.executable, "-m", "tests.matrix.publisher_process",
        "--database-url", db.url, "--config", json.dumps(config),
        "--keys", ",".join(keys), "--die-after-send", str(die_after_send),
    ]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=120)
    lines = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert lines, f"the publisher printed nothing; stderr:\n{proc.stderr[-3000:]}"
    return proc.returncode, lines


def test_a_publisher_restart_mid_run_logs_in_as_the_same_device_and_posts_no_duplicate(
    db, synapse, user, proxy, room, room_view, tmp_path
):
    config = {
        "homeserver_url": proxy.url,
        "room_id": room,
        "user": user.localpart,
        "password": user.password,
        "state_path": str(tmp_path / "publisher.json"),
        "read_timeout": READ_TIMEOUT,
    }
    keys = [submit(db, room, f"restart {i}").key for i in range(6)]
    proxy.plan("pass", match="PUT ")
    proxy.plan("drop_after_forward", match="PUT ")  # the second send lands, its answer is lost

    # process 1 dispatches keys[0..3] and dies hard right after the fourth send left
    code, out1 = _publisher(db, config, keys, die_after_send=4)
    assert code == CRASH_EXIT
    device, token1 = out1[0]["device_id"], out1[0]["token"]
    states = [db.store.get(k).state for k in keys]
    assert states == ["published", "indeterminate", "published", "authorized", "pending", "pending"]
    landed = room_view.by_key()
    assert len(landed[keys[1]]) == 1 and len(landed[keys[3]]) == 1

    # an operator wrongly decides the lost answer means "not sent": the retry re-sends the same txnId
    db.store.park(keys[1], operator="alice", reason="answer lost, looks unsent")
    db.store.resolve_not_sent(keys[1], operator="alice")
    assert Sweeper(db.store, CONFIG).retry_failed()["retried"] == 1

    # process 2: a new login with the persisted device; Synapse answers the resend with the old event
    code, out2 = _publisher(db, config, keys)
    assert code == 0
    assert out2[0]["device_id"] == device
    assert out2[0]["token"] != token1  # a new login, a new access token, the same device
    outcomes = {line["key"]: line["outcome"] for line in out2 if "key" in line}
    assert outcomes == {keys[1]: "read_back.match", keys[4]: "read_back.match", keys[5]: "read_back.match"}
    assert db.store.get(keys[1]).remote_id == landed[keys[1]][0]

    # the send that process 1 died after: its lease expires, the lookup finds the event
    db.advance(60)
    assert Sweeper(db.store, CONFIG).sweep_leases()["expired"] == 1
    with MatrixTransport(MatrixConfig.from_mapping(config)) as t:
        assert t.device_id == device
        assert Reconciler(db.store, t, CONFIG).run() == {"lookup.found": 1}
    finals = assert_at_most_once(db, room_view, keys)
    assert set(finals.values()) == {"published"}
    assert len(room_view.events()) == 6
    assert puts(proxy) == 7  # six first sends and the one same-txnId resend, deduplicated by Synapse

    r = httpx.get(
        f"{synapse.url}/_matrix/client/v3/devices",
        headers={"Authorization": f"Bearer {user.access_token}"},
        trust_env=False,
    )
    publisher_devices = [d["device_id"] for d in r.json()["devices"] if d.get("display_name") == "atmostonce publisher"]
    assert publisher_devices == [device]  # three logins, one device


def test_txnid_dedupe_is_per_device_which_is_why_the_device_is_persisted(make_transport, room_view):
    w = WireRequest(body=text("once per device"), delivery_key="k-device")
    first = make_transport("a")
    sent = first.send(w)
    assert isinstance(sent, Sent)
    device, token = first.device_id, first.token_fingerprint
    first.close()
    again = make_transport("a")  # a restart: same state file, new login
    assert (again.device_id, again.token_fingerprint != token) == (device, True)
    resent = again.send(w)
    assert isinstance(resent, Sent) and resent.remote_id == sent.remote_id
    other = make_transport("b")  # a lost state file: a new device
    assert other.device_id != device
    dup = other.send(w)
    assert isinstance(dup, Sent) and dup.remote_id != sent.remote_id
    assert len(room_view.by_key()["k-device"]) == 2  # what losing the state file costs


def test_the_state_file_serves_one_transport_at_a_time(make_transport):
    make_transport("solo")
    with pytest.raises(MatrixTransportError, match="in use"):
        make_transport("solo")


# ---------------------------------------------------------------- the declared resend window
@pytest.mark.parametrize("age", [60, 3601], ids=["inside", "outside"])
def test_a_resend_outside_the_declared_window_is_refused(db, proxy, make_transport, room, room_view, age):
    now = [1_800_000_000.0]
    t = make_transport(clock=lambda: now[0], resend_window_seconds=3600)
    assert t.capabilities.idempotent_resend is True and t.capabilities.resend_window_seconds == 3600
    it = submit(db, room, f"window {age}")
    proxy.plan("drop_after_forward", match="PUT ")
    assert Dispatcher(db.store, t, CONFIG).dispatch(it.key) == "send.unknown"
    landed = room_view.by_key()[it.key]
    assert len(landed) == 1
    # the operator wrongly resolves it as not sent; the retry would re-send the same txnId
    db.store.park(it.key, operator="alice")
    db.store.resolve_not_sent(it.key, operator="alice")
    Sweeper(db.store, CONFIG).retry_failed()
    now[0] += age
    before = puts(proxy)
    outcome = Dispatcher(db.store, t, CONFIG).dispatch(it.key)
    if age < 3600:  # inside: Synapse still knows the txnId and answers with the existing event
        assert outcome == "read_back.match"
        assert db.store.get(it.key).remote_id == landed[0]
        assert puts(proxy) == before + 1
        assert_at_most_once(db, room_view, [it.key])
        return
    assert outcome == "send.not_sent"
    assert last_reason(db, it.key).startswith("local:outside_resend_window")
    assert puts(proxy) == before  # refused before any byte
    status = t.resend_status(it.key)
    assert (status.may_send, status.within_window, status.age_seconds) == (False, False, 3601)
    settle(db, t)  # retries are refused the same way until the attempt cap parks it
    assert db.store.get(it.key).state == "parked"
    assert puts(proxy) == before
    assert room_view.by_key() == {it.key: landed}  # still the one event the operator misjudged, no second
    # the deliberate way out is an operator resend: a new epoch, a new txnId, a fresh window
    fresh = t.resend_status(it.key, resend_epoch=1)
    assert fresh.txn_id == it.key + ".r1" and fresh.first_sent_at is None and fresh.may_send


def test_the_first_send_journal_survives_a_restart_and_a_torn_last_line(make_transport, tmp_path):
    now = [1_800_000_000.0]
    t = make_transport("journal", clock=lambda: now[0], resend_window_seconds=3600)
    w = WireRequest(body=text("journalled"), delivery_key="k-journal")
    assert isinstance(t.send(w), Sent)
    t.close()
    with open(tmp_path / "journal.json.txns", "a") as f:
        f.write('{"txn": "k-torn", "first_se')  # a crash mid-append
    now[0] += 3601
    again = make_transport("journal", clock=lambda: now[0], resend_window_seconds=3600)
    assert again.resend_status("k-journal").first_sent_at == 1_800_000_000.0
    assert again.resend_status("k-torn").first_sent_at is None  # its send never started
    refused = again.send(w)
    assert isinstance(refused, NotSent) and refused.reason.startswith("local:outside_resend_window")
    assert isinstance(again.send(WireRequest(body=text("after the tear"), delivery_key="k-after")), Sent)
    again.close()
    third = make_transport("journal", clock=lambda: now[0], resend_window_seconds=3600)
    assert third.resend_status("k-after").first_sent_at == now[0]  # recorded on a line of its own


def test_a_txnid_first_sent_by_a_lost_device_is_refused(make_transport, tmp_path, room_view):
    """The state file is lost (the journal beside it is not): the new device cannot deduplicate
    the old device's txnIds, so it refuses to send them at all."""
    w = WireRequest(body=text("old device"), delivery_key="k-lost")
    old = make_transport("lost")
    assert isinstance(old.send(w), Sent)
    old_device = old.device_id
    old.close()
    (tmp_path / "lost.json").unlink()
    new = make_transport("lost")
    assert new.device_id != old_device
    refused = new.send(w)
    assert isinstance(refused, NotSent) and refused.reason.startswith("local:sent_by_another_device")
    status = new.resend_status("k-lost")
    assert (status.first_device_id, status.same_device, status.may_send) == (old_device, False, False)
    assert len(room_view.by_key()["k-lost"]) == 1


def test_an_unknown_token_is_not_sent_and_the_next_send_logs_in_again_as_the_same_device(transport, room_view):
    device = transport.device_id
    transport._token = "syt_not_a_token"  # as after a server-side token expiry
    w = WireRequest(body=text("after a token expiry"), delivery_key="k-token")
    refused = transport.send(w)
    assert isinstance(refused, NotSent) and refused.reason.startswith("errcode:M_UNKNOWN_TOKEN: HTTP 401")
    assert room_view.events() == []
    sent = transport.send(w)
    assert isinstance(sent, Sent) and transport.device_id == device
    assert len(room_view.by_key()["k-token"]) == 1


# ---------------------------------------------------------------- read-back and lookup
def test_a_reused_txnid_with_another_body_returns_the_old_event_and_read_back_catches_it(transport, room_view):
    one = WireRequest(body=text("one"), delivery_key="k-reuse")
    two = WireRequest(body=text("two"), delivery_key="k-reuse")
    s1, s2 = transport.send(one), transport.send(two)
    assert isinstance(s1, Sent) and isinstance(s2, Sent) and s2.remote_id == s1.remote_id
    rb = transport.read_back(s2.remote_id)
    assert isinstance(rb, Found)
    assert rb.body == {**text("one"), KEY_FIELD: "k-reuse"}
    assert transport.matches(one, rb) and not transport.matches(two, rb)  # the runtime records read_back.differs
    assert [e["content"]["body"] for e in room_view.events()] == ["one"]


def test_resend_epochs_are_distinct_transactions(transport, room_view):
    base = WireRequest(body=text("epoch"), delivery_key="k-epoch")
    resent = WireRequest(body=text("epoch"), delivery_key="k-epoch", resend_epoch=1)
    s0, s1 = transport.send(base), transport.send(resent)
    assert s0.remote_id != s1.remote_id  # an operator resend is not deduplicated away
    assert transport.lookup("k-epoch", 1) == Found(s1.remote_id, transport.wire_content(resent))
    assert transport.lookup("k-epoch", 0).remote_id == s0.remote_id
    assert sorted(room_view.by_key()) == ["k-epoch", "k-epoch.r1"]


def test_the_lookup_is_bounded_and_reads_only_this_senders_events(synapse, user, make_transport, room):
    t = make_transport(lookup_max_events=3, lookup_page_size=2)
    ids = [t.send(WireRequest(body=text(f"b{i}"), delivery_key=f"k-bound-{i}")).remote_id for i in range(5)]
    assert t.lookup("k-bound-4").remote_id == ids[4]
    assert t.lookup("k-bound-2").remote_id == ids[2]  # the third newest: inside the bound
    beyond = t.lookup("k-bound-1")
    assert isinstance(beyond, NotFound) and "lookup bound" in beyond.reason
    wide = make_transport("wide")  # default bound: the whole (short) history
    assert wide.lookup("k-bound-0").remote_id == ids[0]
    absent = wide.lookup("k-never-sent")
    assert isinstance(absent, NotFound) and "all of them" in absent.reason
    # another member posts an event carrying a delivery key: neither lookup nor read-back accept it
    other = synapse.register_user(f"other-{uuid.uuid4().hex[:8]}", "other-password")
    headers = {"Authorization": f"Bearer {user.access_token}"}
    httpx.post(f"{synapse.url}/_matrix/client/v3/rooms/{room}/invite", json={"user_id": other.user_id}, headers=headers, trust_env=False).raise_for_status()  # fmt: skip
    synapse.join_room(other.access_token, room)
    r = httpx.put(
        f"{synapse.url}/_matrix/client/v3/rooms/{room}/send/m.room.message/spoof",
        json={**text("spoof"), KEY_FIELD: "k-spoofed"},
        headers={"Authorization": f"Bearer {other.access_token}"},
        trust_env=False,
    )
    spoof_id = r.json()["event_id"]
    assert isinstance(wide.lookup("k-spoofed"), NotFound)
    rb = wide.read_back(spoof_id)
    assert rb == Found(spoof_id, None)
    assert not wide.matches(WireRequest(body=text("spoof"), delivery_key="k-spoofed"), rb)


def test_read_back_of_an_unknown_event_is_not_found(transport):
    assert isinstance(transport.read_back("$nonexistent"), NotFound)


def test_a_lookup_that_fails_raises_instead_of_claiming_absence(transport, proxy):
    proxy.close()
    with pytest.raises(MatrixTransportError):
        transport.lookup("k-anything")
    with pytest.raises(MatrixTransportError):
        transport.read_back("$anything")
