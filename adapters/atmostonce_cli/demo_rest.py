"""The main job against a generic REST server nobody here wrote: N intents posted to json-server through a fault proxy.

The same job as :mod:`atmostonce_cli.demo` (workers that crash at step boundaries, the sweeper, the
reconciler), with the platform replaced by json-server (:mod:`atmostonce_http.jsonserver`, from npm)
described by the shipped profile ``spec/platforms/json_server.toml``, behind the HTTP fault proxy
(:class:`atmostonce_matrix.proxy.FaultProxy`) that drops, delays and resets creates. json-server has no
idempotency: every create that reaches it is a new post. Duplicates are counted from json-server's own
``posts`` collection, read straight from the server at the end and grouped by the profile's key field
(the delivery key, whatever its epochs), never from atmostonce's counters.

The lookup is not fenced (json-server refuses nothing), so an unknown create whose post never appeared
ends ``parked`` for a person, never resent.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from atmostonce.errors import Rejected
from atmostonce.identity import split_platform_idempotency_key
from atmostonce.runtime import Dispatcher, Reconciler, SimulatedCrash, Sweeper, Worker
from atmostonce_http._pointer import pointer_get
from atmostonce_http.jsonserver import JsonServer
from atmostonce_http.profile import load_profile

from .demo import (
    OPEN_STATES,
    DemoResult,
    Settled,
    _Crasher,
    _progress,
    check_arguments,
    format_platform_result,
    open_empty_store,
    platform_result,
)

__all__ = ["REST_FAULT_MIX", "RestDemoResult", "format_rest_result", "run_rest_demo"]

REST_FAULT_MIX = {
    "drop_before_forward": 0.05,  # the server never saw it: unknown, not found, parked
    "drop_after_forward": 0.06,  # created, answer lost: unknown, the lookup finds it, published
    "delay": 0.04,  # held past the client's read timeout, lands later
    "reset": 0.04,  # reset mid-request: unknown, nothing created
    "gateway_error": 0.04,  # created, then a 502 from the proxy: unknown, found
}
"""Per create (``POST``) probabilities of each proxy fault; the rest pass."""


@dataclass
class RestDemoResult(DemoResult):
    """:class:`atmostonce_cli.demo.DemoResult` plus what the server holds: ``posts_on_server`` every post in
    json-server's collection; ``creates`` the posts carrying a delivery key; ``create_requests`` the creates
    the proxy received."""

    posts_on_server: int = 0
    platform: str = ""


def run_rest_demo(
    n: int = 100,
    workers: int = 4,
    database_url: str | None = None,
    seed: int = 1,
    fault_mix: dict[str, float] | None = None,
    crash_rate: float = 0.03,
    timeout: float = 180.0,
    progress: TextIO | None = sys.stderr,
    progress_every: float = 1.0,
    read_timeout: float = 1.0,
    delay_seconds: float = 1.5,
) -> RestDemoResult:
    """Run the job against json-server; returns a :class:`RestDemoResult`. Times are seconds.

    ``database_url``: an empty store (default: a fresh SQLite file in a temporary folder, kept for
    inspection). ``read_timeout`` replaces the profile's; ``delay_seconds`` is how long the proxy holds a
    delayed create (keep it above ``read_timeout``).

    Raises ``ValueError`` for a bad argument or a non-empty database, ``RuntimeError`` when json-server
    cannot be installed or started (the message says how to install it).
    """
    check_arguments(n, workers, crash_rate)
    tmp = Path(tempfile.mkdtemp(prefix="atmostonce-rest-demo-"))
    own_db = database_url is None
    if database_url is None:
        database_url = f"sqlite:///{tmp / 'demo.sqlite3'}"
    store = open_empty_store(database_url)
    try:
        started = time.monotonic()
        with JsonServer(tmp) as server:
            mix = fault_mix if fault_mix is not None else REST_FAULT_MIX
            result = _run(
                store, server, n, workers, seed, mix, crash_rate, timeout, progress, progress_every,
                read_timeout, delay_seconds, started,
            )  # fmt: skip
        result.database = database_url if own_db else database_url.split("@")[-1]
        return result
    finally:
        store.close()


def _run(
    store, server, n, workers, seed, mix, crash_rate, timeout, progress, progress_every, read_timeout,
    delay_seconds, started,
) -> RestDemoResult:  # fmt: skip
    from atmostonce_matrix.proxy import FaultProxy  # an HTTP/1.1 fault proxy; stdlib only

    run = uuid.uuid4().hex[:8]
    crasher = _Crasher(crash_rate, seed)
    outcomes: Counter[str] = Counter()
    olock = threading.Lock()

    def on_result(key: str, result: Any) -> None:
        if isinstance(result, str):
            name = result
        elif isinstance(result, Rejected):
            name = f"refused:{result.event}:{result.guard}"
        else:
            name = f"crash:{result}" if isinstance(result, SimulatedCrash) else type(result).__name__
        with olock:
            outcomes[name] += 1

    with FaultProxy("127.0.0.1", server.port, delay_seconds=delay_seconds) as proxy:
        profile = load_profile("json-server", base_url=proxy.url, read_timeout=read_timeout)
        config = profile.runtime_config(
            lease_seconds=2.0, send_lease_seconds=3.0, retries_per_tick=25, reconcile_interval=0.5
        )
        key_field = profile.config.key_field
        with profile.http_transport() as transport:
            proxy.set_fault_mix(mix, seed=seed, match="POST ")
            keys = [
                store.submit(f"demo-account-{i % 3}", "post", "demo-posts", {"text": f"demo post {i} of run {run}"}).key
                for i in range(n)
            ]
            stop = threading.Event()
            dispatcher = Dispatcher(store, transport, config, crash=crasher)
            threads = [
                Worker(dispatcher, lambda: store.claimable(32), stop=stop, on_result=on_result, seed=seed + i)
                for i in range(workers)
            ]
            for t in threads:
                t.start()
            sweeper, reconciler = Sweeper(store, config), Reconciler(store, transport, config)
            finished, last = False, 0.0
            while time.monotonic() - started < timeout:
                time.sleep(0.1)
                sweeper.tick()
                for name, v in reconciler.run().items():
                    with olock:
                        outcomes[f"reconcile:{name}"] += v
                counts = store.count_by_state()
                if progress is not None and time.monotonic() - last >= progress_every:
                    _progress(progress, counts, time.monotonic() - started)
                    last = time.monotonic()
                if all(counts[s] == 0 for s in OPEN_STATES):
                    finished = True
                    break
            stop.set()
            for t in threads:
                t.join(timeout=10)
            proxy.clear()
            proxy.wait_idle(timeout=delay_seconds + 10)  # a delayed create still in the proxy lands before we count
        if progress is not None:
            _progress(progress, store.count_by_state(), time.monotonic() - started, final=True)
        posts = server.posts()  # straight from json-server, not through the proxy or any transport of ours
        by_key: Counter[str] = Counter()
        for post in posts:
            platform_key = pointer_get(post, key_field)
            if isinstance(platform_key, str) and platform_key:
                by_key[split_platform_idempotency_key(platform_key)[0]] += 1
        return platform_result(
            RestDemoResult,
            store,
            keys,
            by_key,
            crasher=crasher,
            settled=Settled(outcomes, finished),
            started=started,
            create_requests=sum(1 for r in proxy.records if r.request_line.startswith("POST ")),
            faults=dict(proxy.faults),
            posts_on_server=len(posts),
            platform=f"json-server at {server.url} (through the fault proxy at {proxy.url}), profile {profile.source}",
        )


def format_rest_result(r: RestDemoResult) -> str:
    """The CLI summary: :func:`atmostonce_cli.demo.format_result` plus the server's own count (json-server's
    lookup is not fenced)."""
    return format_platform_result(
        r, [("posts json-server holds (its own collection)", r.posts_on_server), ("platform", r.platform)]
    )
