"""A lookup takes only the object sent under the key it asked for (docs/design.md#a-lookup-must-answer-for-its-key).

A lookup path naming a parameter the platform ignores answers every object: read as its first element, an
unknown send with the same body as an earlier post was marked published with that post's id, and the post
that never landed was lost from view. Here on json-server (a REST server nobody here wrote, which ignores a
filter on a field no post has) and on a raw socket for each shape of answer."""

from __future__ import annotations

import json

import httpx
import pytest
from http_helpers import answer

from atmostonce.identity import platform_idempotency_key
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig
from atmostonce.transport import Found, NotFound
from atmostonce_http import HttpTransport, HttpTransportError
from tests.helpers import begin_authorize
from tests.http.jsonserver import JsonServer, profile

CONFIG = RuntimeConfig(reconcile_interval=0, lookup_error_backoff=0)


@pytest.fixture
def server(tmp_path):
    with JsonServer(tmp_path) as s:
        yield s


def _unknown_without_landing(store, target):
    """An intent whose send is unknown and never reached the platform (the store told so directly); another
    account than the published post's, whose duplicate-text window would refuse the same words."""
    it = store.submit("acct-2", "post", target, {"text": "same words", "lang": "en"})
    lease = begin_authorize(store, it.key)
    store.record_unknown(lease, reason="read timeout")
    return it


def test_a_lookup_path_the_platform_ignores_finds_nothing_rather_than_another_post(server, sql_store):
    published = sql_store.submit("acct", "post", "room-1", {"text": "same words", "lang": "en"})
    with HttpTransport(profile(server.url)) as t:
        assert Dispatcher(sql_store, t).dispatch(published.key) == "read_back.match"
    lost = _unknown_without_landing(sql_store, "room-2")
    wrong = profile(server.url, lookup_path="/posts?idempotency_key={key}")  # json-server has no such field
    assert len(httpx.get(server.url + "/posts?idempotency_key=nothing").json()) == 1  # it answers every post
    with HttpTransport(wrong) as t:
        assert Reconciler(sql_store, t, CONFIG).run() == {"lookup.error": 1}
    after = sql_store.get(lost.key)
    assert (after.state, after.remote_id, after.reconcile_count) == ("indeterminate", None, 0)
    with HttpTransport(profile(server.url)) as t:  # the shipped profile's filter: the post is not there
        assert Reconciler(sql_store, t, CONFIG).run() == {"lookup.not_found": 1}
    assert sql_store.get(lost.key).remote_id is None
    assert len(server.posts()) == 1


def test_the_lookup_still_finds_the_post_sent_under_its_key_among_others(server, sql_store):
    first = sql_store.submit("acct", "post", "room-1", {"text": "same words", "lang": "en"})
    second = sql_store.submit("acct-2", "post", "room-2", {"text": "same words", "lang": "en"})
    with HttpTransport(profile(server.url)) as t:
        for it in (first, second):
            assert Dispatcher(sql_store, t).dispatch(it.key) == "read_back.match"
    posts = {p["key"]: str(p["id"]) for p in server.posts()}
    with HttpTransport(profile(server.url, lookup_path="/posts?idempotency_key={key}")) as t:
        assert t.lookup(second.key) == Found(posts[second.key], t.lookup(second.key).body)
        assert t.lookup(first.key).remote_id == posts[first.key]


def _array(*objs):
    return answer(200, json.dumps(list(objs)).encode())


@pytest.mark.parametrize(
    "objs, fields, found",
    [
        ([{"id": "o1", "k": "other"}], {"key_field": "/k"}, "error"),
        ([{"id": "o1", "k": "other"}, {"id": "o2", "k": "dk"}], {"key_field": "/k"}, "o2"),
        ([{"id": "o1", "ref": "dk"}], {"key_field": "/k", "lookup_key_pointer": "/ref"}, "o1"),
        ([{"id": "o1", "ref": "other"}], {"lookup_key_pointer": "/ref"}, "error"),
        ([{"id": "o1"}, {"id": "o2"}], {}, "error"),
        ([{"id": "o1"}, {"id": "o2"}], {"key_field": "/k"}, "error"),
        ([{"id": "o1"}], {}, "o1"),
        ([{"id": "o1", "k": None}], {"key_field": "/k"}, "o1"),
        ([], {"key_field": "/k"}, "not_found"),
    ],
    ids=[
        "only-another-key",
        "ours-among-others",
        "key-where-lookup-key-pointer-says",
        "another-key-where-lookup-key-pointer-says",
        "two-objects-no-key-configured",
        "two-objects-holding-no-key",
        "one-object-no-key-configured",
        "a-null-key-is-no-key",
        "empty",
    ],
)
def test_an_array_answer_is_read_for_the_key_asked(transport, raw_server, objs, fields, found):
    server = raw_server(_array(*objs))
    t = transport(server.url(), lookup_path="/find?ref={key}", **fields)
    if found == "error":
        with pytest.raises(HttpTransportError) as e:
            t.lookup("dk")
        assert e.value.status == 200
    elif found == "not_found":
        assert isinstance(t.lookup("dk"), NotFound)
    else:
        assert t.lookup("dk").remote_id == found


def test_one_object_answered_under_another_key_is_an_error_and_under_ours_is_found(transport, raw_server):
    key = platform_idempotency_key("dk", 2, 0)
    other = raw_server(answer(200, {"id": "o1", "k": "dk"}))  # the first send's key, not the resend's
    with pytest.raises(HttpTransportError):
        transport(other.url(), lookup_path="/find/{key}", key_field="/k").lookup("dk", resend_epoch=2)
    ours = raw_server(answer(200, {"id": "o2", "k": key}))
    assert (
        transport(ours.url(), lookup_path="/find/{key}", key_field="/k").lookup("dk", resend_epoch=2).remote_id == "o2"
    )


@pytest.mark.parametrize(
    "body",
    [b"null", b"[null]", b"5", b'"dk"', b'[{"id": "o1"}, 7]'],
    ids=["null", "array-of-null", "number", "string", "array-with-a-number"],
)
def test_an_answer_that_is_neither_an_object_nor_an_array_of_them_is_an_error(transport, raw_server, body):
    """Only an empty array or a 404 says "not found": a 200 whose JSON is ``null``, a number, a string or an
    array holding anything but objects says nothing about the key, and taking it as absent would let a fenced
    platform's reconciler record a not-sent."""
    server = raw_server(answer(200, body))
    with pytest.raises(HttpTransportError) as e:
        transport(server.url(), lookup_path="/find?ref={key}").lookup("dk")
    assert e.value.status == 200
