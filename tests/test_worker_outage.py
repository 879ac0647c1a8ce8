"""A worker outlives database outages (docs/design.md#the-runtime): a failed poll is reported and waited
out with a bounded, jittered backoff, and the thread goes on; a dispatch cut off by the outage is left to
the sweeper and the reconciler, so nothing is lost and nothing is sent twice.

The loop tests drive ``Worker.run()`` in the test's thread with a stop event that records each wait; the
outage test stops and starts a dedicated throwaway PostgreSQL cluster under a running worker thread."""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time

import pytest

from atmostonce import MemoryStore
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper, Worker
from atmostonce.testing.stateful import FakeClock
from tests.test_runtime_loops import Script, Stop


class FlakyKeys:
    """A ``keys()`` that raises ``failures`` times (as a store whose database is down), then answers."""

    def __init__(self, failures, keys):
        self.left, self.keys, self.calls = failures, list(keys), 0

    def __call__(self):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise ConnectionError("connection to server on socket failed: No such file or directory")
        return list(self.keys)


def test_a_worker_survives_failing_polls_and_dispatches_once_the_store_answers():
    d = Script(MemoryStore(clock=FakeClock()), {"a": ["read_back.match", "gate.paused"]})
    keys, errors, results = FlakyKeys(3, ["a"]), [], []
    stop = Stop(after_waits=4)
    w = Worker(d, keys, stop=stop, on_result=lambda k, r: results.append((k, r)), on_error=errors.append, seed=3)
    w.run()  # before: the first ConnectionError escaped run() and ended the thread
    assert [type(e) for e in errors] == [ConnectionError] * 3
    assert (w.outages, w.poll_failures) == (3, 0)  # the good poll reset the streak
    assert d.calls == ["a", "a"]
    assert results == [("a", "read_back.match"), ("a", "gate.paused")]
    backoffs, idle = stop.waits[:3], stop.waits[3:]
    ceilings = [0.05, 0.1, 0.2]  # doubling from backoff_base
    assert all(c / 2 <= b < c for b, c in zip(backoffs, ceilings, strict=True))
    assert idle == [w.idle_sleep]


def test_a_worker_backoff_is_bounded_and_jittered():
    w = Worker(Script(None, {}), lambda: [], stop=Stop(), seed=1, backoff_base=0.5, backoff_max=4.0)
    delays = [w.backoff_delay(n) for n in range(1, 200)]
    assert all(0 < x < 4.0 for x in delays)
    assert max(delays) >= 2.0  # the cap is reached, in [cap/2, cap)
    late = delays[10:]
    assert len(set(late)) == len(late)  # jittered: workers cut off together do not come back in step
    other = Worker(Script(None, {}), lambda: [], stop=Stop(), seed=2, backoff_base=0.5, backoff_max=4.0)
    assert [other.backoff_delay(n) for n in range(1, 200)][10:] != late
    with pytest.raises(ValueError):
        Worker(Script(None, {}), lambda: [], stop=Stop(), backoff_base=0)


def test_a_worker_thread_stays_alive_through_failing_polls():
    d = Script(MemoryStore(clock=FakeClock()), {"a": ["read_back.match"] + ["gate.paused"] * 10_000})
    keys, done = FlakyKeys(5, ["a"]), threading.Event()
    stop = threading.Event()
    w = Worker(
        d,
        keys,
        stop=stop,
        on_result=lambda k, r: done.set() if r == "read_back.match" else None,
        backoff_base=0.001,
        backoff_max=0.01,
    )
    w.start()
    try:
        assert done.wait(30)
        assert w.is_alive() and w.outages == 5
    finally:
        stop.set()
        w.join(30)


def test_a_failed_exhaust_is_reported_and_the_worker_goes_on():
    from atmostonce import GuardRefused

    class DownStore:
        def exhaust(self, key):
            raise ConnectionError("server closed the connection unexpectedly")

    out = GuardRefused("begin", "a" * 64, "attempts_remaining", "pending")
    d = Script(DownStore(), {"a": [out, "gate.paused"]})
    results = []
    stop = Stop(after_waits=2)
    Worker(d, lambda: ["a"], stop=stop, on_result=lambda k, r: results.append((k, type(r)))).run()
    assert results == [("a", ConnectionError), ("a", str)]


# ---------------------------------------------------------------- a real PostgreSQL, stopped and started
CONFIG = RuntimeConfig(lease_seconds=2, send_lease_seconds=2, reconcile_interval=0)


def _until(cond, timeout=90.0, what="condition"):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        threading.Event().wait(0.05)


@pytest.mark.postgres
def test_a_worker_outlives_a_postgresql_restart_and_sends_nothing_twice():
    from atmostonce_http import HttpTransport, PlatformSink, sink_config
    from atmostonce_sql import open_store
    from atmostonce_sql.pgserver import LocalCluster

    parent = tempfile.mkdtemp(prefix="atmostonce-outage-", dir="/tmp")
    os.chmod(parent, 0o755)  # the server's OS user must reach the cluster's folder
    # durable commits: an immediate stop is a crash, and with synchronous_commit off the commit of the
    # authorization itself can be lost, after which the intent looks unsent and is sent again
    cluster = LocalCluster(os.path.join(parent, "pg"), remove_on_stop=False, fsync=True).start()
    stop, errors, results = threading.Event(), [], []
    at_send, release = threading.Event(), threading.Event()
    current = {}
    store = submitter = None
    try:
        url = cluster.create_database("outage")
        store = open_store(url)
        held = store.submit("acct", "post", "room", {"text": "in flight when the database goes away"})

        def work(intent):
            current["key"] = intent.key

        def point(name):  # hold the first dispatch just after its bytes left, until the database is down
            if name == "after_send" and current.get("key") == held.key and not at_send.is_set():
                at_send.set()
                assert release.wait(60)

        with PlatformSink(dedupe=False, fenced_lookup=True) as sink:
            cfg = sink_config(sink.url, key_field="/delivery_key", lookup_fenced=True)
            with HttpTransport(cfg) as transport:
                d = Dispatcher(store, transport, CONFIG, work=work, crash=point, owner="w1")
                w = Worker(
                    d,
                    lambda: store.claimable(8),
                    stop=stop,
                    on_result=lambda k, r: results.append((k, r)),
                    on_error=errors.append,
                    seed=5,
                    backoff_base=0.05,
                    backoff_max=0.5,
                )
                w.start()
                assert at_send.wait(60)
                cluster.stop()  # the outage: the send's outcome cannot be recorded, the polls fail
                release.set()
                _until(lambda: w.outages >= 3, what="failed polls during the outage")
                assert w.is_alive()
                cluster.start()

                submitter = open_store(url, migrate=False)
                after = [submitter.submit("acct", "post", "room", {"text": f"after the restart {i}"}) for i in range(3)]
                keys = [held.key, *(a.key for a in after)]
                sweeper, reconciler = Sweeper(submitter, CONFIG), Reconciler(submitter, transport, CONFIG)

                def settled():
                    sweeper.tick()
                    reconciler.run()
                    return all(submitter.get(k).state == "published" for k in keys)

                _until(settled, what="every intent published")
                assert w.is_alive()
                assert w.poll_failures == 0
                # nothing lost, nothing sent twice: one object per intent, the held one found by lookup
                assert sink.creates == 4 and sink.creates_by_key == dict.fromkeys(keys, 1)
                # the cut-off send stays authorized, turns indeterminate at its send lease, and is settled by
                # the platform lookup, never begun again
                assert [h.event for h in submitter.history(held.key)] == [
                    "submit",
                    "begin",
                    "authorize_dispatch",
                    "expire_lease",
                    "reconcile_found",
                ]
                assert len(submitter.attempts(held.key)) == 1
                assert any(k == held.key and isinstance(r, Exception) for k, r in results)  # the cut-off record
    finally:
        stop.set()
        release.set()
        for s in (store, submitter):
            if s is not None:
                s.close()
        cluster.remove_on_stop = True
        cluster.stop()
        shutil.rmtree(parent, ignore_errors=True)
