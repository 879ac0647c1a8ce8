"""What the trials' posts APIs share (tests/test_sqlite_worker_crash_trial.py, tests/test_pg_worker_trial.py): a
platform written here, on 127.0.0.1, with *no* idempotency of its own, that keeps its posts and counts every
create request per delivery key, so a resend shows as a second request whatever it stored. Each trial gives its
own request handler (its faults); the CLI runner they both drive is here too."""

from __future__ import annotations

import collections
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from atmostonce_cli.main import main


class JsonHandler(BaseHTTPRequestHandler):
    """HTTP/1.1, quiet, with :meth:`_json` to answer a JSON document."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _json(self, status: int, doc: Any) -> None:
        self._head(status, json.dumps(doc).encode())
        self.wfile.write(self._body)

    def _head(self, status: int, data: bytes) -> None:
        """The status line and headers of a JSON answer whose body is ``data`` (kept as ``_body``)."""
        self._body = data
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()


class PostsServer:
    """The platform's state (``objects`` by id, ``create_requests`` per delivery key, under ``lock``) and its
    server on a free loopback port, serving ``handler`` (a :class:`JsonHandler` subclass the trial builds with
    this object in reach) from :meth:`__enter__` to :meth:`__exit__`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.objects: dict[str, dict[str, Any]] = {}
        self.create_requests: collections.Counter[str] = collections.Counter()

    def serve(self, handler: type[JsonHandler]) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> Any:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


def run_cli(capsys: Any, *argv: str) -> tuple[int, str]:
    """``atmostonce ARGV`` in this process: its exit code and what it printed on stdout."""
    rc = main(list(argv))
    out, _ = capsys.readouterr()
    return rc, out
