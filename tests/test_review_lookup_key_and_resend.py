"""Adversarial review of four recent changes (git log 0997c65..9c3c4df):

1. the HTTP lookup answers only for the key it asked for (``_HttpCore._answer_for``, docs/design.md#a-lookup-must-answer-for-its-key);
2. a person's resend / resolve --not-sent looks the intent up first (``look_before_sending_again``, CLI, console);
3. CLI ``reconcile`` exits 3 and names what it parked;
4. the default retry backoff, and its exemption for an intent a person left ``failed``.

Real sockets (raw servers, the local sink, json-server), real SQL stores; nothing in httpx is mocked."""

from __future__ import annotations

import asyncio
import http.server
import json
import socket
from dataclasses import dataclass, field
from typing import Any

import pytest

from atmostonce.errors import FoundOnPlatform, IllegalMove
from atmostonce.identity import platform_idempotency_key
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper, look_before_sending_again, wire_request
from atmostonce.transport import Capabilities, Found, NotFound, Unsupported
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_STORE
from atmostonce_http import (
    AsyncHttpTransport,
    HttpPlatformConfig,
    HttpTransport,
    HttpTransportError,
    PlatformSink,
    sink_config,
)
from tests.helpers import answer_json, begin_authorize, http_platform, run_cli, to_state
from tests.http.http_helpers import RawServer, answer
from tests.http.jsonserver import JsonServer, profile

PATIENT = {"connect_timeout": 5.0, "write_timeout": 5.0, "read_timeout": 5.0}
NOW = RuntimeConfig(reconcile_interval=0, lookup_error_backoff=0, retry_backoff=0)


# ---------------------------------------------------------------- helpers


@pytest.fixture
def raw():
    servers: list[RawServer] = []

    def make(behaviour) -> RawServer:
        s = RawServer(behaviour)
        servers.append(s)
        return s

    yield make
    for s in servers:
        s.close()


def _cfg(url: str, **fields) -> HttpPlatformConfig:
    return HttpPlatformConfig(
        base_url=url, **{"create_path": "/items", "lookup_path": "/find?ref={key}", **PATIENT, **fields}
    )


def _lookup(raw, body: Any, key: str = "dk", resend_epoch: int = 0, fence_epoch: int = 0, **fields):
    """One synchronous lookup against a raw socket that answers 200 with ``body`` (JSON)."""
    server = raw(answer(200, json.dumps(body).encode()))
    with HttpTransport(_cfg(server.url(), **fields)) as t:
        return t.lookup(key, resend_epoch, fence_epoch)


def _alookup(raw, body: Any, key: str = "dk", **fields):
    server = raw(answer(200, json.dumps(body).encode()))

    async def go():
        async with AsyncHttpTransport(_cfg(server.url(), **fields)) as t:
            return await t.lookup(key)

    return asyncio.run(go())


def _parked_twice_with_epochs(store, text: str):
    """An intent sent under its bare key (unknown, parked), resent by a person under ``.r1`` (unknown, parked)."""
    it, _ = to_state(store, "parked", text=text)
    store.resend(it.key, operator="alice")
    lease = begin_authorize(store, it.key)
    store.record_unknown(lease, reason="read timeout")
    store.park(it.key, operator="alice")
    return store.get(it.key)


@dataclass
class ScriptedLookup:
    """A transport whose lookups answer from ``found`` (platform key -> remote id) and are recorded."""

    found: dict[str, str] = field(default_factory=dict)
    capabilities: Capabilities = field(default_factory=lambda: Capabilities(lookup_by_key=True))
    asked: list[str] = field(default_factory=list)
    raises: Exception | None = None
    during: Any = None  # called inside the lookup (a race)
    name: str = "scripted"
    protocol_version: int = 1

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0):
        k = platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)
        self.asked.append(k)
        if self.during is not None:
            during, self.during = self.during, None
            during()
        if self.raises is not None:
            raise self.raises
        if not self.capabilities.lookup_by_key:
            return Unsupported("none")
        return Found(self.found[k], None) if k in self.found else NotFound("none")

    def close(self) -> None:
        pass


def _refused_port() -> socket.socket:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    return s  # bound, not listening: a connect is refused


def _write_profile(tmp_path, cfg: dict) -> str:
    p = tmp_path / "platform.json"
    p.write_text(json.dumps(cfg))
    return str(p)


# ================================================================ 1. the lookup answers for its key


@pytest.mark.parametrize(
    "body, fields, expect",
    [
        # a key pointer with RFC 6901 escapes: "/meta/idem~1key" is meta["idem/key"], "~0" is "~"
        (
            [{"id": "o1", "meta": {"idem/key": "other"}}, {"id": "o2", "meta": {"idem/key": "dk"}}],
            {"lookup_key_pointer": "/meta/idem~1key"},
            "o2",
        ),
        ([{"id": "o1", "m~x": "dk"}], {"lookup_key_pointer": "/m~0x"}, "o1"),
        ([{"id": "o1", "m~x": "other"}], {"lookup_key_pointer": "/m~0x"}, "error"),
        # nested key one level deeper than the pointer says: the pointer reads a dict, which is another key
        ({"id": "o1", "k": {"value": "dk"}}, {"key_field": "/k"}, "error"),
        ([{"id": "o1", "k": {"value": "dk"}}], {"key_field": "/k"}, "error"),
        # the key as a number, a list, another case, padded: never taken as ours
        ([{"id": "o1", "k": 7}], {"key_field": "/k"}, "error"),
        ([{"id": "o1", "k": ["dk"]}], {"key_field": "/k"}, "error"),
        ([{"id": "o1", "k": "DK"}], {"key_field": "/k"}, "error"),
        ([{"id": "o1", "k": " dk"}], {"key_field": "/k"}, "error"),
        ({"id": "o1", "k": ""}, {"key_field": "/k"}, "error"),
        ({"id": "o1", "k": True}, {"key_field": "/k"}, "error"),
        # ours, and keyless objects beside it: ours is taken
        ([{"id": "o1"}, {"id": "o2", "k": "dk"}, {"id": "o3", "k": None}], {"key_field": "/k"}, "o2"),
        # several keyless, one null-keyed: cannot be told apart
        ([{"id": "o1", "k": None}, {"id": "o2"}], {"key_field": "/k"}, "error"),
        # an array of non-objects, or a bare JSON string / number: no usable object
        (["dk"], {"key_field": "/k"}, "error"),
        (["dk", "dk"], {"key_field": "/k"}, "error"),
        ("dk", {"key_field": "/k"}, "error"),
        (17, {"key_field": "/k"}, "error"),
        # ours found, but with no usable id (null, missing, boolean, empty): a failed lookup, not Found
        ([{"id": None, "k": "dk"}], {"key_field": "/k"}, "error"),
        ([{"k": "dk"}], {"key_field": "/k"}, "error"),
        ([{"id": True, "k": "dk"}], {"key_field": "/k"}, "error"),
        ([{"id": "", "k": "dk"}], {"key_field": "/k"}, "error"),
        # an integer id is kept as its decimal string
        ([{"id": 42, "k": "dk"}], {"key_field": "/k"}, "42"),
    ],
    ids=[
        "escaped-slash-pointer-finds-ours",
        "escaped-tilde-pointer-finds-ours",
        "escaped-tilde-pointer-other-key",
        "object-key-is-a-nested-object",
        "array-key-is-a-nested-object",
        "key-as-number",
        "key-as-list",
        "key-other-case",
        "key-padded",
        "object-key-empty-string",
        "object-key-boolean",
        "ours-among-keyless-and-null",
        "two-keyless-one-null",
        "array-of-a-string",
        "array-of-strings",
        "bare-string",
        "bare-number",
        "ours-with-null-id",
        "ours-without-id",
        "ours-with-boolean-id",
        "ours-with-empty-id",
        "ours-with-integer-id",
    ],
)
def test_a_lookup_answer_is_found_only_for_an_object_holding_the_key_asked(raw, body, fields, expect):
    if expect == "error":
        with pytest.raises(HttpTransportError) as e:
            _lookup(raw, body, **fields)
        assert e.value.status == 200
    else:
        res = _lookup(raw, body, **fields)
        assert isinstance(res, Found) and res.remote_id == expect


def test_a_lookup_for_a_resend_key_does_not_take_the_first_sends_object_nor_the_reverse(raw):
    key, r1 = "dk", platform_idempotency_key("dk", 1, 0)
    with pytest.raises(HttpTransportError):  # only the bare key's object: not the resend's
        _lookup(raw, [{"id": "o1", "k": key}], key=key, resend_epoch=1, key_field="/k")
    with pytest.raises(HttpTransportError):  # only the resend's object: not the bare key's (a prefix filter)
        _lookup(raw, [{"id": "o2", "k": r1}], key=key, key_field="/k")
    both = [{"id": "o1", "k": key}, {"id": "o2", "k": r1}, {"id": "o3", "k": platform_idempotency_key(key, 1, 1)}]
    assert _lookup(raw, both, key=key, resend_epoch=1, key_field="/k").remote_id == "o2"
    assert _lookup(raw, both, key=key, resend_epoch=1, fence_epoch=1, key_field="/k").remote_id == "o3"
    assert _lookup(raw, both, key=key, key_field="/k").remote_id == "o1"


def test_a_huge_array_finds_ours_at_its_end_and_fails_without_it(raw):
    others = [{"id": f"o{i}", "k": f"other-{i}"} for i in range(20_000)]
    assert _lookup(raw, [*others, {"id": "mine", "k": "dk"}], key_field="/k").remote_id == "mine"
    with pytest.raises(HttpTransportError):
        _lookup(raw, others, key_field="/k")
    keyless = [{"id": f"o{i}"} for i in range(20_000)]
    with pytest.raises(HttpTransportError):
        _lookup(raw, keyless, key_field="/k")


def test_two_objects_holding_our_key_are_found_and_never_read_as_not_found(raw):
    res = _lookup(raw, [{"id": "a", "k": "dk"}, {"id": "b", "k": "dk"}], key_field="/k")
    assert isinstance(res, Found) and res.remote_id in ("a", "b")


@pytest.mark.parametrize(
    "body, expect",
    [
        ({"data": [{"id": "o1", "k": "other"}]}, "error"),
        ({"data": [{"id": "o1", "k": "other"}, {"id": "o2", "k": "dk"}]}, "o2"),
        ({"data": []}, "not_found"),
        ({"data": [{"id": "o1"}]}, "o1"),
        ({"data": [{"id": "o1"}, {"id": "o2"}]}, "error"),
        ({"data": {"id": "o1", "k": "dk"}}, "error"),  # not an array where the collection should be
        ({"other": []}, "error"),
        ([{"id": "o1", "k": "dk"}], "error"),  # unwrapped, where a wrapped collection was configured
    ],
    ids=[
        "other-key",
        "ours-among-others",
        "empty",
        "one-keyless",
        "two-keyless",
        "object-not-array",
        "missing-collection",
        "unwrapped",
    ],
)
def test_a_wrapped_collection_is_read_for_the_key_asked(raw, body, expect):
    fields = {"key_field": "/k", "lookup_collection_pointer": "/data"}
    if expect == "error":
        with pytest.raises(HttpTransportError):
            _lookup(raw, body, **fields)
    elif expect == "not_found":
        assert isinstance(_lookup(raw, body, **fields), NotFound)
    else:
        assert _lookup(raw, body, **fields).remote_id == expect


def test_a_wrapped_collection_at_an_escaped_pointer_with_the_key_nested_in_each_object(raw):
    body = {"a/b": {"items": [{"attrs": {"id": "o1", "ref": "x"}}, {"attrs": {"id": "o2", "ref": "dk"}}]}}
    fields = {
        "lookup_collection_pointer": "/a~1b/items",
        "lookup_key_pointer": "/attrs/ref",
        "lookup_id_pointer": "/attrs/id",
    }
    assert _lookup(raw, body, **fields).remote_id == "o2"
    body["a/b"]["items"].pop()
    with pytest.raises(HttpTransportError):
        _lookup(raw, body, **fields)


@pytest.mark.parametrize(
    "body, expect",
    [
        ([{"id": "o1", "k": "other"}], "error"),
        ([{"id": "o1", "k": "other"}, {"id": "o2", "k": "dk"}], "o2"),
        ({"id": "o1", "k": "other"}, "error"),
        ([{"id": "o1"}, {"id": "o2"}], "error"),
        ([], "not_found"),
        ({"data": [{"id": "o1", "k": "other"}]}, "wrapped-error"),
    ],
    ids=["only-another-key", "ours-among-others", "object-another-key", "two-keyless", "empty", "wrapped-other"],
)
def test_the_async_transport_reads_a_lookup_answer_for_its_key_as_the_sync_one_does(raw, body, expect):
    fields: dict[str, Any] = {"key_field": "/k"}
    if expect == "wrapped-error":
        fields["lookup_collection_pointer"] = "/data"
    if expect in ("error", "wrapped-error"):
        with pytest.raises(HttpTransportError):
            _alookup(raw, body, **fields)
    elif expect == "not_found":
        assert isinstance(_alookup(raw, body, **fields), NotFound)
    else:
        assert _alookup(raw, body, **fields).remote_id == expect


def test_an_empty_lookup_key_pointer_is_the_whole_object_and_never_confirms_a_send(raw):
    # "" points at the whole object, which is never the key: refused, never found
    with pytest.raises(HttpTransportError):
        _lookup(raw, [{"id": "o1", "k": "dk"}], lookup_key_pointer="")


def test_a_lookup_key_pointer_without_a_leading_slash_is_refused_at_config():
    with pytest.raises(ValueError):
        _cfg("http://127.0.0.1:9", lookup_key_pointer="k")


def test_the_reconciler_leaves_an_unknown_send_alone_when_the_answer_holds_only_another_key(raw, sql_store):
    it, _ = to_state(sql_store, "indeterminate", text="lost")
    server = raw(answer(200, json.dumps([{"id": "someone-else", "k": "other", "text": "lost"}]).encode()))
    with HttpTransport(_cfg(server.url(), key_field="/k")) as t:
        assert Reconciler(sql_store, t, NOW).run() == {"lookup.error": 1}
    after = sql_store.get(it.key)
    assert (after.state, after.remote_id, after.reconcile_count) == ("indeterminate", None, 0)
    assert [h.event for h in sql_store.history(it.key)][-1] == "record_unknown"


# ================================================================ 2. look before sending again


def test_the_look_first_asks_under_every_key_the_attempts_carried_newest_first_and_only_those(any_store):
    s = any_store.store
    it = _parked_twice_with_epochs(s, "two sends")
    t = ScriptedLookup()
    looked = look_before_sending_again(s, t, it.key)
    assert t.asked == [platform_idempotency_key(it.key, 1, 0), it.key]
    assert looked == {"looked_up": t.asked, "why": None}
    assert platform_idempotency_key(it.key, 2, 0) not in t.asked  # the next send's key, which nothing carried


def test_the_look_first_finds_a_first_send_that_landed_behind_a_resend(any_store):
    s = any_store.store
    it = _parked_twice_with_epochs(s, "first landed")
    before = [h.seq for h in s.history(it.key)]
    t = ScriptedLookup(found={it.key: "obj-1"})
    with pytest.raises(FoundOnPlatform) as e:
        look_before_sending_again(s, t, it.key)
    assert (e.value.key, e.value.remote_id, e.value.platform_key) == (it.key, "obj-1", it.key)
    assert [h.seq for h in s.history(it.key)] == before and s.get(it.key).state == "parked"


def test_the_look_first_covers_a_fence_epoch_the_reconciler_moved_to(any_store):
    """Sent under the bare key; a fenced lookup proved it absent (``.f1``); the retry went out under ``.f1`` and is
    unknown, then parked. Both keys are looked at, not ``.f2`` nor ``.r1``."""
    s = any_store.store
    it, _ = to_state(s, "indeterminate", text="fenced")
    fenced = ScriptedLookup(capabilities=Capabilities(lookup_by_key=True, fenced_lookup=True))
    assert Reconciler(s, fenced, NOW).run() == {"lookup.not_found_fenced": 1}
    assert Sweeper(s, NOW).retry_failed()["retried"] == 1
    lease = begin_authorize(s, it.key)
    s.record_unknown(lease, reason="read timeout")
    s.park(it.key, operator="alice")
    t = ScriptedLookup(found={platform_idempotency_key(it.key, 0, 1): "late"})
    with pytest.raises(FoundOnPlatform) as e:
        look_before_sending_again(s, t, it.key)
    assert e.value.platform_key == platform_idempotency_key(it.key, 0, 1)
    t = ScriptedLookup()
    assert look_before_sending_again(s, t, it.key)["looked_up"] == [platform_idempotency_key(it.key, 0, 1), it.key]


def test_a_transport_without_lookup_says_so_and_looks_nothing_up(any_store):
    s = any_store.store
    it, _ = to_state(s, "parked", text="no lookup")
    t = ScriptedLookup(capabilities=Capabilities(lookup_by_key=False))
    assert look_before_sending_again(s, t, it.key) == {
        "looked_up": [],
        "why": "the platform config has no lookup by key",
    }
    assert t.asked == []


def test_a_lookup_error_in_the_look_first_propagates_and_writes_nothing(any_store):
    s = any_store.store
    it = _parked_twice_with_epochs(s, "platform down")
    before = [h.seq for h in s.history(it.key)]
    t = ScriptedLookup(raises=HttpTransportError("lookup failed: ConnectError", None))
    with pytest.raises(HttpTransportError):
        look_before_sending_again(s, t, it.key)
    assert [h.seq for h in s.history(it.key)] == before
    assert (s.get(it.key).state, s.get(it.key).resend_epoch) == ("parked", 1)


def test_an_intent_moved_elsewhere_between_the_look_and_the_resend_refuses_the_resend(any_store):
    s = any_store.store
    it, _ = to_state(s, "parked", text="settled by someone else meanwhile")
    t = ScriptedLookup(during=lambda: s.resolve_published(it.key, operator="bob", remote_id="r-9"))
    assert look_before_sending_again(s, t, it.key)["why"] is None
    with pytest.raises(IllegalMove):
        s.resend(it.key, operator="alice")
    assert (s.get(it.key).state, s.get(it.key).remote_id) == ("published", "r-9")


class _RacingPlatform(http.server.BaseHTTPRequestHandler):
    """A lookup endpoint that answers "nothing under this key" after running ``server.during()`` once (another
    person's moves, made while this lookup is on the wire)."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        with self.server.lock:
            during, self.server.during = self.server.during, None
        if during is not None:
            during()
        self.server.asked.append(self.path)
        answer_json(self, 200, b"[]")


def test_cli_resend_does_not_go_ahead_on_a_look_that_a_resend_cycle_overtook(capsys, tmp_path):
    """ABA: while alice's look-first is on the wire, bob resends the intent; its ``.r1`` send lands but the answer
    is lost, and bob parks it again. Alice's first look never asked for ``.r1``: her resend goes out under ``.r2``
    only after a look that did (the look reads the intent again after it, and looks again when it moved)."""
    from atmostonce_sql import open_store

    url = f"sqlite:///{tmp_path / 'ops.sqlite3'}"
    store = open_store(url)
    try:
        it, _ = to_state(store, "parked", text="aba")

        def bob():
            store.resend(it.key, operator="bob")
            lease = begin_authorize(store, it.key)
            store.record_unknown(lease, reason="read timeout")  # .r1 landed; its answer was lost
            store.park(it.key, operator="bob")

        with http_platform(_RacingPlatform, during=bob, asked=[]) as srv:
            cfg = _write_profile(tmp_path, profile(f"http://127.0.0.1:{srv.server_address[1]}"))
            rc, out, _ = run_cli(
                capsys, "--json", "resend", it.key, "--operator", "alice", "--platform-config", cfg,
                "--database-url", url,
            )  # fmt: skip
            asked = list(srv.asked)
        r1 = platform_idempotency_key(it.key, 1, 0)
        assert any(r1 in a for a in asked)  # the look saw the intent move and looked again, .r1 included
        assert rc == EXIT_OK and r1 in json.loads(out)["lookup"]["looked_up"]
        assert store.get(it.key).resend_epoch == 2
    finally:
        store.close()


def test_resolve_not_sent_after_a_fenced_look_first_is_sent_and_not_refused_by_its_own_tombstone(sql_store):
    """On a platform whose lookup is fenced (a not-found tombstones the key), the look-first of
        ``resolve --not-sent`` would tombstone the key the intent keeps (``resolve_not_sent`` does not bump an epoch),
    so it does not look there.
        design.md#a-fence-is-a-tombstone: every fenced lookup that tombstoned a key is followed by a fence-epoch
        bump, "so a send a person later allows with resolve_not_sent is not refused by the platform". Here the
        intent had one attempt (a person parked its unknown send); the person's not-sent must publish it."""
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "never landed"}, max_attempts=1)
    lease = begin_authorize(store, it.key)
    store.record_unknown(lease, reason="read timeout")
    store.park(it.key, operator="alice")
    with PlatformSink(dedupe=False, fenced_lookup=True, read_lag_seconds=0.0) as sink:
        cfg = sink_config(sink.url, key_field="/delivery_key", lookup_fenced=True, **PATIENT)
        with HttpTransport(cfg) as t:
            looked = look_before_sending_again(store, t, it.key, "resolve_not_sent")
            assert looked["looked_up"] == [] and it.key in looked["why"]  # not under the key the retry keeps
            store.resolve_not_sent(it.key, operator="alice", reason="looked: nothing there")
            outcomes = []
            for _ in range(4):  # the worker's passes: sweep (retry), dispatch, reconcile
                Sweeper(store, NOW).tick()
                if store.get(it.key).state == "pending":
                    outcomes.append(Dispatcher(store, t, NOW).dispatch(it.key))
                Reconciler(store, t, NOW).run()
        assert sink.tombstone_refusals == 0, f"the person's retry met its own look-first's tombstone: {outcomes}"
        assert (store.get(it.key).state, len(sink.objects)) == ("published", 1)


# ---------------------------------------------------------------- the CLI


@pytest.fixture
def js(cli_on_json_server):
    return cli_on_json_server


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
def test_cli_refuses_sending_again_when_a_resend_epoch_send_landed(capsys, js, command):
    store, url, server, cfg = js
    it = _parked_twice_with_epochs(store, "the .r1 send landed")
    with HttpTransport(profile(server.url)) as t:
        landed = t.send(wire_request(store.get(it.key))).remote_id  # under .r1, the intent's current key
    before = [h.seq for h in store.history(it.key)]
    argv = [*command[:1], it.key[:16], *command[1:], "--operator", "alice", "--platform-config", cfg]
    rc, out, _ = run_cli(capsys, "--json", *argv, "--database-url", url)
    assert rc == EXIT_REFUSED
    assert json.loads(out)["found"] == {
        "key": it.key,
        "remote_id": landed,
        "platform_key": platform_idempotency_key(it.key, 1, 0),
    }
    assert [h.seq for h in store.history(it.key)] == before
    assert len(server.posts()) == 1


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
@pytest.mark.parametrize("platform", ["refused", "500", "silent"])
def test_cli_writes_nothing_when_the_platform_fails_the_look_first(capsys, tmp_path, raw, command, platform):
    from atmostonce_sql import open_store

    url = f"sqlite:///{tmp_path / 'ops.sqlite3'}"
    store = open_store(url)
    try:
        it = _parked_twice_with_epochs(store, "platform failing")
        before = [h.seq for h in store.history(it.key)]
        held = None
        if platform == "refused":
            held = _refused_port()
            base = f"http://127.0.0.1:{held.getsockname()[1]}"
        elif platform == "500":
            base = raw(answer(500, b"oops")).url()
        else:  # reads the request, never answers: the read times out
            base = raw(lambda server, conn: (server.read_request(conn), server.release.wait(5))).url()
        cfg = _write_profile(tmp_path, profile(base, read_timeout=0.3, connect_timeout=1.0))
        argv = [*command[:1], it.key, *command[1:], "--operator", "alice", "--platform-config", cfg]
        rc, out, _ = run_cli(capsys, "--json", *argv, "--database-url", url)
        if held is not None:
            held.close()
        assert rc == EXIT_STORE and "platform_error" in json.loads(out)
        assert [h.seq for h in store.history(it.key)] == before
        assert (store.get(it.key).state, store.get(it.key).resend_epoch) == ("parked", 1)
    finally:
        store.close()


def test_cli_resend_with_a_profile_without_lookup_goes_ahead_and_says_it_did_not_look(capsys, js, tmp_path):
    store, url, server, _ = js
    it, _ = to_state(store, "parked", text="no lookup path")
    cfg = profile(server.url)
    cfg.pop("lookup_path", None)
    cfg.pop("lookup_id_pointer", None)
    path = _write_profile(tmp_path, cfg)
    rc, out, _ = run_cli(
        capsys, "--json", "resend", it.key, "--operator", "alice", "--platform-config", path, "--database-url", url
    )
    assert rc == EXIT_OK
    doc = json.loads(out)
    assert doc["state"] == "pending"
    assert doc["lookup"]["looked_up"] == [] and doc["lookup"]["why"]


def test_cli_resend_from_a_wrong_state_is_refused_by_the_state_without_asking_the_platform(capsys, tmp_path, raw):
    from atmostonce_sql import open_store

    url = f"sqlite:///{tmp_path / 'ops.sqlite3'}"
    store = open_store(url)
    try:
        it, _ = to_state(store, "indeterminate", text="not parked")
        server = raw(answer(500, b"must not be asked"))
        cfg = _write_profile(tmp_path, profile(server.url()))
        rc, out, _ = run_cli(
            capsys, "--json", "resend", it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url
        )
        assert rc == EXIT_REFUSED and json.loads(out)["refused"]["event"] == "resend"
        assert server.connections == 0 and store.get(it.key).state == "indeterminate"
    finally:
        store.close()


# ---------------------------------------------------------------- the console


def test_console_writes_nothing_when_the_platform_fails_the_look_first(sql_store, tmp_path, raw):
    from tests.console.conftest import make_client, sign_in

    store = sql_store
    it, _ = to_state(store, "parked", text="console, platform down")
    before = [h.seq for h in store.history(it.key)]
    server = raw(answer(503, b"down"))
    with make_client(store, tmp_path, platform=lambda: HttpTransport(profile(server.url()))) as c:
        csrf = sign_in(c)
        for action in ("resend", "resolve_not_sent"):
            c.post(f"/intents/{it.key}/{action}", data={"csrf": csrf, "reason": "looked"})
        results = [row["result"] for row in c.log.rows() if row["action"] != "sign-in"]
    assert [next(iter(r)) for r in results] == ["platform_error", "platform_error"]
    assert [h.seq for h in store.history(it.key)] == before and store.get(it.key).state == "parked"


def test_console_refuses_a_resend_when_the_resend_epoch_send_landed(sql_store, tmp_path):
    from tests.console.conftest import make_client, sign_in

    store = sql_store
    it = _parked_twice_with_epochs(store, "console .r1 landed")
    (tmp_path / "js").mkdir()
    with (
        JsonServer(tmp_path / "js") as server,
        make_client(store, tmp_path, platform=lambda: HttpTransport(profile(server.url))) as c,
    ):
        with HttpTransport(profile(server.url)) as t:
            landed = t.send(wire_request(store.get(it.key))).remote_id
        csrf = sign_in(c)
        c.post(f"/intents/{it.key}/resend", data={"csrf": csrf, "reason": "looked"})
        (row,) = [row for row in c.log.rows() if row["action"] == "resend"]
        assert row["result"] == {
            "found_on_platform": {
                "key": it.key,
                "remote_id": landed,
                "platform_key": platform_idempotency_key(it.key, 1, 0),
            }
        }
        assert (store.get(it.key).state, store.get(it.key).resend_epoch) == ("parked", 1)
        assert len(server.posts()) == 1


# ================================================================ 3. reconcile exits 3 on what it parks


def test_cli_reconcile_with_no_lookup_parks_names_and_exits_3_and_leaves_the_found_alone(capsys, js, tmp_path):
    store, url, server, _ = js
    unknown, _ = to_state(store, "indeterminate", text="cannot be looked up")
    cfg = profile(server.url)
    cfg.pop("lookup_path", None)
    path = _write_profile(tmp_path, cfg)
    rc, out, _ = run_cli(capsys, "--json", "reconcile", "--platform-config", path, "--database-url", url)
    assert rc == EXIT_STORE
    assert json.loads(out)["parked"] == [{"key": unknown.key, "state": "parked"}]
    # found on the next pass (with lookup): published, exit 0
    landed_it, _ = to_state(store, "indeterminate", text="landed", target="room-2")
    with HttpTransport(profile(server.url)) as t:
        t.send(wire_request(store.get(landed_it.key)))
    full = _write_profile(tmp_path, profile(server.url))
    rc, out, _ = run_cli(capsys, "--json", "reconcile", "--platform-config", full, "--database-url", url)
    assert rc == EXIT_OK and "parked" not in json.loads(out)
    assert store.get(landed_it.key).state == "published"


# ================================================================ 4. retry backoff


def _fail_by_machine(store, key):
    lease = begin_authorize(store, key)
    store.record_not_sent(lease, reason="connect refused")


def test_a_restore_declared_failed_intent_is_settled_by_lookup_and_never_retried_by_the_backoff_exemption(any_store):
    """A person's ``restore_fence`` moves a failed intent to ``indeterminate``; the fenced lookup of an attempt
    begun before the restore proves nothing. The person's move is not a ``resolve_not_sent``: nothing is retried."""
    s = any_store.store
    it, _ = to_state(s, "failed", text="restored")
    s.declare_restore(operator="alice")
    assert s.get(it.key).state == "indeterminate"
    sweeper = Sweeper(s)
    assert sweeper.retry_failed()["retried"] == 0
    fenced = ScriptedLookup(capabilities=Capabilities(lookup_by_key=True, fenced_lookup=True))
    assert Reconciler(s, fenced, NOW).run() == {"lookup.not_found_before_restore": 1}
    assert (s.get(it.key).state, s.get(it.key).fence_epoch) == ("indeterminate", 1)
    assert sweeper.retry_failed()["retried"] == 0


def test_cli_work_sends_a_persons_not_sent_in_the_same_pass_and_spaces_a_machine_not_sent(capsys, js, tmp_path):
    store, url, server, cfg = js
    it, _ = to_state(store, "parked", text="a person said not sent")
    rc, _, _ = run_cli(
        capsys, "resolve", it.key, "--operator", "alice", "--not-sent", "--platform-config", cfg, "--database-url", url
    )
    assert rc == EXIT_OK and store.get(it.key).state == "failed"
    rc, _, _ = run_cli(capsys, "--json", "work", "--platform-config", cfg, "--database-url", url)
    assert rc == EXIT_OK and store.get(it.key).state == "published"
    assert [p["key"] for p in server.posts()] == [it.key]
    # a machine not-sent: a platform refusing connections; the next pass does not spend the next attempt at once
    held = _refused_port()
    down = _write_profile(tmp_path, profile(f"http://127.0.0.1:{held.getsockname()[1]}"))
    other = store.submit("acct", "post", "room-9", {"text": "platform down"})
    try:
        rc, out, _ = run_cli(capsys, "--json", "work", "--platform-config", down, "--database-url", url)
        assert json.loads(out).get("send.not_sent") == 1
        rc, out, _ = run_cli(capsys, "--json", "work", "--platform-config", down, "--database-url", url)
        assert "send.not_sent" not in json.loads(out)
        assert (store.get(other.key).state, store.get(other.key).attempt_count) == ("failed", 1)
    finally:
        held.close()


def test_the_retry_of_a_persons_not_sent_that_fails_again_is_then_spaced(any_store):
    """History: record_unknown, park (person), resolve_not_sent (person), retry (worker), begin, authorize,
    record_not_sent (worker). The last row is a machine's: the person's exemption does not carry over."""
    s = any_store.store
    it = s.submit("acct", "post", "room-1", {"text": "x"}, max_attempts=5)
    lease = begin_authorize(s, it.key)
    s.record_unknown(lease, reason="read timeout")
    s.park(it.key, operator="alice")
    s.resolve_not_sent(it.key, operator="alice")
    sweeper = Sweeper(s)
    assert sweeper.retry_failed()["retried"] == 1
    _fail_by_machine(s, it.key)
    assert sweeper.retry_failed() == {"retried": 0, "exhausted": 0, "waiting": 1, "skipped": 0}
    any_store.advance(11)  # two attempts made: 5 s doubled
    assert sweeper.retry_failed()["retried"] == 1
