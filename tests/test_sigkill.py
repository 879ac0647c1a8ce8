"""Worker processes killed with SIGKILL at every step boundary never cause a second send (docs/design.md#the-runtime).

Each worker is a real OS process on a real database, sending to the real
platform sink (no dedupe) in this process. A worker kills itself with SIGKILL
at a chosen step boundary of its n-th dispatch; then a clean worker and the
maintenance passes settle everything, and the sink's create count is checked
against the intents.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from atmostonce.runtime import CRASH_POINTS, Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce_http import HttpTransport, PlatformSink, sink_config
from atmostonce_sql import open_store
from atmostonce_sql.testing import age_leases

WORKER = textwrap.dedent(
    """
    import os, signal, sys
    from atmostonce.runtime import Dispatcher, RuntimeConfig
    from atmostonce.errors import Rejected
    from atmostonce_http import HttpTransport, sink_config
    from atmostonce_sql import open_store

    url, sink_url, point, nth = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    store = open_store(url, migrate=False, pool_size=1)
    transport = HttpTransport(sink_config(sink_url, key_field="/delivery_key", lookup_fenced=True, read_timeout=1))
    seen = {"n": 0}

    def crash(p):
        if p == point and seen["n"] == nth:
            os.kill(os.getpid(), signal.SIGKILL)

    d = Dispatcher(store, transport, RuntimeConfig(lease_seconds=30, send_lease_seconds=30), crash=crash)
    for key in store.claimable(1000):
        seen["n"] += 1
        try:
            d.dispatch(key)
        except Rejected:
            pass
    sys.exit(0)
    """
)


def _run_worker(url: str, sink_url: str, point: str, nth: int) -> int:
    proc = subprocess.run([sys.executable, "-c", WORKER, url, sink_url, point, str(nth)], timeout=120)
    return proc.returncode


@pytest.mark.slow
@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_sigkill_at_every_step_boundary(request, dialect):
    dbs = request.getfixturevalue("sqlite_databases" if dialect == "sqlite" else "pg_databases")
    url = dbs.fresh()
    store = open_store(url, migrate=False)
    config = RuntimeConfig(lease_seconds=30, send_lease_seconds=30, retries_per_tick=1000, reconcile_interval=0)
    try:
        with PlatformSink(dedupe=False, fenced_lookup=True) as sink:
            keys = [store.submit("acct", "post", "room", {"text": f"k{i}"}).key for i in range(30)]
            killed = 0
            for i, point in enumerate(CRASH_POINTS):
                rc = _run_worker(url, sink.url, point, 2 + i % 3)
                assert rc == -9, f"the worker for {point} was meant to die by SIGKILL, exit {rc}"
                killed += 1
            assert _run_worker(url, sink.url, "never", 0) == 0  # a clean worker takes what is left
            with HttpTransport(sink_config(sink.url, key_field="/delivery_key", lookup_fenced=True)) as transport:
                d = Dispatcher(store, transport, config)
                for _ in range(6):
                    age_leases(store, 31)
                    Sweeper(store, config).tick()
                    Reconciler(store, transport, config).run()
                    for key in store.claimable():
                        d.dispatch(key)
            by_key = sink.creates_by_key
            states = {k: store.get(k).state for k in keys}
            assert killed == len(CRASH_POINTS)
            assert all(n == 1 for n in by_key.values()), by_key
            assert set(by_key) <= set(keys)
            published = {k for k, s in states.items() if s == "published"}
            assert published == set(by_key), "published intents and platform objects differ"
            assert sink.creates == len(published)
            assert set(states.values()) <= {"published", "parked"}
            # every killed dispatch left its mark: abandoned attempts or expired leases in history
            events = [h.event for k in keys for h in store.history(k)]
            assert events.count("abandon_attempt") >= 2 and events.count("expire_lease") >= 3
    finally:
        store.close()
        dbs.drop(url)
