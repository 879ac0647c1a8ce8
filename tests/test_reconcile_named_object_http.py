"""A REST platform on a real socket that stores the post and answers the create with another object's id (a 201
naming a post that does not exist), through the real ``HttpTransport``: the read-back of that id finds nothing,
the send stays unknown, and the reconciler finds the post by the idempotency key and confirms it under its own id
(docs/design.md#response-is-not-proof). The platform is never asked to create twice. On SQLite and PostgreSQL."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig

CONFIG = RuntimeConfig(reconcile_interval=0, first_look_after=0)


class WrongIdPlatform(BaseHTTPRequestHandler):
    """``POST /posts`` stores the post under a new id and answers 201 naming another; ``GET /posts/{id}`` reads
    a post (404 if none); ``GET /posts?key=K`` lists the posts created with idempotency key ``K``."""

    posts: dict[str, dict] = {}
    creates = 0
    lock = threading.Lock()

    def log_message(self, fmt: str, *args: object) -> None:  # quiet
        pass

    def _answer(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:  # noqa: N802 - the handler's protocol
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        post = body | {"id": uuid.uuid4().hex[:12]}
        cls = type(self)
        with cls.lock:
            cls.creates += 1
            cls.posts[post["id"]] = post
        self._answer(201, {"id": f"not-{post['id']}"})  # the post exists, under another id than the one named

    def do_GET(self) -> None:  # noqa: N802
        url = urlparse(self.path)
        with type(self).lock:
            posts = dict(type(self).posts)
        if url.path == "/posts":
            key = parse_qs(url.query).get("key", [""])[0]
            return self._answer(200, [p for p in posts.values() if p.get("key") == key])
        post = posts.get(url.path.removeprefix("/posts/"))
        return self._answer(404, {"error": "no such post"}) if post is None else self._answer(200, post)


@pytest.fixture
def platform() -> Iterator[tuple[type[WrongIdPlatform], str]]:
    handler = type("Platform", (WrongIdPlatform,), {"posts": {}, "creates": 0, "lock": threading.Lock()})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("store_fixture", ["sqlite_store", pytest.param("pg_store", marks=pytest.mark.postgres)])
def test_a_201_naming_another_post_is_confirmed_under_the_post_the_key_finds(request, platform, store_fixture):
    from atmostonce_http import HttpPlatformConfig, HttpTransport

    store = request.getfixturevalue(store_fixture)
    handler, url = platform
    config = HttpPlatformConfig(
        base_url=url,
        create_path="/posts",
        id_pointer="/id",
        read_back_path="/posts/{id}",
        lookup_path="/posts?key={key}",
        key_field="/key",
    )
    transport = HttpTransport(config)
    try:
        key, outcome = Dispatcher(store, transport, CONFIG).publish("acct", "post", "room-1", {"text": "hello"})
        assert outcome == "read_back.not_found"  # the id it answered with names nothing
        assert store.get(key).state == "indeterminate"
        Reconciler(store, transport, CONFIG).run()
    finally:
        transport.close()
    (post,) = handler.posts.values()
    it = store.get(key)
    assert (it.state, it.remote_id) == ("published", post["id"])  # the post the key found, not the named one
    assert handler.creates == 1  # never created twice
