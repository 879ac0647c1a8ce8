"""A send lease not longer than the transport's own send timeouts is logged when the dispatcher is made: an
answer that arrives after the lease is not recorded as the send's outcome, which then stays unknown until
reconciliation settles it (docs/operations.md, the `[runtime]` settings)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from atmostonce.model import MemoryStore
from atmostonce.runtime import Dispatcher, RuntimeConfig
from atmostonce_http.transport import HttpPlatformConfig, HttpTransport
from atmostonce_matrix.transport import MatrixConfig, MatrixTransport

TIMEOUTS = {"connect_timeout": 2.0, "write_timeout": 3.0, "read_timeout": 20.0}  # a send may wait 27 s


def _warnings(caplog):
    return [
        (r.send_lease_seconds, r.send_timeout_seconds)
        for r in caplog.records
        if r.name == "atmostonce.runtime" and r.levelno == logging.WARNING and hasattr(r, "send_timeout_seconds")
    ]


@pytest.fixture
def http():
    with HttpTransport(HttpPlatformConfig("http://127.0.0.1:9", **TIMEOUTS)) as transport:
        yield transport


def test_the_http_transport_states_how_long_one_send_may_wait(http):
    assert http.send_timeout_seconds == 2.0 * 2 + 3.0 + 20.0


@pytest.mark.parametrize("lease", [10.0, 27.0])
def test_a_send_lease_not_longer_than_the_send_timeouts_is_warned_about(http, caplog, lease):
    with caplog.at_level(logging.WARNING, logger="atmostonce.runtime"):
        Dispatcher(MemoryStore(), http, RuntimeConfig(send_lease_seconds=lease))
    assert _warnings(caplog) == [(lease, 27.0)]


def test_a_send_lease_longer_than_the_send_timeouts_is_not_warned_about(http, caplog):
    with caplog.at_level(logging.WARNING, logger="atmostonce.runtime"):
        Dispatcher(MemoryStore(), http, RuntimeConfig(send_lease_seconds=27.5))
        Dispatcher(MemoryStore(), http)  # the default lease (60 s) against the HTTP fixture's 27 s
    assert _warnings(caplog) == []


def test_a_transport_that_states_no_send_timeout_is_not_checked(caplog):
    class Silent:
        name, protocol_version = "silent", 1

    with caplog.at_level(logging.WARNING, logger="atmostonce.runtime"):
        Dispatcher(MemoryStore(), Silent(), RuntimeConfig(send_lease_seconds=0.1))  # type: ignore[arg-type]
    assert _warnings(caplog) == []


def test_the_default_lease_outlasts_the_default_http_timeouts(caplog):
    with caplog.at_level(logging.WARNING, logger="atmostonce.runtime"):
        with HttpTransport(HttpPlatformConfig("http://127.0.0.1:9")) as transport:
            Dispatcher(MemoryStore(), transport)
    assert _warnings(caplog) == []


def test_the_matrix_transport_states_its_send_timeouts_too(tmp_path):
    cfg = MatrixConfig.from_mapping(
        {
            "homeserver_url": "http://127.0.0.1:9",
            "room_id": "!r:example.org",
            "user": "@bot:example.org",
            "password": "x",
            "state_path": str(tmp_path / "state"),
            **TIMEOUTS,
        }
    )
    # read on a stand-in: a MatrixTransport logs in when it is made, and nothing answers here
    assert MatrixTransport.send_timeout_seconds.fget(SimpleNamespace(config=cfg)) == 27.0


def test_the_dispatch_threads_sharing_a_transport_warn_of_a_short_lease_once(http, caplog):
    """An outbox makes one dispatcher per thread over one transport: the short lease is one warning, not one per
    thread; another lease on it is warned about again."""
    with caplog.at_level(logging.WARNING, logger="atmostonce.runtime"):
        for _ in range(4):
            Dispatcher(MemoryStore(), http, RuntimeConfig(send_lease_seconds=5.0))
        Dispatcher(MemoryStore(), http, RuntimeConfig(send_lease_seconds=6.0))
    assert _warnings(caplog) == [(5.0, 27.0), (6.0, 27.0)]
