"""Fixtures for the HTTP transport tests (real sockets on 127.0.0.1; nothing in httpx is mocked)."""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterator

import pytest
from http_helpers import PATIENT, Behaviour, RawServer

from atmostonce_http import HttpPlatformConfig, HttpTransport, PlatformSink

# ---------------------------------------------------------------- fixtures


@pytest.fixture
def raw_server() -> Iterator[Callable[..., RawServer]]:
    servers: list[RawServer] = []

    def make(behaviour: Behaviour, **kw) -> RawServer:
        server = RawServer(behaviour, **kw)
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.close()


@pytest.fixture
def refused_port() -> Iterator[int]:
    """A port bound but not listening: connecting is refused, and nobody else can take it meanwhile."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    yield s.getsockname()[1]
    s.close()


@pytest.fixture
def full_backlog_port() -> Iterator[int]:
    """A listener with backlog 0 whose accept queue is already full: new SYNs are dropped, connect hangs."""
    ls = socket.socket()
    ls.bind(("127.0.0.1", 0))
    ls.listen(0)
    port = ls.getsockname()[1]
    fillers = []
    for _ in range(3):
        c = socket.socket()
        c.setblocking(False)
        try:
            c.connect(("127.0.0.1", port))
        except BlockingIOError:
            pass
        fillers.append(c)
    yield port
    for c in fillers:
        c.close()
    ls.close()


@pytest.fixture
def transport() -> Iterator[Callable[..., HttpTransport]]:
    """Factory: ``transport(base_url, **config_fields)`` with short timeouts; closed at teardown."""
    made: list[HttpTransport] = []

    def make(base_url: str, **fields) -> HttpTransport:
        t = HttpTransport(HttpPlatformConfig(base_url=base_url, **{"create_path": "/items", **PATIENT, **fields}))
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def sink() -> Iterator[PlatformSink]:
    with PlatformSink(read_lag_seconds=0.3) as s:
        yield s
