"""Real concurrency on PostgreSQL: threads with their own connections race on one intent (docs/design.md#the-gate-is-the-conditional-write)."""

from __future__ import annotations

import threading

import pytest

from atmostonce import Rejected
from atmostonce_sql import open_store

pytestmark = pytest.mark.postgres

THREADS = 8
ROUNDS = 200


def test_exactly_one_of_eight_wins_begin_and_authorize_every_round(pg_databases):
    url = pg_databases.fresh()
    store = open_store(url, migrate=False, pool_size=THREADS)
    try:
        keys = [store.submit("acct", "post", "room", {"text": f"round {i}"}).key for i in range(ROUNDS)]
        barrier = threading.Barrier(THREADS)
        wins: list[list[str]] = [[] for _ in range(ROUNDS)]
        errors: list[BaseException] = []
        lock = threading.Lock()

        def racer(n: int) -> None:
            try:
                for r, key in enumerate(keys):
                    barrier.wait()
                    try:
                        lease = store.begin(key, lease_seconds=30)
                        store.authorize_dispatch(lease, request_digest=store.get(key).request_digest)
                        with lock:
                            wins[r].append(f"t{n}")
                    except Rejected as exc:
                        assert exc.guard in ("no_open_attempt", "source_state"), exc
            except BaseException as exc:  # surfaced below
                errors.append(exc)
                barrier.abort()

        threads = [threading.Thread(target=racer, args=(n,)) for n in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert [len(w) for w in wins] == [1] * ROUNDS
        assert store.count_by_state()["authorized"] == ROUNDS
        assert store.total_attempts() == ROUNDS
    finally:
        store.close()
        pg_databases.drop(url)


def test_two_sweepers_at_once_move_each_row_once(pg_databases):
    url = pg_databases.fresh()
    store = open_store(url, migrate=False, pool_size=4)
    try:
        from atmostonce.runtime import Sweeper
        from atmostonce_sql.testing import age_leases

        keys = [store.submit("acct", "post", "room", {"text": f"s{i}"}).key for i in range(60)]
        for k in keys:
            lease = store.begin(k, lease_seconds=10)
            store.authorize_dispatch(lease, request_digest=store.get(k).request_digest, send_lease_seconds=10)
        age_leases(store, 11)
        results = []
        barrier = threading.Barrier(2)

        def sweep():
            barrier.wait()
            results.append(Sweeper(store).sweep_leases())

        ts = [threading.Thread(target=sweep) for _ in range(2)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert sum(r["expired"] for r in results) == 60
        assert store.count_by_state()["indeterminate"] == 60
        for k in keys:
            assert [h.event for h in store.history(k)].count("expire_lease") == 1
    finally:
        store.close()
        pg_databases.drop(url)
