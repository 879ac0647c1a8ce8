"""The audit chain under real concurrency on PostgreSQL (docs/design.md#the-audit-order-tamper-evidence-the-role-reconciliation-records).

A writer that waited on the intent's row lock must chain its history row to the row the writer it
waited for committed meanwhile: the statement's own snapshot predates that row, so the previous
hash is read by the ``BEFORE INSERT`` trigger with a fresh snapshot (migration 0002).
"""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

from atmostonce import Rejected
from atmostonce.audit import verify_store
from atmostonce_sql import open_store
from tests.helpers import to_state

pytestmark = pytest.mark.postgres

THREADS = 8
ROUNDS = 40


@pytest.fixture
def store(pg_databases):
    url = pg_databases.fresh()
    s = open_store(url, migrate=False, pool_size=THREADS)
    yield s
    s.close()
    pg_databases.drop(url)


def _wait_for_lock_waiter(store, deadline_s: float = 60.0) -> None:
    """Block until some backend of this database waits on a lock (or fail after a generous deadline)."""
    end = time.monotonic() + deadline_s
    q = sa.text("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'")
    with store.engine.connect() as conn:
        while conn.execute(q).scalar_one() == 0:
            assert time.monotonic() < end, "the second writer never waited on the row lock"
            time.sleep(0.01)
            conn.rollback()


def test_a_writer_that_waited_on_the_row_lock_chains_to_the_row_committed_meanwhile(store):
    it, _ = to_state(store, "indeterminate")
    plan = store.get(it.key).plan
    ev = store.table.event("reconcile_not_found")
    holder = store.engine.connect()
    tx = holder.begin()
    # writer A: the store's own statement for reconcile_not_found, left uncommitted (it holds the row lock)
    params = store._params(
        ev,
        it.key,
        {
            "plan_generation": plan.generation,
            "plan_reconcile_count": plan.reconcile_count,
            "plan_epoch": plan.epoch,
            "result": "unknown",
        },
        holder,
    )
    assert holder.execute(store._statements(ev)["one"], params).first() is not None
    outcome: list = []

    def writer_b():
        try:
            outcome.append(store.park(it.key, operator="bob"))
        except BaseException as exc:  # surfaced below
            outcome.append(exc)

    b = threading.Thread(target=writer_b)
    b.start()
    try:
        _wait_for_lock_waiter(store)  # B's statement (and its snapshot) started before A commits
    finally:
        tx.commit()
        holder.close()
    b.join()
    assert [getattr(x, "state", x) for x in outcome] == ["parked"]
    hist = store.history(it.key)
    assert [h.event for h in hist[-2:]] == ["reconcile_not_found", "park"]
    chain = store.audit_chain(it.key).rows
    assert chain[-1].prev_hash == chain[-2].row_hash, "B chained to a row older than the one A committed"
    assert verify_store(store).intact


def test_many_threads_moving_one_intent_leave_one_intact_chain(store):
    it, _ = to_state(store, "pending")
    barrier = threading.Barrier(THREADS - 1)
    moved = [0] * THREADS
    errors: list[BaseException] = []

    def mover(n: int) -> None:
        try:
            for _ in range(ROUNDS):
                barrier.wait()
                for op in (
                    lambda: store.park(it.key, operator=f"op{n}"),
                    lambda: store.resend(it.key, operator=f"op{n}"),
                ):
                    try:
                        op()
                        moved[n] += 1
                    except Rejected as exc:
                        assert exc.guard in ("source_state", "lost_race"), exc
        except BaseException as exc:  # surfaced below
            errors.append(exc)
            barrier.abort()

    done = threading.Event()
    live_reports: list = []

    def verifier() -> None:  # audit verify on a live database must not report breaks that are not there
        while not done.is_set():
            live_reports.append(verify_store(store, [it.key]))

    threads = [threading.Thread(target=mover, args=(n,)) for n in range(THREADS - 1)]
    watch = threading.Thread(target=verifier)
    watch.start()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    done.set()
    watch.join()
    assert errors == []
    assert live_reports and all(r.intact for r in live_reports), [r.breaks for r in live_reports if not r.intact][:1]
    hist = store.history(it.key)
    assert len(hist) == 1 + sum(moved) and sum(moved) >= 2 * ROUNDS
    report = verify_store(store, [it.key])
    assert report.intact, report.breaks
    chain = store.audit_chain(it.key)
    assert chain.recorded_rows == len(hist)
    # the chain runs in sequence order, and each move follows from the state the one before left
    assert all(a.to_state == b.from_state for a, b in zip(hist, hist[1:], strict=False))


def test_control_a_previous_hash_read_with_the_statements_snapshot_breaks_that_chain(store):
    """The same interleaving with the trigger declared STABLE (it then reads with the calling
    statement's snapshot, as a read inside the CTE statement would): B links to the row before A's."""
    with store.engine.begin() as conn:
        src = conn.exec_driver_sql("SELECT pg_get_functiondef('aom_history_chain'::regproc)").scalar_one()
        conn.exec_driver_sql(src.replace("LANGUAGE plpgsql", "LANGUAGE plpgsql STABLE"))
    with pytest.raises(AssertionError, match="B chained to a row older"):
        test_a_writer_that_waited_on_the_row_lock_chains_to_the_row_committed_meanwhile(store)
    [b] = verify_store(store).breaks
    assert b.reason == "link"


_HISTORY_INSERT = (
    "INSERT INTO aom_history (key, event, actor, from_state, to_state, detail, recorded_at, prev_hash, row_hash) "
    "SELECT key, 'begin', 'test', state, state, '{}'::jsonb, 1.0, :prev, :row FROM aom_intents WHERE key = :key "
    "RETURNING seq, prev_hash, row_hash"
)


def test_a_history_row_hash_given_by_a_writer_is_refused(store):
    """The row hash is the database's to compute: a writer that puts any value there but the empty marker
    (which means "the predecessor is given") is refused, and nothing is written (migration 0016)."""
    import psycopg

    it, _ = to_state(store, "pending")
    before = len(store.history(it.key))
    with pytest.raises(sa.exc.IntegrityError) as err, store.engine.begin() as conn:
        conn.execute(sa.text(_HISTORY_INSERT), {"prev": None, "row": "0" * 64, "key": it.key})
    assert isinstance(err.value.orig, psycopg.errors.IntegrityConstraintViolation)
    assert len(store.history(it.key)) == before
    assert verify_store(store).breaks == ()


def test_a_predecessor_given_by_a_statement_is_hashed_as_given_and_a_wrong_one_is_caught_by_the_audit(store):
    """With the empty marker, the trigger takes the statement's ``prev_hash`` instead of reading the chain
    (the hot path's statements give the row they wrote just before), and still computes ``row_hash`` over
    the row as stored. The link is what the writer is trusted with: a wrong one is found by the audit."""
    from atmostonce.audit import history_hash

    it, _ = to_state(store, "pending")
    with store.engine.begin() as conn:
        seq, prev, row = conn.execute(sa.text(_HISTORY_INSERT), {"prev": "f" * 64, "row": "", "key": it.key}).one()
        key, event, actor, from_state, to_state_, token, gen, detail, at = conn.execute(
            sa.text(
                "SELECT key, event, actor, from_state, to_state, attempt_token, generation, detail::text, "
                "recorded_at FROM aom_history WHERE seq = :seq"
            ),
            {"seq": seq},
        ).one()
    assert prev == "f" * 64
    assert row == history_hash(prev, seq, key, event, actor, from_state, to_state_, token, gen, detail, at)
    assert [(b.key, b.seq, b.reason) for b in verify_store(store).breaks if b.reason == "link"] == [
        (it.key, seq, "link")
    ]


def test_publish_chains_its_rows_to_each_other_and_to_the_rows_before(store):
    """The creating statement gives each history row its predecessor (none for the creation) and the outcome
    statement gives its second row the first's: a published intent's chain verifies end to end, and so does
    one whose send definitely failed (its outcome a single move, chained by the trigger)."""
    from atmostonce.runtime import Dispatcher
    from tests.test_fused_dispatch import CONFIG, Platform

    sent, outcome = Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "chained"})
    assert outcome == "read_back.match"
    failed, _ = Dispatcher(store, Platform(answer="not_sent"), CONFIG).publish("acct", "post", "room-2", {"text": "x"})
    assert [r.event for r in store.history(sent)] == [
        "submit",
        "begin",
        "authorize_dispatch",
        "record_success",
        "confirm_read_back",
    ]
    assert store.get(failed).state == "failed"
    assert verify_store(store).breaks == ()
