"""The sweeper's batch against real concurrent writers (docs/design.md#the-sweeper-moves-a-batch-per-statement):
threads with their own connections race a batch on the same leases, on SQLite and PostgreSQL. Whoever wins, each
send leaves ``authorized`` once (by the worker's outcome or by the sweeper's expiry, never both), an expired send
goes to ``indeterminate`` and never back to ``pending``, each move has exactly its history row and attempt outcome,
and every chain verifies."""

from __future__ import annotations

import random
import threading

import pytest

from atmostonce import Rejected
from atmostonce.audit import verify_store
from atmostonce.errors import SOURCE_STATE
from atmostonce.names import ACTOR, EVENT, GUARD, OUTCOME, STATE
from atmostonce.runtime import RuntimeConfig, Sweeper
from atmostonce_sql import open_store
from tests.helpers import submit, to_state
from tests.test_sweeper_batch import due_group

CONFIG = RuntimeConfig(sweep_batch=1000)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def racing_store(request):
    """A SQL store whose pool gives each racing thread its own connection."""
    dbs = request.getfixturevalue("sqlite_databases" if request.param == "sqlite" else "pg_databases")
    url = dbs.fresh()
    store = open_store(url, migrate=False, pool_size=8)
    yield store
    store.close()
    dbs.drop(url)


def run_together(*fns):
    """Run ``fns`` in threads released together; re-raise the first error any of them hit."""
    barrier = threading.Barrier(len(fns))
    errors: list[BaseException] = []
    results: list = [None] * len(fns)

    def body(i, fn):
        try:
            barrier.wait()
            results[i] = fn()
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=body, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return results


def moves_out_of_authorized(store, key: str) -> list[str]:
    return [h.event for h in store.history(key) if h.from_state == STATE.authorized and h.to_state != STATE.authorized]


# the worker's outcome of a send whose lease lapsed while the platform answered, one per kind
OUTCOMES = {
    EVENT.record_success: lambda s, lease: s.record_success(lease, remote_id="r-1"),
    EVENT.record_unknown: lambda s, lease: s.record_unknown(lease, reason="read timeout"),
    EVENT.record_not_sent: lambda s, lease: s.record_not_sent(lease, reason="connect refused"),
    EVENT.confirm_read_back: lambda s, lease: s.record_sent(lease, remote_id="r-1", read_back=OUTCOME.read_back_match),
}


def test_a_worker_recording_its_outcome_while_a_sweeper_batch_expires_the_lease_settles_each_send_once(racing_store):
    store = racing_store
    from atmostonce_sql.testing import age_leases

    rng = random.Random(7)
    kinds = list(OUTCOMES)
    for r in range(12):
        sends = [to_state(store, STATE.authorized, text=f"round {r} send {i}") for i in range(12)]
        age_leases(store, 3600)  # every send lease lapsed while the platform answered
        chosen = {it.key: kinds[i % len(kinds)] for i, (it, _) in enumerate(sends)}
        order = list(sends)
        rng.shuffle(order)
        refused: dict[str, Rejected] = {}

        def worker(order=order, chosen=chosen, refused=refused):
            for it, lease in order:
                try:
                    OUTCOMES[chosen[it.key]](store, lease)
                except Rejected as exc:
                    refused[it.key] = exc

        _, swept = run_together(worker, lambda: Sweeper(store, CONFIG).sweep_leases())
        assert swept["expired"] + swept["skipped"] <= len(sends)
        for it, _ in sends:
            now = store.get(it.key)
            out = moves_out_of_authorized(store, it.key)
            assert len(out) == 1, (chosen[it.key], out)  # left authorized once, by one writer
            assert now.state != STATE.pending  # an authorized send is never made not-sent by the sweeper
            swept_it = out == [EVENT.expire_lease]
            worker_moved = [h for h in store.history(it.key) if h.actor == ACTOR.worker and h.event == chosen[it.key]]
            if swept_it:
                assert now.state == STATE.indeterminate
                if chosen[it.key] != EVENT.record_success:  # record_success may land before the expiry, both legal
                    assert not worker_moved and it.key in refused
                    lost = refused[it.key]
                    assert lost.guard in (SOURCE_STATE, GUARD.lease_holder), lost
            else:
                assert it.key not in refused and out[0] in (chosen[it.key], EVENT.confirm_read_back)
            (attempt,) = store.attempts(it.key)
            assert len(attempt.outcomes) == 1, attempt.outcomes
            sweeper_rows = [h for h in store.history(it.key) if h.actor == ACTOR.sweeper]
            assert len(sweeper_rows) == (1 if swept_it else 0)
    assert verify_store(store).intact


def test_two_sweepers_batching_the_same_due_leases_in_opposite_orders_move_each_row_once(racing_store):
    """Two batches over the same 200 leases, one in reverse order: on PostgreSQL their row locks meet in
    opposite orders (a deadlock, rolled back and run again); either way each row moves once."""
    store = racing_store
    from atmostonce_sql.testing import age_leases

    due_group(store, "race", sent=100, begun=100)
    age_leases(store, 60)
    listed = store.due_leases(1000)
    assert len(listed) == 200
    moves = [(EVENT.expire_lease if it.state == STATE.authorized else EVENT.abandon_attempt, it) for it in listed]
    a, b = run_together(lambda: store.expire_leases(moves), lambda: store.expire_leases(moves[::-1]))
    b = b[::-1]
    for (_, it), x, y in zip(moves, a, b, strict=True):
        won = [r for r in (x, y) if not isinstance(r, Rejected)]
        assert len(won) == 1, (it.key, x, y)
        lost = x if isinstance(x, Rejected) else y
        assert lost.guard in (SOURCE_STATE, GUARD.lease_holder), lost
        sweeper_rows = [h for h in store.history(it.key) if h.actor == ACTOR.sweeper]
        assert len(sweeper_rows) == 1
        (attempt,) = store.attempts(it.key)
        assert len(attempt.outcomes) == 1
        assert store.get(it.key).state == (STATE.indeterminate if it.state == STATE.authorized else STATE.pending)
    assert verify_store(store).intact


def test_four_sweeper_ticks_at_once_over_the_same_due_leases_move_each_row_once(racing_store):
    store = racing_store
    from atmostonce_sql.testing import age_leases

    keys = [to_state(store, STATE.authorized, text=f"sent {i}")[0].key for i in range(120)]
    age_leases(store, 60)
    ticks = run_together(*[lambda: Sweeper(store, CONFIG).sweep_leases() for _ in range(4)])
    assert sum(t["expired"] for t in ticks) == 120
    for k in keys:
        assert [h.actor for h in store.history(k)].count(ACTOR.sweeper) == 1
        assert store.get(k).state == STATE.indeterminate
    assert verify_store(store).intact


def test_four_sweepers_batching_the_same_due_leases_in_different_orders_neither_deadlock_out_nor_move_twice(
    racing_store,
):
    """Four batches over the same 200 leases, each listed in its own order (sweepers whose listings differ): the
    batch locks its rows in key order whatever order it was given, so no wait cycle forms and no tick fails with
    ``Deadlock``; each row moves once, and the other three batches refuse it by its guard."""
    store = racing_store
    from atmostonce_sql.testing import age_leases

    for r in range(3):
        for i in range(200):
            it = submit(store, text=f"round {r} begun {i}")
            store.begin(it.key, lease_seconds=10)
        age_leases(store, 60)
        listed = store.due_leases(1000)
        assert len(listed) == 200
        orders = []
        for t in range(4):
            mv = [(EVENT.abandon_attempt, it) for it in listed]
            random.Random(100 * r + t).shuffle(mv)
            orders.append(mv)
        results = run_together(*[lambda mv=mv: store.expire_leases(mv) for mv in orders])
        won: dict[str, int] = {}
        for mv, got in zip(orders, results, strict=True):
            for (_, it), res in zip(mv, got, strict=True):
                if isinstance(res, Rejected):
                    assert res.guard == GUARD.lease_holder, res
                else:
                    won[it.key] = won.get(it.key, 0) + 1
        assert won == {it.key: 1 for it in listed}
        for it in listed[::20]:
            assert [h.actor for h in store.history(it.key)].count(ACTOR.sweeper) == 1
            (attempt,) = store.attempts(it.key)
            assert len(attempt.outcomes) == 1
    assert verify_store(store).intact


def gated_in_flight(store, text: str, target: str):
    """An approval-gated send authorized under its target's claim (the claim ``sending``)."""
    it = store.submit("acct", "post", target, {"text": text}, requires_approval=True)
    apv = store.approve(it.key, approver="alice", expires_in=3600)
    claim = store.reserve_claim(it.key, approval_id=apv.approval_id, request_digest=it.request_digest, owner="w1")
    lease = store.begin(it.key, lease_seconds=30)
    store.authorize_dispatch(lease, request_digest=it.request_digest, send_lease_seconds=30, claim=claim)
    return it, lease


def test_a_worker_settling_a_gated_send_while_the_sweeper_batch_expires_it_moves_intent_and_claim_once(racing_store):
    store = racing_store
    from atmostonce_sql.testing import age_leases

    settle = {
        EVENT.record_unknown: (lambda s, lease: s.record_unknown(lease, reason="read timeout"), "uncertain"),
        EVENT.record_not_sent: (lambda s, lease: s.record_not_sent(lease, reason="connect refused"), "free"),
    }
    kinds = list(settle)
    for r in range(6):
        sends = [gated_in_flight(store, f"round {r} gated {i}", f"room-{r}-{i}") for i in range(6)]
        plain = [to_state(store, STATE.authorized, text=f"round {r} plain {i}") for i in range(4)]
        age_leases(store, 3600)
        chosen = {it.key: kinds[i % 2] for i, (it, _) in enumerate(sends)}

        def worker(sends=sends, chosen=chosen):
            for it, lease in reversed(sends):
                try:
                    settle[chosen[it.key]][0](store, lease)
                except Rejected as exc:
                    assert exc.guard in (SOURCE_STATE, GUARD.lease_holder), exc

        _, swept = run_together(worker, lambda: Sweeper(store, CONFIG).sweep_leases())
        assert swept["expired"] >= len(plain)
        for it, _ in sends:
            out = moves_out_of_authorized(store, it.key)
            assert len(out) == 1, out
            claim = store.claim(it.target)
            if out == [EVENT.expire_lease]:
                assert store.get(it.key).state == STATE.indeterminate and claim.state == "uncertain"
            else:
                assert out == [chosen[it.key]] and claim.state == settle[chosen[it.key]][1]
            after_send = [e.event for e in store.claim_history(it.target)][-1]
            assert [e.event for e in store.claim_history(it.target)].count(after_send) == 1
            (attempt,) = store.attempts(it.key)
            assert len(attempt.outcomes) == 1
        for it, _ in plain:
            assert store.get(it.key).state == STATE.indeterminate
    assert verify_store(store).intact
