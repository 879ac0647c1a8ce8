"""Fixtures: ONE Synapse per test session (per xdist worker), a fault proxy and a room per test.

Synapse comes from the project's test extras (``matrix-synapse``); if it cannot start, the
session fixture raises and every test here fails: nothing is skipped.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce_matrix import KEY_FIELD, MatrixConfig, MatrixTransport
from atmostonce_matrix.proxy import FaultProxy
from atmostonce_matrix.synapse import MatrixUser, SynapseServer

CONFIG = RuntimeConfig(
    lease_seconds=10, send_lease_seconds=10, retries_per_tick=100, reconcile_interval=0, retry_backoff=0
)  # a proven not-sent is retried on the next pass
READ_TIMEOUT = 1.5  # the transport's; every proxy delay below is longer
DELAY = 2.0


@pytest.fixture(scope="session")
def synapse() -> Iterator[SynapseServer]:
    hs = SynapseServer().start()  # raises SynapseError (with the log tail) if Synapse cannot start
    yield hs
    hs.stop()


@pytest.fixture(scope="session")
def admin(synapse) -> MatrixUser:
    return synapse.register_user("admin", "admin-password", admin=True)


_names = itertools.count(1)


@pytest.fixture
def user(synapse) -> MatrixUser:
    """A fresh publisher account (so device lists and rate limits are the test's own)."""
    return synapse.register_user(f"publisher{next(_names)}", "publisher-password")


@pytest.fixture
def room(synapse, user) -> str:
    return synapse.create_room(user.access_token)


@pytest.fixture
def proxy(synapse) -> Iterator[FaultProxy]:
    with FaultProxy("127.0.0.1", synapse.port, delay_seconds=DELAY) as p:
        yield p


@pytest.fixture
def make_transport(proxy, user, room, tmp_path) -> Iterator[Callable[..., MatrixTransport]]:
    """``make_transport(state="publisher", **config_fields)``: a transport through the proxy; closed at teardown."""
    made: list[MatrixTransport] = []

    def make(state: str = "publisher", *, clock=None, **fields: Any) -> MatrixTransport:
        cfg = MatrixConfig(
            **{
                "homeserver_url": proxy.url,
                "room_id": room,
                "user": user.localpart,
                "password": user.password,
                "state_path": str(tmp_path / f"{state}.json"),
                "connect_timeout": 2.0,
                "read_timeout": READ_TIMEOUT,
                **fields,
            }
        )
        t = MatrixTransport(cfg) if clock is None else MatrixTransport(cfg, clock=clock)
        made.append(t)
        return t

    yield make
    for t in made:
        t.close()


@pytest.fixture
def transport(make_transport) -> MatrixTransport:
    return make_transport()


@dataclass
class StoreUnderTest:
    store: Any
    kind: str

    def advance(self, seconds: float) -> None:
        from atmostonce_sql.testing import age_leases

        age_leases(self.store, seconds)

    @property
    def url(self) -> str:
        return self.store.engine.url.render_as_string(hide_password=False)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db(request) -> StoreUnderTest:
    """The two SQL stores (the repo's ``sqlite_store`` and ``pg_store`` fixtures)."""
    return StoreUnderTest(
        request.getfixturevalue(f"{'sqlite' if request.param == 'sqlite' else 'pg'}_store"), request.param
    )


class Room:
    """What the room holds, read straight from Synapse (not through the proxy or the transport)."""

    def __init__(self, synapse: SynapseServer, user: MatrixUser, room_id: str):
        self.synapse, self.user, self.room_id = synapse, user, room_id

    def events(self) -> list[dict]:
        return self.synapse.room_messages(self.user.access_token, self.room_id)

    def by_key(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for e in self.events():
            out.setdefault(e["content"].get(KEY_FIELD), []).append(e["event_id"])
        return out


@pytest.fixture
def room_view(synapse, user, room) -> Room:
    return Room(synapse, user, room)


def settle(db: StoreUnderTest, transport, rounds: int = 6) -> None:
    """Maintenance the way a deployment runs it: sweep, reconcile, retry, dispatch what is pending."""
    d = Dispatcher(db.store, transport, CONFIG)
    for _ in range(rounds):
        db.advance(11)
        Sweeper(db.store, CONFIG).tick()
        Reconciler(db.store, transport, CONFIG).run()
        for key in db.store.claimable():
            d.dispatch(key)


def assert_at_most_once(db: StoreUnderTest, room: Room, keys: list[str]) -> dict[str, str]:
    """The invariant: one event per published intent (its remote id), none for a failed one,
    none without an intent. Returns the final state per key."""
    by_key = room.by_key()
    assert None not in by_key, "an event without a delivery key"
    finals = {}
    for key in keys:
        it = db.store.get(key)
        finals[key] = it.state
        events = by_key.get(key, [])
        assert len(events) <= 1, f"duplicate events for {key}: {events}"
        if it.state == "published":
            assert events == [it.remote_id], (key, events, it.remote_id)
        if it.state == "failed":
            assert events == [], (key, events)
    assert set(by_key) <= set(keys)
    return finals
