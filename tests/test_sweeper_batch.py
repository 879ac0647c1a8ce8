"""The sweeper moves a batch of due leases per statement, under the same per-row guards as its single moves
(docs/design.md#the-sweeper-moves-a-batch-per-statement): on every store the batch writes what the one-at-a-time
moves write (states, history rows and their chain, attempt outcomes, reconciliation records), a row that changed
between the listing and the batch is refused on its own, named by its guard, and on the SQL stores one ``UPDATE``
moves the whole batch."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from atmostonce import GuardRefused, IllegalMove, IntakeError, Rejected
from atmostonce.audit import verify_store
from atmostonce.errors import SOURCE_STATE
from atmostonce.names import ACTOR, EVENT, GUARD, STATE
from atmostonce.runtime import Dispatcher, RuntimeConfig, Sweeper
from tests.helpers import submit, to_state

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)


def sweeper_event(store, it) -> str:
    (ev,) = [e.name for e in store.table.events.values() if e.actor == ACTOR.sweeper and it.state in e.sources]
    return ev


def due_group(store, prefix: str, sent: int = 2, begun: int = 2) -> list[str]:
    """``sent`` authorized sends, then ``begun`` begun, not yet authorized attempts: the sweeper's two moves."""
    keys = [to_state(store, STATE.authorized, text=f"{prefix} sent {i}")[0].key for i in range(sent)]
    for i in range(begun):
        it = submit(store, text=f"{prefix} begun {i}")
        store.begin(it.key, lease_seconds=10)
        keys.append(it.key)
    return keys


def shape(store, key: str) -> dict:
    """What a sweeper move leaves of an intent, with its attempt tokens and sequence numbers replaced by what
    they point to (the attempt's number, the history row's event), so two intents can be compared."""
    it = store.get(key)
    attempts = store.attempts(key)
    number = {a.attempt_token: a.number for a in attempts}
    gen = {a.generation: a.number for a in attempts}
    history = store.history(key)
    event_at = {h.seq: h.event for h in history}
    return {
        "intent": (it.state, it.attempt_count, it.attempt_token, it.lease_expires_at, it.remote_id),
        "history": [
            (h.event, h.actor, h.from_state, h.to_state, number.get(h.attempt_token), gen.get(h.generation), h.detail)
            for h in history
        ],
        "attempts": [(a.number, a.outcomes) for a in attempts],
        "reconciliations": [(r.result, r.event, event_at.get(r.send_seq)) for r in store.reconciliations(key)],
        "refusals": [(r.event, r.guard) for r in store.refusals(key)],
    }


def test_a_batch_of_mixed_due_leases_moves_each_as_the_one_at_a_time_moves_would(any_store):
    store = any_store.store
    single, batched = due_group(store, "one"), due_group(store, "many")
    any_store.advance(60)
    for key in single:
        it = store.get(key)
        getattr(store, sweeper_event(store, it))(it)
    snapshots = [store.get(k) for k in batched]
    moved = store.expire_leases([(sweeper_event(store, it), it) for it in snapshots])
    assert [m.key for m in moved] == batched and not any(isinstance(m, Rejected) for m in moved)
    assert [m.state for m in moved] == [STATE.indeterminate] * 2 + [STATE.pending] * 2
    for a, b in zip(single, batched, strict=True):
        assert shape(store, b) == shape(store, a)
    assert [h.event for h in store.history(batched[0])][-1] == EVENT.expire_lease
    assert [h.event for h in store.history(batched[2])][-1] == EVENT.abandon_attempt
    assert verify_store(store).intact


def test_a_row_changed_between_the_listing_and_the_batch_is_refused_by_its_guard_and_alone(any_store):
    store = any_store.store
    moves_on, settled = due_group(store, "on"), to_state(store, STATE.authorized, text="settled")
    renewed = submit(store, text="renewed").key
    store.begin(renewed, lease_seconds=10)
    any_store.advance(60)
    listed = {i.key: i for i in store.due_leases(1000)}
    # between the listing and the batch: a worker settles its send, another sweeper frees an attempt and a
    # worker begins a new one on it
    store.record_not_sent(settled[1], reason="connect refused")
    store.abandon_attempt(listed[renewed])
    store.begin(renewed, lease_seconds=600)
    live = store.get(renewed)  # a lease that has not lapsed, presented by its own holder
    snapshots = [listed[k] for k in (*moves_on, settled[0].key, renewed)] + [live]
    results = store.expire_leases([(sweeper_event(store, s), s) for s in snapshots])
    *moved, was_settled, stale, not_due = results
    assert [m.state for m in moved] == [STATE.indeterminate] * 2 + [STATE.pending] * 2
    assert isinstance(was_settled, IllegalMove) and (was_settled.event, was_settled.guard) == (
        EVENT.expire_lease,
        SOURCE_STATE,
    )
    assert isinstance(stale, GuardRefused) and (stale.event, stale.guard) == (EVENT.abandon_attempt, GUARD.lease_holder)
    assert isinstance(not_due, GuardRefused) and not_due.guard == GUARD.lease_expired
    # the refused rows are as the concurrent writers left them; the stale lease's refusal is recorded as the
    # single move records it, pointing at the move that superseded it: the begin of the newer generation
    assert store.get(settled[0].key).state == STATE.failed
    now = store.get(renewed)
    assert (now.attempt_token, now.attempt_count) == (live.attempt_token, 2)
    (refusal,) = store.refusals(renewed)
    assert (refusal.event, refusal.guard, refusal.presented["attempt_token"]) == (
        EVENT.abandon_attempt,
        GUARD.lease_holder,
        listed[renewed].attempt_token,
    )
    begins = [h.seq for h in store.history(renewed) if h.event == EVENT.begin]
    assert refusal.superseded_by_seq == begins[-1]
    assert verify_store(store).intact


def test_a_key_listed_twice_is_moved_once_and_its_second_move_refused(any_store):
    store = any_store.store
    (key, *_rest) = due_group(store, "twice")
    any_store.advance(60)
    it = store.get(key)
    first, second = store.expire_leases([(EVENT.expire_lease, it), (EVENT.expire_lease, it)])
    assert first.state == STATE.indeterminate
    assert isinstance(second, IllegalMove) and second.guard == SOURCE_STATE
    assert [h.event for h in store.history(key)].count(EVENT.expire_lease) == 1


def test_the_batch_takes_only_the_sweepers_moves(any_store):
    store = any_store.store
    it, _ = to_state(store, STATE.authorized)
    with pytest.raises(IntakeError):
        store.expire_leases([(EVENT.record_unknown, it)])
    with pytest.raises(IntakeError):
        store.expire_leases([(EVENT.expire_lease, it.key)])
    assert store.expire_leases([]) == []
    assert store.get(it.key).state == STATE.authorized


def test_an_approval_gated_send_in_the_batch_expires_with_its_claim(any_store):
    from tests.test_fused_dispatch import Platform

    store = any_store.store
    plain = due_group(store, "beside")
    gated = store.submit("acct", "post", "room-gated", {"text": "approved"}, requires_approval=True)
    store.approve(gated.key, approver="alice", expires_in=600)
    counts = []

    class Slow(Platform):
        def send(self, wire):  # the send lease lapses while the platform answers
            any_store.advance(60)
            counts.append(Sweeper(store, CONFIG).sweep_leases())
            return super().send(wire)

    with pytest.raises(Rejected):
        Dispatcher(store, Slow(), CONFIG).dispatch(gated.key)
    assert counts == [{"expired": 3, "abandoned": 2, "skipped": 0}]
    assert store.get(gated.key).state == STATE.indeterminate
    assert store.claim("room-gated").state == "uncertain"
    assert [store.get(k).state for k in plain] == [STATE.indeterminate] * 2 + [STATE.pending] * 2


# ---------------------------------------------------------------- one UPDATE per batch, not per row
@pytest.fixture
def statements(sql_store):
    """Every statement sent on the store's connections, as ``(sql, executemany)``: the batch's statements go
    through SQLAlchemy, so its cursor event sees each one (an executemany once)."""
    sent: list[tuple[str, bool]] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append((statement, executemany))

    sa.event.listen(sql_store.engine, "before_cursor_execute", record)
    yield sql_store, sent
    sa.event.remove(sql_store.engine, "before_cursor_execute", record)


def test_one_update_moves_a_whole_batch_of_each_sweeper_move(statements):
    store, sent = statements
    keys = due_group(store, "one update", sent=5, begun=4)
    from atmostonce_sql.testing import age_leases

    age_leases(store, 60)
    sent.clear()
    assert Sweeper(store, CONFIG).sweep_leases() == {"expired": 5, "abandoned": 4, "skipped": 0}
    updates = [q for q, _ in sent if q.lstrip().upper().startswith("UPDATE AOM_INTENTS")]
    assert len(updates) == 2  # one per event: expire_lease's batch and abandon_attempt's
    assert all("b.key" in q or 'b."key"' in q for q in updates)
    history_inserts = [many for q, many in sent if "INSERT INTO aom_history" in q]
    assert history_inserts and all(history_inserts)  # one executemany per statement, not one call per row
    assert len(history_inserts) == 2
    assert [store.get(k).state for k in keys] == [STATE.indeterminate] * 5 + [STATE.pending] * 4
    assert not any("g_0" in q for q, _ in sent)  # nothing refused: no diagnosis ran


def test_a_batch_rolled_back_by_a_deadlock_is_run_again_and_moves_each_row_once(sql_store, monkeypatch):
    from atmostonce_sql.execution import Deadlock
    from atmostonce_sql.testing import age_leases

    keys = due_group(sql_store, "deadlock")
    age_leases(sql_store, 60)
    run = sql_store._batch_in
    victims = []

    def once_a_victim(conn, *a):
        if not victims:  # PostgreSQL broke a wait cycle: this transaction wrote nothing
            victims.append(True)
            raise Deadlock("deadlock detected")
        return run(conn, *a)

    monkeypatch.setattr(sql_store, "_batch_in", once_a_victim)
    assert Sweeper(sql_store, CONFIG).sweep_leases() == {"expired": 2, "abandoned": 2, "skipped": 0}
    assert victims == [True]
    for k in keys:
        assert [h.event for h in sql_store.history(k)][-1] in (EVENT.expire_lease, EVENT.abandon_attempt)
        assert len([h for h in sql_store.history(k) if h.actor == ACTOR.sweeper]) == 1


# ---------------------------------------------------------------- edges of a batch
def test_an_unknown_key_in_the_batch_is_refused_alone_and_the_rest_move(any_store):
    import dataclasses

    store = any_store.store
    keys = due_group(store, "beside unknown")
    any_store.advance(60)
    snapshots = [store.get(k) for k in keys]
    ghost = dataclasses.replace(snapshots[0], key="0" * 64)  # a key no intent has (deleted, or never made)
    results = store.expire_leases([(sweeper_event(store, s), s) for s in [ghost, *snapshots]])
    unknown, *moved = results
    assert isinstance(unknown, Rejected) and (unknown.event, unknown.guard) == (EVENT.expire_lease, "intent_exists")
    assert [m.state for m in moved] == [STATE.indeterminate] * 2 + [STATE.pending] * 2
    assert verify_store(store).intact


def test_a_batch_that_fails_after_its_update_and_before_its_appends_writes_nothing(any_store, monkeypatch):
    """A crash (an exception from the database or the process) part way through the batch: nothing it moved
    stays moved, on every store, so no moved row is left without its history row."""
    store = any_store.store
    keys = due_group(store, "crash")
    any_store.advance(60)
    before = {k: shape(store, k) for k in keys}
    snapshots = [store.get(k) for k in keys]

    class Crash(Exception):
        pass

    if any_store.kind == "memory":
        appended = store._append_history
        calls = []

        def append_then_crash(entry):
            calls.append(entry)
            if len(calls) == 2:  # the first row of the batch is moved and recorded, the second is not
                raise Crash
            appended(entry)

        monkeypatch.setattr(store, "_append_history", append_then_crash)
    else:

        def crash_on_history(conn, cursor, statement, parameters, context, executemany):
            if executemany and "INSERT INTO aom_history" in statement:
                raise Crash

        sa.event.listen(store.engine, "before_cursor_execute", crash_on_history)
    try:
        with pytest.raises(Crash):
            store.expire_leases([(sweeper_event(store, s), s) for s in snapshots])
    finally:
        if any_store.kind != "memory":
            sa.event.remove(store.engine, "before_cursor_execute", crash_on_history)
    monkeypatch.undo()
    assert {k: shape(store, k) for k in keys} == before
    assert [store.get(k).state for k in keys] == [STATE.authorized] * 2 + [STATE.pending] * 2
    assert verify_store(store).intact
    # the next tick moves them, once each
    assert Sweeper(store, CONFIG).sweep_leases() == {"expired": 2, "abandoned": 2, "skipped": 0}


@pytest.mark.slow
def test_a_batch_of_five_thousand_due_leases_moves_each_once(sql_store):
    from atmostonce_sql.testing import age_leases

    store = sql_store
    keys = []
    for i in range(5000):
        it = submit(store, text=f"begun {i}")
        store.begin(it.key, lease_seconds=10)
        keys.append(it.key)
    age_leases(store, 60)
    listed = store.due_leases(10_000)
    assert len(listed) == 5000
    results = store.expire_leases([(EVENT.abandon_attempt, it) for it in listed])
    assert not any(isinstance(r, Rejected) for r in results)
    assert store.due_leases(10) == []
    again = store.expire_leases([(EVENT.abandon_attempt, it) for it in listed[:50]])
    assert all(isinstance(r, GuardRefused) and r.guard == GUARD.lease_holder for r in again)
    for k in keys[::500]:
        assert [h.actor for h in store.history(k)].count(ACTOR.sweeper) == 1
        (attempt,) = store.attempts(k)
        assert len(attempt.outcomes) == 1
