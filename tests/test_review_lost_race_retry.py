"""Review of the SQL stores' second try after a ``lost_race`` (``SqlStore._once_more``, in ``_apply`` and
``_apply_sequence``): a write refused while the diagnosis after it finds every guard passing is tried once more,
and only a second such miss is raised as ``lost_race`` (docs/design.md#the-gate-is-the-conditional-write).

What these tests hold the retry to: it runs on every path a move or a sequence of moves can take (the transaction,
PostgreSQL's autocommit statement, its pipelined and fused moves, the coupled form of an approval-gated intent, the
async store); a first try's writes are rolled back before the second (one history row, one attempt, one claim move);
a real refusal is still named by its guard after a retry (a stale lease stays refused by ``lease_holder``, and is
recorded once); a named refusal, an unknown intent or a ``StoreError`` is never tried again; a sequence refused after
its retry names the move that refused. Database clocks are moved between a write and its diagnosis as
tests/test_diagnosis_clock_edge.py does; nothing here waits on the wall clock.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import pytest

import atmostonce_sql
from atmostonce import GuardRefused, IllegalMove, Rejected
from atmostonce.errors import LOST_RACE, SOURCE_STATE, StoreError, UnknownIntent
from atmostonce.names import EVENT, STATE
from atmostonce_sql.execution import TEXT_WINDOW_CONSTRAINT, ConstraintRefused, Deadlock
from atmostonce_sql.store import SqlStore
from tests.conftest import MOVING_CLOCK_START

T0 = MOVING_CLOCK_START
WINDOW = 86_400  # the table's duplicate-text window
LEASE = 30.0


def _diagnoses(monkeypatch, store, *, first=None):
    """Record every diagnosis (event name, coupled); ``first(self, args, kwargs)`` runs before the first one
    and may return a refusal to report instead of the real diagnosis (a race the test stages)."""
    real = type(store)._diagnose
    seen: list[tuple[str, bool]] = []

    def diagnose(self, conn, ev, key, params, coupled=False):
        seen.append((ev.name, coupled))
        if first is not None and len(seen) == 1:
            staged = first(self, ev, key)
            if staged is not None:
                return staged
        return real(self, conn, ev, key, params, coupled=coupled)

    monkeypatch.setattr(type(store), "_diagnose", diagnose)
    return seen


def _race(self, ev, key):
    return Rejected(ev.name, key, LOST_RACE, "pending", "staged by the test")


def _window_race(store, set_clock, monkeypatch, first=None):
    """An intent of the account's text authorized at ``T0`` (its slot closes the window until ``T0 + WINDOW``),
    then another of the same text submitted half a second inside the window. Returns that intent and the list of
    diagnoses (:func:`_diagnoses`); the first diagnosis runs ``first``, by default moving the clock past the
    window's edge."""
    earlier = store.submit("acct", "post", "room-1", {"text": "same text"})
    lease = store.begin(earlier.key, lease_seconds=LEASE)
    store.authorize_dispatch(lease, request_digest=earlier.request_digest)
    set_clock(T0 + WINDOW - 0.5)
    second = store.submit("acct", "post", "room-2", {"text": "same text"})

    def crosses_the_edge(self, ev, key):
        set_clock(T0 + WINDOW + 0.5)
        return None

    return second, _diagnoses(monkeypatch, store, first=first or crosses_the_edge)


def _lapsing_lease(store, set_clock, monkeypatch):
    """An intent begun at ``T0`` whose lease is still live half a second before it lapses; the first diagnosis
    moves the clock past the lapse. Returns the intent, its lease, the row as read then, and the diagnoses."""
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease = store.begin(it.key, lease_seconds=LEASE)
    set_clock(T0 + LEASE - 0.5)
    snapshot = store.get(it.key)

    def lapses(self, ev, key):
        set_clock(T0 + LEASE + 0.5)
        return None

    return it, lease, snapshot, _diagnoses(monkeypatch, store, first=lapses)


def _first_write_misses(monkeypatch, event, in_transaction=False):
    """Make the first write of ``event`` miss for real (it presents a superseded generation); with
    ``in_transaction``, only the builds of the transaction path count. Returns the list of builds counted."""
    real_params = SqlStore._params
    built: list[str] = []

    def params(self, ev, key, args, conn, prefix="p_"):
        out = real_params(self, ev, key, args, conn, prefix)
        if ev.name == event and (conn is not None or not in_transaction):
            built.append(ev.name)
            if len(built) == 1:
                out[f"{prefix}generation"] = -1
        return out

    monkeypatch.setattr(SqlStore, "_params", params)
    return built


def _events(store, key):
    return [h.event for h in store.history(key)]


# ------------------------------------------------------------------ a retried move writes once
def test_a_retried_begin_and_authorize_leaves_one_begin_one_authorization_and_one_attempt(
    moving_clock_store, monkeypatch
):
    """PostgreSQL: the fused statement is refused inside the window, the transaction path's authorization is
    refused and diagnosed after the edge; SQLite: the transaction path alone. Either way the first try's begin
    (and its attempt row, its generation) is rolled back, and the second try's moves are the only ones."""
    store, set_clock = moving_clock_store
    second, seen = _window_race(store, set_clock, monkeypatch)
    lease, moved = store.begin_and_authorize(second.key, request_digest=second.request_digest)
    assert moved.state == STATE.authorized
    assert seen == [(EVENT.authorize_dispatch, False)]
    assert _events(store, second.key) == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch]
    attempts = store.attempts(second.key)
    assert [(a.attempt_token, a.generation, a.number) for a in attempts] == [(lease.attempt_token, lease.generation, 1)]
    assert store.get(second.key).attempt_count == 1


def test_a_lease_lapsing_between_write_and_diagnosis_lets_the_sweeper_abandon_it(moving_clock_store, monkeypatch):
    """The clock guard the other way round: ``lease_expired`` refuses at the write, passes at the diagnosis."""
    store, set_clock = moving_clock_store
    it, _, snapshot, seen = _lapsing_lease(store, set_clock, monkeypatch)
    moved = store.abandon_attempt(snapshot)
    assert (moved.state, moved.attempt_token) == (STATE.pending, None)
    assert seen == [(EVENT.abandon_attempt, False)]
    assert _events(store, it.key) == [EVENT.submit, EVENT.begin, EVENT.abandon_attempt]
    assert [len(a.outcomes) for a in store.attempts(it.key)] == [1]


def test_a_sequence_whose_first_lease_lapses_between_write_and_diagnosis_is_tried_once_more_on_every_path(
    moving_clock_store, monkeypatch
):
    """Two moves in one transaction, the second built from the first's row (a callable step: on PostgreSQL the
    pipelined path, ``SqlStore._pipelined``): abandon the lapsed attempt and begin the next. The abandon is refused
    at its write (the lease is still live) and its diagnosis finds the lease lapsed: as for the single move
    (test above) and as on SQLite, the sequence is tried once more and both moves are made."""
    store, set_clock = moving_clock_store
    it, old, snapshot, seen = _lapsing_lease(store, set_clock, monkeypatch)
    stale = {"attempt_token": snapshot.attempt_token, "generation": snapshot.generation}
    steps = [(EVENT.abandon_attempt, stale), (EVENT.begin, lambda prev: {"lease_seconds": LEASE})]
    abandoned, begun = store._moves(it.key, steps)
    assert abandoned.state == STATE.pending and begun.attempt_token not in (None, old.attempt_token)
    assert seen == [(EVENT.abandon_attempt, False)]
    assert _events(store, it.key) == [EVENT.submit, EVENT.begin, EVENT.abandon_attempt, EVENT.begin]


def test_the_dispatcher_sends_once_when_the_window_clears_between_the_write_and_its_diagnosis(
    moving_clock_store, monkeypatch
):
    """The commit's motivating case end to end: the runtime's hot path (``begin_and_authorize``) is refused by
    the duplicate-text window at its write and finds it cleared at its diagnosis; the dispatch sends the bytes
    once and reads them back, instead of raising a race."""
    from atmostonce.runtime import Dispatcher, RuntimeConfig
    from tests.test_service import Echo

    store, set_clock = moving_clock_store
    it, seen = _window_race(store, set_clock, monkeypatch)
    echo = Echo()
    config = RuntimeConfig(lease_seconds=LEASE, send_lease_seconds=LEASE, reconcile_interval=0)
    assert Dispatcher(store, echo, config, fused=True).dispatch(it.key) == "read_back.match"
    assert seen == [(EVENT.authorize_dispatch, False)]
    assert len(echo.by_key[it.key]) == 1
    assert store.get(it.key).state == STATE.published
    assert _events(store, it.key).count(EVENT.authorize_dispatch) == 1


# ------------------------------------------------------------------ what refuses is still named
def test_a_stale_lease_is_refused_by_lease_holder_after_a_staged_race_and_recorded_once(sql_store, monkeypatch):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease = store.begin(it.key, lease_seconds=LEASE)
    stale = lease.__class__(**{**lease.__dict__, "attempt_token": "0" * 32})
    seen = _diagnoses(monkeypatch, store, first=_race)
    with pytest.raises(GuardRefused) as e:
        store.authorize_dispatch(stale, request_digest=it.request_digest)
    assert (e.value.event, e.value.guard, e.value.state) == (EVENT.authorize_dispatch, "lease_holder", STATE.pending)
    assert seen == [(EVENT.authorize_dispatch, False)] * 2
    assert [(r.event, r.guard, r.presented["attempt_token"]) for r in store.refusals(it.key)] == [
        (EVENT.authorize_dispatch, "lease_holder", "0" * 32)
    ]
    assert _events(store, it.key) == [EVENT.submit, EVENT.begin]
    # the real holder still authorizes
    monkeypatch.undo()
    assert store.authorize_dispatch(lease, request_digest=it.request_digest).state == STATE.authorized


def test_a_superseded_generation_stays_refused_after_a_staged_race(sql_store, monkeypatch):
    """A lease from an attempt the sweeper abandoned, presented after the next begin: fencing on generation."""
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    old = store.begin(it.key, lease_seconds=LEASE)
    from atmostonce_sql.testing import age_leases

    age_leases(store, LEASE + 1)
    store.abandon_attempt(store.get(it.key))
    store.begin(it.key, lease_seconds=LEASE)
    seen = _diagnoses(monkeypatch, store, first=_race)
    with pytest.raises(GuardRefused) as e:
        store.authorize_dispatch(old, request_digest=it.request_digest)
    assert (e.value.guard, e.value.state) == ("lease_holder", STATE.pending)
    assert len(seen) == 2
    assert store.get(it.key).state == STATE.pending


def test_a_race_staged_twice_is_raised_as_lost_race_and_moves_nothing(sql_store, monkeypatch):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease = store.begin(it.key, lease_seconds=LEASE)
    stale = lease.__class__(**{**lease.__dict__, "attempt_token": "0" * 32})
    seen: list[str] = []

    def always_a_race(self, conn, ev, key, params, coupled=False):
        seen.append(ev.name)
        return Rejected(ev.name, key, LOST_RACE, "pending")

    monkeypatch.setattr(type(store), "_diagnose", always_a_race)
    with pytest.raises(Rejected) as e:
        store.authorize_dispatch(stale, request_digest=it.request_digest)
    assert e.value.guard == LOST_RACE and not isinstance(e.value, GuardRefused)
    assert seen == [EVENT.authorize_dispatch, EVENT.authorize_dispatch]
    assert store.refusals(it.key) == []  # a race is not a fencing refusal
    assert _events(store, it.key) == [EVENT.submit, EVENT.begin]


@pytest.mark.parametrize("case", ["stale_lease", "source_state", "unknown_intent"])
def test_a_named_refusal_is_diagnosed_once_and_never_tried_again(sql_store, monkeypatch, case):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease = store.begin(it.key, lease_seconds=LEASE)
    tries: list[str] = []
    real = SqlStore._apply_statements

    def counted(self, ev, key, args):
        tries.append(ev.name)
        return real(self, ev, key, args)

    monkeypatch.setattr(SqlStore, "_apply_statements", counted)
    if case == "stale_lease":
        stale = lease.__class__(**{**lease.__dict__, "attempt_token": "0" * 32})
        with pytest.raises(GuardRefused) as e:
            store.authorize_dispatch(stale, request_digest=it.request_digest)
        assert (e.value.guard, e.value.state) == ("lease_holder", STATE.pending)
    elif case == "source_state":
        store.authorize_dispatch(lease, request_digest=it.request_digest)
        tries.clear()
        with pytest.raises(IllegalMove) as e:
            store.authorize_dispatch(lease, request_digest=it.request_digest)
        assert (e.value.guard, e.value.state) == (SOURCE_STATE, STATE.authorized)
    else:
        ghost = lease.__class__(**{**lease.__dict__, "key": "no-such-key"})
        with pytest.raises(UnknownIntent):
            store.authorize_dispatch(ghost, request_digest=it.request_digest)
    assert tries == [EVENT.authorize_dispatch]


@pytest.mark.parametrize(
    "error, raised",
    [
        (StoreError("connection reset"), StoreError),
        # a deadlock or the database's exclusion on an authorization (it claims the text slot): named as the
        # window's guard by SqlStore._refusing, outside the retry
        (Deadlock("deadlock detected"), GuardRefused),
        (ConstraintRefused("duplicate text", TEXT_WINDOW_CONSTRAINT), GuardRefused),
    ],
)
def test_a_store_error_is_never_tried_again(sql_store, monkeypatch, error, raised):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease = store.begin(it.key, lease_seconds=LEASE)
    tries: list[str] = []

    def fails(self, ev, key, args):
        tries.append(ev.name)
        raise error

    monkeypatch.setattr(SqlStore, "_apply_statements", fails)
    with pytest.raises(raised) as e:
        store.authorize_dispatch(lease, request_digest=it.request_digest)
    if raised is GuardRefused:
        assert (e.value.event, e.value.guard) == (EVENT.authorize_dispatch, "text_window_clear")
    assert tries == [EVENT.authorize_dispatch]
    monkeypatch.undo()
    assert store.get(it.key).state == STATE.pending


# ------------------------------------------------------------------ sequences: the refusal names its move
def test_a_sequence_refused_after_its_retry_names_the_authorization_and_leaves_no_begin(
    moving_clock_store, monkeypatch
):
    """The first try's authorization misses with a staged race; the second try's is refused by the window, which
    has not cleared: the refusal names authorize_dispatch, and neither try's begin is left behind."""
    store, set_clock = moving_clock_store
    second, seen = _window_race(store, set_clock, monkeypatch, first=_race)
    with pytest.raises(GuardRefused) as e:
        store.begin_and_authorize(second.key, request_digest=second.request_digest)
    assert (e.value.event, e.value.guard, e.value.state) == (
        EVENT.authorize_dispatch,
        "text_window_clear",
        STATE.pending,
    )
    assert seen == [(EVENT.authorize_dispatch, False)] * 2
    assert _events(store, second.key) == [EVENT.submit]
    assert store.attempts(second.key) == []
    assert store.get(second.key).attempt_count == 0


def test_a_sequence_whose_second_try_fails_before_any_move_raises_that_failure_as_itself(sql_store, monkeypatch):
    """The first try's authorization misses (a staged race); the second try's transaction cannot even begin (a
    deadlock): the failure is raised as it is, not attributed to the first try's authorization (whose
    ``claim_text_slot`` would turn a deadlock into a ``text_window_clear`` refusal)."""
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    monkeypatch.setattr(store, "_fused", lambda key, steps: None)  # PostgreSQL: to the transaction path
    real_apply_in = SqlStore._apply_in
    calls: list[str] = []

    def apply_in(self, conn, ev, key, args):
        calls.append(ev.name)
        if ev.name == EVENT.authorize_dispatch and calls.count(EVENT.authorize_dispatch) == 1:
            raise Rejected(ev.name, key, LOST_RACE, "pending", "staged by the test")
        return real_apply_in(self, conn, ev, key, args)

    monkeypatch.setattr(SqlStore, "_apply_in", apply_in)
    real_tx = store._tx
    opened: list[bool] = []

    @contextlib.contextmanager
    def tx(autocommit=False, lossable=False):
        if not autocommit:
            opened.append(True)
            if len(opened) == 2:
                raise Deadlock("deadlock detected (staged)")
        with real_tx(autocommit, lossable) as conn:
            yield conn

    monkeypatch.setattr(store, "_tx", tx)
    with pytest.raises(StoreError) as e:
        store.begin_and_authorize(it.key, request_digest=it.request_digest)
    assert isinstance(e.value, Deadlock) and not isinstance(e.value, Rejected)
    assert calls == [EVENT.begin, EVENT.authorize_dispatch]
    monkeypatch.undo()
    assert _events(store, it.key) == [EVENT.submit]


def test_a_retried_outcome_sequence_records_the_send_and_its_read_back_once(sql_store, monkeypatch):
    """``record_sent`` (record_success and confirm_read_back in one transaction, committed without waiting for
    the disk): the read-back's first write in the transaction path really misses (it presented a superseded
    generation), its diagnosis stages a race; the second try's transaction makes both moves once (PostgreSQL:
    the fused statement is set aside so the transaction path runs)."""
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest)
    built = _first_write_misses(monkeypatch, EVENT.confirm_read_back, in_transaction=True)
    monkeypatch.setattr(store, "_fused", lambda key, steps: None)  # PostgreSQL: to the transaction path
    seen = _diagnoses(monkeypatch, store, first=_race)
    moved = store.record_sent(lease, remote_id="obj-1", read_back="read_back.match")
    assert moved.state == STATE.published
    assert built == [EVENT.confirm_read_back] * 2
    assert seen == [(EVENT.confirm_read_back, False)]
    monkeypatch.undo()
    assert _events(store, it.key) == [
        EVENT.submit,
        EVENT.begin,
        EVENT.authorize_dispatch,
        EVENT.record_success,
        EVENT.confirm_read_back,
    ]
    assert [len(a.outcomes) for a in store.attempts(it.key)] == [1]
    assert store.get(it.key).remote_id == "obj-1"


# ------------------------------------------------------------------ PostgreSQL's pipelined outcome move
@pytest.mark.postgres
def test_a_pipelined_outcome_move_refused_once_is_made_on_its_second_try_exactly_once(pg_databases, monkeypatch):
    """An outcome move (``async_outcomes``: BEGIN, the move, COMMIT pipelined on an autocommit connection) whose
    first write really misses (it presented a superseded generation) and whose diagnosis stages a race: the
    second try, on the one pooled connection the refused pipeline left, records the outcome once."""
    url = pg_databases.fresh()
    store = atmostonce_sql.open_store(url, migrate=False, pool_size=1)
    try:
        assert store.async_outcomes
        it = store.submit("acct", "post", "room-1", {"text": "hello"})
        lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest)
        built = _first_write_misses(monkeypatch, EVENT.record_not_sent)
        seen = _diagnoses(monkeypatch, store, first=_race)
        moved = store.record_not_sent(lease, reason="connect refused")
        assert moved.state == STATE.failed
        assert built == [EVENT.record_not_sent] * 2
        assert seen == [(EVENT.record_not_sent, False)]
        monkeypatch.undo()
        assert _events(store, it.key) == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch, EVENT.record_not_sent]
        assert [len(a.outcomes) for a in store.attempts(it.key)] == [1]
    finally:
        store.close()
        pg_databases.drop(url)


# ------------------------------------------------------------------ the coupled form (approval-gated intents)
def test_a_coupled_authorization_retried_after_a_late_race_moves_the_claim_once(sql_store, monkeypatch):
    """An approval-gated intent's authorization moves its claim (``start_sending``) in the same transaction; a race
    found after the intent's row and the claim's have moved there (staged after the claim's move) rolls both
    back, and the second try moves each once."""
    from tests.test_claims import TARGET, approve, gated, reserve

    store = sql_store
    it = gated(store)
    apv = approve(store, it)
    claim = reserve(store, it, apv)
    lease = store.begin(it.key, lease_seconds=LEASE)
    claim_moves_before = [c.event for c in store.claim_history(TARGET)]
    real = SqlStore._coupled_moves
    tries: list[str] = []

    def coupled_moves(self, conn, ev, row, args):
        real(self, conn, ev, row, args)
        tries.append(ev.name)
        if len(tries) == 1:
            raise Rejected("start_sending", TARGET, LOST_RACE, "reserved", "staged by the test")

    monkeypatch.setattr(SqlStore, "_coupled_moves", coupled_moves)
    moved = store.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    assert moved.state == STATE.authorized
    assert tries == [EVENT.authorize_dispatch] * 2
    monkeypatch.undo()
    claim_moves = [c.event for c in store.claim_history(TARGET)]
    assert claim_moves[: len(claim_moves_before)] == claim_moves_before
    assert claim_moves[len(claim_moves_before) :].count("start_sending") == 1
    assert _events(store, it.key).count(EVENT.authorize_dispatch) == 1
    assert store.claim(TARGET).state == "sending"
    assert store.refusals(f"claim:{TARGET}") == []


# ------------------------------------------------------------------ the async store
@pytest.mark.parametrize("kind", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_the_async_store_tries_a_lost_race_once_more_and_names_a_stale_lease(request, monkeypatch, kind):
    from atmostonce_sql.aio import open_async_store

    dbs = request.getfixturevalue("sqlite_databases" if kind == "sqlite" else "pg_databases")
    url = dbs.fresh()
    seen: list[str] = []
    real = SqlStore._diagnose

    def diagnose(self, conn, ev, key, params, coupled=False):
        seen.append(ev.name)
        if len(seen) == 1:
            return Rejected(ev.name, key, LOST_RACE, "pending", "staged by the test")
        return real(self, conn, ev, key, params, coupled=coupled)

    async def scenario():
        async with await open_async_store(url, migrate=False, pool_size=2) as store:
            it = await store.submit("acct", "post", "room-1", {"text": "hello"})
            lease = await store.begin(it.key, lease_seconds=LEASE)
            stale = lease.__class__(**{**lease.__dict__, "attempt_token": "0" * 32})
            monkeypatch.setattr(SqlStore, "_diagnose", diagnose)
            try:
                await store.authorize_dispatch(stale, request_digest=it.request_digest)
            except Rejected as exc:
                refused = exc
            monkeypatch.undo()
            moved = await store.authorize_dispatch(lease, request_digest=it.request_digest)
            return refused, moved, [h.event for h in await store.history(it.key)]

    try:
        refused, moved, history = asyncio.run(scenario())
    finally:
        dbs.drop(url)
    assert (refused.guard, refused.state) == ("lease_holder", STATE.pending)
    assert seen == [EVENT.authorize_dispatch, EVENT.authorize_dispatch]
    assert moved.state == STATE.authorized
    assert history == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch]


# ------------------------------------------------------------------ real concurrency
def _race_threads(n, fn):
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = fn(i)
        except Exception as exc:  # noqa: BLE001 - the result under test
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results


def test_workers_racing_begin_and_authorize_on_one_intent_authorize_it_once(sql_store):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    results = _race_threads(4, lambda i: store.begin_and_authorize(it.key, request_digest=it.request_digest))
    won = [r for r in results if isinstance(r, tuple)]
    lost = [r for r in results if not isinstance(r, tuple)]
    assert len(won) == 1
    assert all(isinstance(r, Rejected) for r in lost), lost
    # each loser is told what refused it: the intent moved on (or its attempt is open), never a race
    assert {(r.event, r.guard) for r in lost} <= {
        (EVENT.begin, SOURCE_STATE),
        (EVENT.begin, "no_open_attempt"),
    }, [(r.event, r.guard) for r in lost]
    assert _events(store, it.key) == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch]
    assert len(store.attempts(it.key)) == 1
    assert store.get(it.key).attempt_token == won[0][0].attempt_token


def test_holders_racing_one_lease_through_authorization_authorize_it_once(sql_store):
    store = sql_store
    it = store.submit("acct", "post", "room-1", {"text": "hello"})
    lease = store.begin(it.key, lease_seconds=LEASE)
    results = _race_threads(4, lambda i: store.authorize_dispatch(lease, request_digest=it.request_digest))
    won = [r for r in results if not isinstance(r, Exception)]
    lost = [r for r in results if isinstance(r, Exception)]
    assert len(won) == 1
    assert all(isinstance(r, IllegalMove) and (r.guard, r.state) == (SOURCE_STATE, STATE.authorized) for r in lost), [
        repr(r) for r in lost
    ]
    assert _events(store, it.key) == [EVENT.submit, EVENT.begin, EVENT.authorize_dispatch]
