"""Processes racing for one target's dispatch claim on a real PostgreSQL (docs/design.md#approvals-and-per-target-dispatch-claims): two approved drafts on
one target, each pushed by its own process with its own connections; exactly one is sent every round."""

from __future__ import annotations

import multiprocessing as mp

import pytest

pytestmark = pytest.mark.postgres

ROUNDS = 12


def _race(url: str, key: str, approval_id: str, digest: str, start, out) -> None:
    from atmostonce import Rejected
    from atmostonce_sql import open_store

    store = open_store(url, migrate=False, pool_size=2)
    try:
        start.wait(30)
        try:
            claim = store.reserve_claim(
                key, approval_id=approval_id, request_digest=digest, owner=mp.current_process().name
            )
            lease = store.begin(key, lease_seconds=30)
            store.authorize_dispatch(lease, request_digest=digest, claim=claim)
            out.put(("sent", key))
        except Rejected as exc:
            out.put(("refused", exc.guard))
    except BaseException as exc:  # surfaced to the parent
        out.put(("error", repr(exc)))
    finally:
        store.close()


def test_two_approved_drafts_on_one_target_exactly_one_is_sent(pg_databases):
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    store = open_store(url, migrate=False)
    ctx = mp.get_context("spawn")
    try:
        for r in range(ROUNDS):
            target = f"room-{r}"
            drafts = [
                store.submit("acct", "post", target, {"text": f"{r}/{i}"}, requires_approval=True) for i in (0, 1)
            ]
            apvs = [store.approve(d.key, approver="alice", expires_in=600) for d in drafts]
            start, out = ctx.Barrier(2), ctx.Queue()
            procs = [
                ctx.Process(target=_race, args=(url, d.key, a.approval_id, d.request_digest, start, out))
                for d, a in zip(drafts, apvs, strict=True)
            ]
            for p in procs:
                p.start()
            results = [out.get(timeout=120) for _ in procs]
            for p in procs:
                p.join(60)
            assert not [x for x in results if x[0] == "error"], results
            assert sorted(x[0] for x in results) == ["refused", "sent"], results
            states = sorted(store.get(d.key).state for d in drafts)
            assert states == ["authorized", "pending"]
            assert store.claim(target).state == "sending"
            assert sorted(store.approval(a.approval_id).state for a in apvs) == ["approved", "consumed"]
            assert sum(len(store.attempts(d.key)) for d in drafts) == 1  # the loser began nothing
    finally:
        store.close()
        pg_databases.drop(url)
