"""The main job against a real homeserver: N intents posted to a Synapse room through a fault proxy.

The same job as :mod:`atmostonce_cli.demo` (workers that crash at step
boundaries, the sweeper, the reconciler), with the platform replaced by a
local Synapse (:class:`atmostonce_matrix.synapse.SynapseServer`) behind a
:class:`atmostonce_matrix.proxy.FaultProxy` that drops, delays and resets
sends. Synapse deduplicates a txnId only for the same device; a duplicate is
counted from the room itself: every ``m.room.message`` event of the room is
read back at the end and grouped by its ``org.atmostonce.delivery_key``.

The history lookup is not fenced (docs/matrix.md), so an unknown send whose
event never appeared ends ``parked`` for a person, never resent.
"""

from __future__ import annotations

import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from atmostonce.runtime import RuntimeConfig
from atmostonce.service import Outbox
from atmostonce_cli.demo import (
    DemoResult,
    _Crasher,
    _progress,
    check_arguments,
    format_platform_result,
    open_empty_store,
    platform_result,
    run_outbox,
)
from atmostonce_cli.urls import usable_url
from atmostonce_http.profile import load_profile

from .proxy import FaultProxy
from .synapse import SynapseServer
from .transport import KEY_FIELD, MatrixTransport

__all__ = ["MATRIX_FAULT_MIX", "MatrixDemoResult", "format_matrix_result", "run_matrix_demo"]

MATRIX_FAULT_MIX = {
    "drop_before_forward": 0.05,  # the homeserver never saw it: unknown, not found, parked
    "drop_after_forward": 0.06,  # posted, answer lost: unknown, found, published
    "delay": 0.04,  # held past the client's read timeout, lands later
    "reset": 0.04,  # reset mid-request: unknown, nothing posted
    "gateway_error": 0.04,  # posted, then a 502 from the proxy: unknown, found
}
"""Per send (``PUT``) probabilities of each proxy fault; the rest pass."""


@dataclass
class MatrixDemoResult(DemoResult):
    """:class:`atmostonce_cli.demo.DemoResult` plus what the room holds.

    ``creates`` counts events carrying a delivery key; ``events_in_room`` every
    ``m.room.message`` event in the room; ``create_requests`` the sends the
    proxy received.
    """

    events_in_room: int = 0
    homeserver: str = ""
    room_id: str = ""
    device_id: str = ""


def run_matrix_demo(
    n: int = 100,
    workers: int = 4,
    database_url: str | None = None,
    seed: int = 1,
    fault_mix: dict[str, float] | None = None,
    crash_rate: float = 0.03,
    timeout: float = 180.0,
    progress: TextIO | None = sys.stderr,
    progress_every: float = 1.0,
    homeserver: SynapseServer | None = None,
    read_timeout: float = 1.0,
    delay_seconds: float = 1.5,
) -> MatrixDemoResult:
    """Run the job against Synapse; returns a :class:`MatrixDemoResult`. Times are seconds.

    ``database_url``: an empty store (default: a fresh SQLite file in a
    temporary folder, kept for inspection). ``homeserver``: a started
    :class:`SynapseServer` to use (default: start one and stop it at the end).
    ``read_timeout``: the transport's; ``delay_seconds``: how long the proxy
    holds a delayed send (keep it above ``read_timeout``).

    Raises ``ValueError`` for a bad argument or a non-empty database,
    :class:`atmostonce_matrix.synapse.SynapseError` when Synapse cannot start.
    """
    check_arguments(n, workers, crash_rate)
    tmp = Path(tempfile.mkdtemp(prefix="atmostonce-matrix-demo-"))
    if database_url is None:
        database_url = f"sqlite:///{tmp / 'demo.sqlite3'}"
    store = open_empty_store(database_url)
    hs: SynapseServer | None = None
    try:
        started = time.monotonic()
        hs = homeserver if homeserver is not None else SynapseServer().start()
        password = uuid.uuid4().hex
        user = hs.register_user(f"demo-{uuid.uuid4().hex[:8]}", password)
        room = hs.create_room(user.access_token, name="atmostonce demo")
        result = _run(
            store, hs, user.localpart, password, user.access_token, room, tmp, n, workers, seed,
            fault_mix if fault_mix is not None else MATRIX_FAULT_MIX, crash_rate, timeout, progress,
            progress_every, read_timeout, delay_seconds, started,
        )  # fmt: skip
        result.database, result.password_left_out = usable_url(database_url)
        return result
    finally:
        store.close()
        if hs is not None and homeserver is None:
            hs.stop()


def _run(
    store, hs, localpart, password, token, room, tmp, n, workers, seed, mix, crash_rate, timeout, progress,
    progress_every, read_timeout, delay_seconds, started,
) -> MatrixDemoResult:  # fmt: skip
    run = uuid.uuid4().hex[:8]
    config = RuntimeConfig(
        lease_seconds=2.0, send_lease_seconds=3.0, retries_per_tick=25, reconcile_interval=0.5, retry_backoff=0.5
    )  # the demo's time, compressed
    crasher = _Crasher(crash_rate, seed)

    with FaultProxy("127.0.0.1", hs.port, delay_seconds=delay_seconds) as proxy:
        # the shipped profile spec/platforms/matrix.toml, with this deployment and the demo's short timeouts
        cfg = load_profile("matrix").matrix_config(
            homeserver_url=proxy.url,
            room_id=room,
            user=localpart,
            password=password,
            state_path=str(tmp / "matrix-state.json"),
            connect_timeout=2.0,
            write_timeout=2.0,
            read_timeout=read_timeout,
        )
        with MatrixTransport(cfg) as transport:
            proxy.set_fault_mix(mix, seed=seed, match="PUT ")
            keys = [
                store.submit(
                    f"demo-account-{i % 3}", "post", room, {"msgtype": "m.text", "body": f"demo post {i} of run {run}"}
                ).key
                for i in range(n)
            ]
            outbox = Outbox(
                store, transport, workers=workers, config=config, crash=crasher, seed=seed,
                sweep_every=0.1, reconcile_every=0.1, poll_every=0.02,
            )  # fmt: skip
            settled = run_outbox(
                outbox, store, started=started, timeout=max(0.0, timeout - (time.monotonic() - started)),
                progress=progress, progress_every=progress_every,
            )  # fmt: skip
            proxy.clear()
            proxy.wait_idle(timeout=delay_seconds + 10)  # a delayed send still in the proxy lands before we count
            device_id = transport.device_id
        if progress is not None:
            _progress(progress, store.count_by_state(), time.monotonic() - started)
        events = hs.room_messages(token, room)
        by_key = Counter(e["content"].get(KEY_FIELD) for e in events if KEY_FIELD in e.get("content", {}))

        def on_room(it) -> bool:
            return by_key.get(it.key, 0) > 0 or any(k.startswith(it.key + ".r") for k in by_key)

        return platform_result(
            MatrixDemoResult,
            store,
            keys,
            by_key,
            crasher=crasher,
            settled=settled,
            started=started,
            holds=on_room,
            create_requests=sum(1 for r in proxy.records if r.request_line.startswith("PUT ")),
            faults=dict(proxy.faults),
            events_in_room=len(events),
            homeserver=f"Synapse at {hs.url} (through the fault proxy)",
            room_id=room,
            device_id=device_id,
        )


def format_matrix_result(r: MatrixDemoResult) -> str:
    """The CLI summary: :func:`atmostonce_cli.demo.format_result` plus the room's own count (the history
    lookup is not fenced)."""
    return format_platform_result(
        r,
        [
            ("events in the Matrix room (m.room.message)", r.events_in_room),
            ("homeserver", r.homeserver),
            ("room", r.room_id),
            ("publisher device", r.device_id),
        ],
    )
