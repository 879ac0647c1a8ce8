"""Small drivers that take an intent to a given state through the public operations."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from typing import Any

from atmostonce.records import Intent, Lease


@contextlib.contextmanager
def durable_cluster(name: str, settings: dict[str, Any] | None = None) -> Iterator[Any]:
    """A throwaway PostgreSQL cluster that pays for durability (fsync on), in a folder of its own that a test may
    stop and start again (``cluster.stop()`` is ``pg_ctl stop -m immediate``, a crash; ``cluster.start()``
    recovers it). ``settings``: more ``postgresql.conf`` parameters. Yields the started cluster; removes it after."""
    from atmostonce_sql.pgserver import LocalCluster

    parent = tempfile.mkdtemp(prefix=f"atmostonce-{name}-", dir="/tmp")
    os.chmod(parent, 0o755)
    cluster = LocalCluster(os.path.join(parent, "pg"), remove_on_stop=False, fsync=True, settings=settings).start()
    try:
        yield cluster
    finally:
        cluster.remove_on_stop = True
        cluster.stop()
        shutil.rmtree(parent, ignore_errors=True)


def crashable_cluster(name: str) -> contextlib.AbstractContextManager[Any]:
    """:func:`durable_cluster` whose WAL writer sleeps 10 s, so a commit that did not wait for the disk is lost
    when the test crashes the server."""
    return durable_cluster(name, {"wal_writer_delay": "10s"})


def submit(store, text="hello", account="acct", kind="post", target="room-1", **kw) -> Intent:
    return store.submit(account, kind, target, {"text": text} if text is not None else {}, **kw)


def begin_authorize(store, key) -> Lease:
    lease = store.begin(key, lease_seconds=30)
    store.authorize_dispatch(lease, request_digest=store.get(key).request_digest, send_lease_seconds=30)
    return lease


def to_state(store, state: str, text="hello", **kw) -> tuple[Intent, Lease | None]:
    """Drive a fresh intent to ``state``; returns the intent and the last lease."""
    it = submit(store, text=text, **kw)
    if state == "pending":
        return store.get(it.key), None
    lease = begin_authorize(store, it.key)
    if state == "authorized":
        return store.get(it.key), lease
    if state == "published":
        store.record_success(lease, remote_id="r-1")
        store.confirm_read_back(lease)
    elif state == "failed":
        store.record_not_sent(lease, reason="connect refused")
    elif state == "indeterminate":
        store.record_unknown(lease, reason="read timeout")
    elif state == "parked":
        store.record_unknown(lease, reason="read timeout")
        store.park(it.key, operator="alice")
    else:  # pragma: no cover
        raise ValueError(state)
    return store.get(it.key), lease


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """Run the ``atmostonce`` CLI in this process; returns ``(exit code, stdout, stderr)``."""
    from atmostonce_cli.main import main

    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def empty_database_url(request, dialect, tmp_path):
    """An empty database (``sqlite`` or ``postgresql``) with no migration run, and its cleanup (or None)."""
    if dialect == "sqlite":
        return f"sqlite:///{tmp_path / 'old.sqlite3'}", None
    dbs = request.getfixturevalue("pg_databases")
    name = f"{dbs.prefix}_old_{tmp_path.name[-12:]}".replace("-", "_").lower()
    with dbs.admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    return dbs.url(name), lambda: dbs.drop(dbs.url(name))


@contextlib.contextmanager
def http_platform(handler: type, **state: Any) -> Iterator[Any]:
    """A fake platform on a real socket: ``handler`` (an ``http.server.BaseHTTPRequestHandler``) served by a
    ``ThreadingHTTPServer`` on 127.0.0.1 (a free port) in a thread. ``state`` is set on the server (a handler
    reads it as ``self.server.<name>``), with a ``lock`` beside it. Yields the server; shuts it down after."""
    import http.server
    import threading

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.lock = threading.Lock()  # type: ignore[attr-defined]
    for name, value in state.items():
        setattr(srv, name, value)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()


def answer_json(handler: Any, status: int, data: bytes, raw_headers: Any = ()) -> None:
    """Write an HTTP answer from a ``BaseHTTPRequestHandler``: ``status``, each ``(name, value)`` of
    ``raw_headers`` as given (UTF-8 for text: http.server itself would refuse non-Latin-1 text), a JSON
    content type and ``data`` as the body."""
    handler.send_response(status)
    for name, value in raw_headers:
        handler._headers_buffer.append(
            name.encode() + b": " + (value if isinstance(value, bytes) else value.encode("utf-8")) + b"\r\n"
        )
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def landed_late(server, store, key):
    """The intent's request as its send carried it, created on json-server ``server`` now (a post that landed
    after its sender stopped waiting); returns the object's id."""
    from atmostonce.runtime import wire_request
    from atmostonce_http import HttpTransport
    from tests.http.jsonserver import profile

    with HttpTransport(profile(server.url)) as t:
        return t.send(wire_request(store.get(key))).remote_id


def settle_parked(capsys, url, *extra):
    """``atmostonce --json settle --state parked ... --yes`` by alice: ``(exit code, {key: result})``."""
    import json

    argv = ["--json", "settle", "--state", "parked", "--operator", "alice", "--reason", "looked", "--yes"]
    rc, out, _ = run_cli(capsys, *argv, *extra, "--database-url", url)
    return rc, {r["key"]: r for r in json.loads(out)["results"]}
