"""The most common REST shape, on a server nobody here wrote (json-server): ``POST /posts`` answers the post
with an ``id`` added, ``GET /posts/{id}`` reads it back, ``GET /posts?key=K`` answers a filtered array.
Read-back compares what was approved (the request's fields, normalized), not the platform's whole object
(docs/design.md, "Read-back compares what was approved")."""

from __future__ import annotations

import pytest

from atmostonce.identity import platform_idempotency_key
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, wire_request
from atmostonce_http import HttpTransport
from atmostonce_http.transport import HttpPlatformConfig
from tests.http.jsonserver import JsonServer, profile


@pytest.fixture
def server(tmp_path):
    with JsonServer(tmp_path) as s:
        yield s


def _by_key(server):
    out: dict[str, int] = {}
    for p in server.posts():
        out[p["key"]] = out.get(p["key"], 0) + 1
    return out


def test_twenty_posts_to_a_plain_rest_server_are_all_published_and_none_parked(server, sql_store):
    with HttpTransport(profile(server.url)) as t:
        keys = [sql_store.submit("acct", "post", "room", {"text": f"post {i}", "lang": "en"}).key for i in range(20)]
        outcomes = [Dispatcher(sql_store, t).dispatch(k) for k in keys]
    assert outcomes == ["read_back.match"] * 20
    assert sql_store.count_by_state()["published"] == 20
    assert sql_store.count_by_state()["parked"] == 0
    assert _by_key(server) == dict.fromkeys(keys, 1)  # counted on the platform: one object per delivery key
    assert {sql_store.get(k).remote_id for k in keys} == {str(p["id"]) for p in server.posts()}


def test_a_text_edited_on_the_platform_before_read_back_is_a_mismatch_with_both_projections(server, sql_store):
    it = sql_store.submit("acct", "post", "room", {"text": "as approved"})

    def edit_after_send(point):
        if point == "after_record_success":  # the platform holds the post; someone edits it before we look
            server.edit(sql_store.get(it.key).remote_id, text="edited by someone")

    with HttpTransport(profile(server.url)) as t:
        assert Dispatcher(sql_store, t, crash=edit_after_send).dispatch(it.key) == "read_back.differs"
    assert sql_store.get(it.key).state == "indeterminate"
    detail = sql_store.history(it.key)[-1].detail
    assert detail["reason"] == "read_back.differs"
    assert detail["evidence"] == {
        "field": "/text",
        "sent": {"/text": "as approved"},
        "found": {"/text": "edited by someone"},
    }


def test_a_reconciler_that_finds_the_object_edited_reports_it_as_differing_not_as_absent(server, sql_store):
    it = sql_store.submit("acct", "post", "room", {"text": "as approved"})

    def edit_after_send(point):
        if point == "after_record_success":
            server.edit(sql_store.get(it.key).remote_id, text="edited by someone")

    with HttpTransport(profile(server.url)) as t:
        Dispatcher(sql_store, t, crash=edit_after_send).dispatch(it.key)
        assert Reconciler(sql_store, t).run() == {"lookup.differs": 1}
    assert sql_store.get(it.key).state == "indeterminate"
    assert len(server.posts()) == 1  # nothing was resent


def test_without_read_back_a_success_stays_unknown_until_the_lookup_by_key_finds_it(server, sql_store):
    it = sql_store.submit("acct", "post", "room", {"text": "no read-back here"})
    with HttpTransport(profile(server.url, read_back_path=None)) as t:
        assert not t.capabilities.read_back
        assert Dispatcher(sql_store, t).dispatch(it.key) == "read_back.unavailable"
        assert sql_store.get(it.key).state == "indeterminate"
        assert Reconciler(sql_store, t).run() == {"lookup.found": 1}  # the first look is not deferred
    assert sql_store.get(it.key).state == "published"
    assert _by_key(server) == {it.key: 1}


def test_a_lookup_answering_an_empty_list_is_not_found_and_spends_the_budget(server, sql_store):
    it = sql_store.submit("acct", "post", "room", {"text": "never arrived"}, max_reconciles=1)
    lease = sql_store.begin(it.key)  # a send whose answer was lost: nothing reached json-server
    sql_store.authorize_dispatch(lease, request_digest=it.request_digest)
    sql_store.record_unknown(lease, reason="read timeout")
    with HttpTransport(profile(server.url)) as t:
        now = RuntimeConfig(reconcile_interval=0.0)
        assert Reconciler(sql_store, t, now).run() == {"lookup.not_found": 1}  # GET /posts?key=... -> []
        assert Reconciler(sql_store, t, now).run() == {"reconcile.budget_spent": 1}
    assert sql_store.get(it.key).state == "parked"
    assert server.posts() == []


def test_a_lookup_profile_reads_a_filtered_array_with_its_own_pointers(server):
    with HttpTransport(profile(server.url)) as t:
        from atmostonce.transport import Found, NotFound, WireRequest

        sent = t.send(WireRequest(body={"text": "hello"}, delivery_key="dk-1"))
        assert t.lookup("dk-1") == Found(sent.remote_id, {"text": "hello", "key": "dk-1", "id": int(sent.remote_id)})
        assert isinstance(t.lookup("dk-absent"), NotFound)
    cfg = HttpPlatformConfig.from_mapping(profile(server.url, lookup_id_pointer="/key", projection={"/text": "/body"}))
    assert cfg.projection == (("/text", "/body"),)
    assert HttpPlatformConfig.from_mapping(cfg.as_mapping()) == cfg


@pytest.fixture
def paged_server(tmp_path):
    from tests.http.jsonserver import PAGED_VERSION

    with JsonServer(tmp_path, version=PAGED_VERSION) as s:
        yield s


def _paged(server, **overrides):
    """json-server 1.0's paginated read of the key's posts answers {"first": ..., "items": N, "data": [...]}."""
    return profile(server.url, lookup_path="/posts?key={key}&_page=1&_per_page=1", **overrides)


def test_a_lookup_that_wraps_its_collection_settles_unknown_sends_both_ways(paged_server, sql_store):
    # two sends whose answers were lost: one reached the platform, one did not; the wrapped lookup finds the first
    # and reports the second not found, instead of failing on {"data": []} and leaving it unknown for good
    config = RuntimeConfig(reconcile_interval=0.0)
    with HttpTransport(_paged(paged_server, lookup_collection_pointer="/data")) as t:
        landed = sql_store.submit("acct", "post", "room-1", {"text": "landed"}, max_reconciles=1)
        lost = sql_store.submit("acct", "post", "room-2", {"text": "never arrived"}, max_reconciles=1)
        for it in (landed, lost):
            lease = sql_store.begin(it.key)
            sql_store.authorize_dispatch(lease, request_digest=it.request_digest)
            if it is landed:  # the request reached json-server; its answer was lost on the way back
                t.send(wire_request(sql_store.get(it.key)))
            sql_store.record_unknown(lease, reason="read timeout")
        assert Reconciler(sql_store, t, config).run() == {"lookup.found": 1, "lookup.not_found": 1}
    assert sql_store.get(landed.key).state == "published"
    assert sql_store.get(lost.key).state == "indeterminate"
    assert _by_key(paged_server) == {platform_idempotency_key(landed.key, 0, 0): 1}


def test_a_wrapped_lookup_without_its_collection_pointer_is_an_error_never_not_found(paged_server):
    from atmostonce.transport import Found, NotFound, WireRequest
    from atmostonce_http.transport import HttpTransportError

    with HttpTransport(_paged(paged_server)) as t:  # the wrapper read as the object found: no usable id
        with pytest.raises(HttpTransportError):
            t.lookup("dk-absent")
    with HttpTransport(_paged(paged_server, lookup_collection_pointer="/data")) as t:
        sent = t.send(WireRequest(body={"text": "hello"}, delivery_key="dk-1"))
        assert t.lookup("dk-1") == Found(sent.remote_id, {"text": "hello", "key": "dk-1", "id": sent.remote_id})
        assert isinstance(t.lookup("dk-absent"), NotFound)
    with HttpTransport(_paged(paged_server, lookup_collection_pointer="/items")) as t:  # a number, not an array
        with pytest.raises(HttpTransportError):
            t.lookup("dk-1")


def test_a_declared_restore_finds_on_json_server_the_post_a_person_sent_after_the_backup(server, tmp_path):
    """A parked intent (its send's outcome unknown, nothing on the server) is backed up; a person then settles it
    as not sent and it is posted. The backup is put back and the restore declared: the parked intent is looked up
    on json-server, found, and published; the server holds one post (docs/design.md#what-a-restore-cannot-know)."""
    import sqlite3

    from atmostonce.runtime import Sweeper
    from atmostonce_sql import open_store
    from tests.helpers import begin_authorize

    db, backup = tmp_path / "outbox.sqlite3", tmp_path / "backup.sqlite3"
    config = RuntimeConfig(reconcile_interval=0, first_look_after=0)
    store = open_store(f"sqlite:///{db}")
    it = store.submit("acct", "post", "room", {"text": "parked, then sent"})
    store.record_unknown(begin_authorize(store, it.key), reason="read timeout")  # nothing reached the server
    store.park(it.key, operator="alice")
    source, copy = sqlite3.connect(db), sqlite3.connect(backup)
    source.backup(copy)
    copy.close()
    source.close()
    store.resolve_not_sent(it.key, operator="alice")
    Sweeper(store, config).retry_failed()
    with HttpTransport(profile(server.url)) as t:
        assert Dispatcher(store, t, config).dispatch(it.key) == "read_back.match"
    [post] = server.posts()
    store.close()  # every connection closed: no newer log to replay over the copy
    backup.replace(db)

    store = open_store(f"sqlite:///{db}")
    try:
        assert store.get(it.key).state == "parked"
        assert store.declare_restore(operator="alice")[1] == 1
        with HttpTransport(profile(server.url)) as t:
            assert Reconciler(store, t, config).run() == {"lookup.found": 1}
        assert (store.get(it.key).state, store.get(it.key).remote_id) == ("published", str(post["id"]))
        assert server.posts() == [post]
    finally:
        store.close()
