"""Two durable points per send (docs/design.md#two-durable-points-per-send): ``begin`` with
``authorize_dispatch`` in one transaction before the bytes, the send's success with its read-back's move
in one after; on every store, and on PostgreSQL the rule that only the outcome may commit without
waiting for the disk."""

from __future__ import annotations

import threading

import psycopg
import pytest

from atmostonce import GuardRefused, IntakeError, Rejected
from atmostonce.errors import SOURCE_STATE
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.transport import Capabilities, Found, NotFound, NotSent, Sent, Unknown
from tests.helpers import crashable_cluster, submit

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)


class Platform:
    """An in-memory platform: ``answer`` decides each send; read-back returns what was stored (or ``edit``)."""

    name, protocol_version = "memory-platform", 1

    def __init__(self, answer="sent", edit=None, read_back=True):
        self.answer, self.edit, self.objects, self.sends = answer, edit, {}, 0
        self.capabilities = Capabilities(read_back=read_back, lookup_by_key=True, fenced_lookup=False)

    def send(self, wire):
        self.sends += 1
        if self.answer == "not_sent":
            return NotSent("connect refused")
        rid = f"r{self.sends}"
        self.objects[rid] = dict(wire.body) | ({} if self.edit is None else self.edit)
        return Unknown("read timeout") if self.answer == "unknown" else Sent(rid, response_digest="d")

    def read_back(self, remote_id):
        body = self.objects.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        return NotFound()

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


def events(store, key):
    return [h.event for h in store.history(key)]


def test_a_refused_authorization_leaves_no_attempt_and_spends_nothing(any_store):
    store = any_store.store
    it = submit(store)
    store.set_kill_switch("global", True, operator="ops")
    with pytest.raises(GuardRefused) as e:
        store.begin_and_authorize(it.key, request_digest=it.request_digest)
    assert (e.value.event, e.value.guard) == ("authorize_dispatch", "kill_switch_off")
    after = store.get(it.key)
    assert (after.state, after.attempt_count, after.attempt_token) == ("pending", 0, None)
    assert store.attempts(it.key) == []
    assert events(store, it.key) == ["submit"]


def test_a_refused_begin_is_raised_as_begin_and_moves_nothing(any_store):
    store = any_store.store
    it = submit(store)
    store.begin(it.key, lease_seconds=30)  # an attempt is open: no second one (no_open_attempt)
    with pytest.raises(GuardRefused) as e:
        store.begin_and_authorize(it.key, request_digest=it.request_digest)
    assert (e.value.event, e.value.guard) == ("begin", "no_open_attempt")
    assert events(store, it.key) == ["submit", "begin"]


def test_the_fused_moves_write_the_history_of_the_moves_one_by_one(any_store):
    store = any_store.store
    it = submit(store)
    lease, authorized = store.begin_and_authorize(it.key, request_digest=it.request_digest, lease_seconds=30)
    assert authorized.state == "authorized"
    assert (lease.key, lease.attempt_token, lease.generation) == (
        it.key,
        authorized.attempt_token,
        authorized.generation,
    )
    done = store.record_sent(lease, remote_id="r-9", response_digest="d", read_back="read_back.match")
    assert (done.state, done.remote_id) == ("published", "r-9")
    assert events(store, it.key) == ["submit", "begin", "authorize_dispatch", "record_success", "confirm_read_back"]
    assert [a.outcomes for a in store.attempts(it.key)] == [("confirm_read_back",)]


def test_a_mismatched_read_back_is_recorded_with_its_success_and_its_evidence(any_store):
    store = any_store.store
    it = submit(store)
    lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest)
    out = store.record_sent(
        lease, remote_id="r-1", read_back="read_back.differs", reason="read_back.differs", evidence={"field": "/text"}
    )
    assert (out.state, out.remote_id) == ("indeterminate", "r-1")
    last = store.history(it.key)[-1]
    assert (last.event, last.detail.get("evidence")) == ("read_back_failed", {"field": "/text"})


def test_an_outcome_under_a_lapsed_lease_writes_neither_move(any_store):
    store = any_store.store
    it = submit(store)
    lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest, send_lease_seconds=10)
    any_store.advance(60)
    assert Sweeper(store, CONFIG).sweep_leases()["expired"] == 1  # the send is unknown now
    with pytest.raises(Rejected):
        store.record_sent(lease, remote_id="r-1", read_back="read_back.match")
    after = store.get(it.key)
    assert (after.state, after.remote_id) == ("indeterminate", None)
    assert "record_success" not in events(store, it.key)


@pytest.mark.parametrize("outcome", ["send.not_sent", "lookup.found", "no.such.outcome"])
def test_record_sent_takes_only_a_read_back_outcome(any_store, outcome):
    store = any_store.store
    it = submit(store)
    lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest)
    with pytest.raises(IntakeError):
        store.record_sent(lease, remote_id="r-1", read_back=outcome)
    assert store.get(it.key).state == "authorized"


def test_a_failed_read_back_must_say_why(any_store):
    store = any_store.store
    it = submit(store)
    lease, _ = store.begin_and_authorize(it.key, request_digest=it.request_digest)
    with pytest.raises(IntakeError) as e:
        store.record_sent(lease, remote_id="r-1", read_back="read_back.differs")
    assert e.value.field == "reason"
    assert store.get(it.key).state == "authorized"  # neither move was written


@pytest.mark.parametrize(
    "platform",
    [
        pytest.param(dict(), id="match"),
        pytest.param(dict(edit={"text": "edited"}), id="mismatch"),
        pytest.param(dict(read_back=False), id="no-read-back"),
        pytest.param(dict(answer="not_sent"), id="not-sent"),
        pytest.param(dict(answer="unknown"), id="unknown"),
    ],
)
def test_a_fused_dispatch_ends_where_the_step_by_step_one_does(any_store, platform):
    store = any_store.store
    fused, stepwise = submit(store, text="fused"), submit(store, text="stepwise", target="room-2")
    a = Dispatcher(store, Platform(**platform), CONFIG).dispatch(fused.key)
    b = Dispatcher(store, Platform(**platform), CONFIG, fused=False).dispatch(stepwise.key)
    assert a == b
    assert events(store, fused.key) == events(store, stepwise.key)
    one, other = store.get(fused.key), store.get(stepwise.key)
    assert (one.state, one.remote_id is None) == (other.state, other.remote_id is None)


class ReadBackFailsOnce(Platform):
    """Takes the request, then the first read-back fails (a read timeout): the object exists on the platform."""

    def __init__(self, error):
        super().__init__()
        self.error, self.failed = error, False

    def read_back(self, remote_id):
        if not self.failed:
            self.failed = True
            raise self.error
        return super().read_back(remote_id)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(Rejected("read_back", "k", "timeout", None), id="transport-error"),
        pytest.param(KeyboardInterrupt(), id="interrupted"),
    ],
)
def test_a_read_back_that_fails_after_the_send_keeps_the_success_and_its_object_id(any_store, error):
    # the platform took the request: its object id is recorded before the failure goes up, on the fused path as
    # on the step-by-step one, and the reconciler reads the object back by that id; nothing is sent again
    store = any_store.store
    ends = {}
    for fused, target in ((True, "room-1"), (False, "room-2")):
        it = submit(store, text=f"read back fails in {target}", target=target)
        platform = ReadBackFailsOnce(error)
        with pytest.raises(type(error)):
            Dispatcher(store, platform, CONFIG, fused=fused).dispatch(it.key)
        assert events(store, it.key)[-1] == "record_success"
        assert store.get(it.key).remote_id == "r1"
        any_store.advance(60)
        Sweeper(store, CONFIG).tick()
        Reconciler(store, platform, CONFIG).run()
        ends[fused] = (store.get(it.key).state, store.get(it.key).remote_id, platform.sends, events(store, it.key))
    assert ends[True] == ends[False]
    assert ends[True][:3] == ("published", "r1", 1)


def test_dispatching_the_submitted_intent_itself_ends_as_dispatching_its_key(any_store):
    store = any_store.store
    by_intent, by_key = submit(store, text="snapshot"), submit(store, text="by key", target="room-2")
    assert Dispatcher(store, Platform(), CONFIG).dispatch(by_intent) == Dispatcher(store, Platform(), CONFIG).dispatch(
        by_key.key
    )
    assert events(store, by_intent.key) == events(store, by_key.key)
    assert store.get(by_intent.key).state == store.get(by_key.key).state == "published"


def test_a_stale_intent_snapshot_is_refused_by_the_store_and_sends_nothing(any_store):
    store = any_store.store
    it = submit(store)
    first = Platform()
    assert Dispatcher(store, first, CONFIG).dispatch(it) == "read_back.match"
    again = Platform()
    with pytest.raises(Rejected) as e:
        Dispatcher(store, again, CONFIG).dispatch(it)  # the pending snapshot of a now published intent
    assert (e.value.event, e.value.guard, e.value.state) == ("begin", SOURCE_STATE, "published")
    assert again.sends == 0
    assert store.get(it.key).state == "published"
    assert len(store.attempts(it.key)) == 1


def test_a_kill_switch_stops_a_fused_dispatch_before_anything_is_begun(any_store):
    store = any_store.store
    it = submit(store)
    store.set_kill_switch(f"account:{it.account}", True, operator="ops")
    platform = Platform()
    assert Dispatcher(store, platform, CONFIG).dispatch(it.key) == "gate.paused"
    assert platform.sends == 0
    assert events(store, it.key) == ["submit"]


def test_a_policy_block_on_the_fused_path_parks_as_the_step_by_step_path_does(any_store):
    store = any_store.store
    it = submit(store)
    store.set_credential_version(it.account, "v2")
    platform = Platform()
    d = Dispatcher(store, platform, CONFIG, credential_version=lambda account: "v1")
    assert d.dispatch(it.key) == "gate.blocked"
    assert platform.sends == 0
    assert store.get(it.key).state == "parked"
    assert events(store, it.key) == ["submit", "begin", "block_at_gate"]


def test_a_success_whose_outcome_is_refused_is_kept_as_evidence_on_the_attempt(any_store):
    store = any_store.store
    it = submit(store)

    class Slow(Platform):
        def send(self, wire):  # the send lease lapses while the platform answers
            any_store.advance(60)
            Sweeper(store, CONFIG).sweep_leases()
            return super().send(wire)

    with pytest.raises(Rejected):
        Dispatcher(store, Slow(), CONFIG).dispatch(it.key)
    (ev,) = store.evidence(it.key)
    assert (ev.outcome, ev.remote_id) == ("send.success", "r1")
    assert store.get(it.key).state == "indeterminate"


# ---------------------------------------------------------------- PostgreSQL: which commits wait for the disk
class Statements:
    """Every statement the process sends through psycopg, in order: by its cursors, and as the store's own
    prepared statements (``Executor._query``)."""

    def __init__(self, monkeypatch):
        from atmostonce_sql.execution import Executor

        self.sent: list[str] = []
        original, original_query = psycopg.Cursor.execute, Executor._query
        outer = self

        def execute(cur, query, params=None, *a, **kw):
            outer.sent.append(query if isinstance(query, str) else str(query))
            return original(cur, query, params, *a, **kw)

        def query(executor, raw, stmts, name, params):
            outer.sent.append(executor.native(stmts, name)[0])
            return original_query(executor, raw, stmts, name, params)

        monkeypatch.setattr(psycopg.Cursor, "execute", execute)
        monkeypatch.setattr(Executor, "_query", query)

    def transactions(self) -> list[list[str]]:
        out, current = [], None
        for q in self.sent:
            if q == "BEGIN":
                current = []
            elif q == "COMMIT" and current is not None:
                out.append(current)
                current = None
            elif current is not None:
                current.append(q)
        return out


class Marked(Platform):
    """:class:`Platform` that writes ``<the bytes>`` into the statement log when it sends."""

    def __init__(self, log: list[str], **kw):
        super().__init__(**kw)
        self.log = log

    def send(self, wire):
        self.log.append("<the bytes>")
        return super().send(wire)


def _writes(statements: list[str]) -> list[str]:
    return [q for q in statements if "UPDATE aom_intents" in q]


@pytest.mark.postgres
def test_a_dispatch_is_one_statement_before_the_bytes_and_one_after(pg_store, monkeypatch):
    """Two durable points, two round trips: the authorization (begin with authorize_dispatch) and the
    outcome (record_success with the read-back's move) are each one statement in its own autocommit
    transaction, and only the outcome's turns off the wait for the disk."""
    it = submit(pg_store)
    seen = Statements(monkeypatch)
    assert Dispatcher(pg_store, Marked(seen.sent), CONFIG).dispatch(it.key) == "read_back.match"
    cut = seen.sent.index("<the bytes>")
    (authorize,), (outcome,) = _writes(seen.sent[:cut]), _writes(seen.sent[cut:])
    assert "BEGIN" not in seen.sent and "COMMIT" not in seen.sent
    assert "set_config" not in authorize and "FOR UPDATE" in authorize
    assert "set_config" in outcome  # synchronous_commit off, local to the statement's own transaction
    assert pg_store.get(it.key).state == "published"


@pytest.mark.postgres
def test_the_outcome_statement_leaves_its_connection_committing_synchronously(pg_databases, monkeypatch):
    """``set_config(..., true)`` is local to the outcome's own transaction: the pooled connection that ran
    it commits whatever it runs next synchronously again."""
    from atmostonce_sql import open_store
    from atmostonce_sql.execution import Executor

    url = pg_databases.fresh()
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as admin:
        db = admin.execute("SELECT current_database()").fetchone()[0]
        admin.execute(f'ALTER DATABASE "{db}" SET synchronous_commit = on')  # test clusters default to off
    store = open_store(url, migrate=False)
    ran_on: list[psycopg.Connection] = []
    original = Executor._query

    def query(executor, raw, stmts, name, params):
        if "set_config" in executor.native(stmts, name)[0]:
            ran_on.append(raw)
        return original(executor, raw, stmts, name, params)

    try:
        it = submit(store)
        monkeypatch.setattr(Executor, "_query", query)
        assert Dispatcher(store, Platform(), CONFIG).dispatch(it.key) == "read_back.match"
        monkeypatch.undo()
        (conn,) = ran_on  # idle in the pool now
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("on",)
    finally:
        store.close()
        pg_databases.drop(url)


def _shape(store, key, own=()):
    """What a dispatch left for ``key`` (the intent, its history, its attempts) without what each intent has of
    its own: identities (``own`` adds to them), times, and the idempotency key in a descriptor."""

    def keyless(detail):
        if "descriptor" not in detail:
            return detail
        return detail | {"descriptor": {k: v for k, v in detail["descriptor"].items() if k != "idempotency_key"}}

    own = {"key", "request", "request_digest", "text_hash", "attempt_token", "generation", *own}
    times = {"lease_expires_at", "created_at", "updated_at"}
    intent = {k: v for k, v in vars(store.get(key)).items() if k not in own | times}
    intent["descriptor"] = keyless({"descriptor": intent["descriptor"]})["descriptor"]
    history = [
        (
            h.event,
            h.actor,
            h.from_state,
            h.to_state,
            h.attempt_token is not None,
            h.generation is not None,
            keyless(h.detail),
        )
        for h in store.history(key)
    ]
    attempts = [(a.number, a.outcomes, a.resend_epoch, a.fence_epoch) for a in store.attempts(key)]
    return intent, history, attempts


@pytest.mark.postgres
def test_the_one_statement_moves_write_what_the_moves_one_by_one_write(pg_store, monkeypatch):
    """The same dispatch through the fused statements and through one transaction of single moves (what
    a refusal falls back to) leaves the same intent, history, attempt and chain, apart from the identities
    and times each intent has of its own."""
    from atmostonce.audit import verify_store
    from atmostonce_sql.store import SqlStore

    def dispatch(text, target):
        it = submit(pg_store, text=text, target=target)
        lease, _ = pg_store.begin_and_authorize(it.key, request_digest=it.request_digest, lease_seconds=30)
        pg_store.record_sent(lease, remote_id="r-1", response_digest="d", read_back="read_back.match")
        return it.key

    fused = dispatch("one statement", "room-1")
    monkeypatch.setattr(SqlStore, "_fused", lambda self, key, steps: None)
    stepwise = dispatch("moves one by one", "room-2")

    own = {"target"}
    assert _shape(pg_store, fused, own) == _shape(pg_store, stepwise, own)
    assert [h.seq for h in pg_store.history(fused)] == sorted(h.seq for h in pg_store.history(fused))
    assert verify_store(pg_store, [fused, stepwise]).breaks == ()


def test_publish_creating_the_intent_authorized_writes_what_submit_and_the_moves_one_by_one_write(
    sql_store, monkeypatch
):
    """A publish creates the intent already authorized in one commit (PostgreSQL: one statement; SQLite: the
    creating statement and the two moves in one transaction); what it leaves (intent, history in order,
    attempt, hash chain) is what the creating statement and the two moves leave in commits of their own, as a
    refused or taken key makes the store do, apart from each intent's own identities and times. The rows it
    returns (as created, as begun, as authorized) are the rows those moves return: the same creation time as
    the stored row."""
    from atmostonce.audit import verify_store
    from atmostonce_sql.store import SqlStore

    def publish(text):
        key, outcome = Dispatcher(sql_store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": text})
        assert outcome == "read_back.match"
        return key

    seen = []
    one = SqlStore._create_and_apply
    monkeypatch.setattr(
        SqlStore, "_create_and_apply", lambda self, sub, steps: seen.append(one(self, sub, steps)) or seen[-1]
    )
    created = publish("one statement")
    assert seen[-1] is not None  # created and moved in one commit
    made, (begun, authorized) = seen[-1]
    stored = sql_store.get(created)
    assert (made.state, begun.state, authorized.state) == ("pending", "pending", "authorized")
    assert made.created_at == begun.created_at == authorized.created_at == stored.created_at
    assert (made.attempt_token, made.generation, made.attempt_count) == (None, None, 0)
    assert (begun.attempt_token, begun.generation) == (authorized.attempt_token, authorized.generation)
    assert begun.attempt_count == authorized.attempt_count == 1
    assert begun.attempt_token == sql_store.attempts(created)[0].attempt_token
    monkeypatch.setattr(SqlStore, "_create_and_apply", lambda self, sub, steps: None)
    usual = publish("submit, then the moves")

    own = {"remote_id"}
    assert _shape(sql_store, created, own) == _shape(sql_store, usual, own)
    assert [h.event for h in sql_store.history(created)][:3] == ["submit", "begin", "authorize_dispatch"]
    assert [h.seq for h in sql_store.history(created)] == sorted(h.seq for h in sql_store.history(created))
    assert verify_store(sql_store, [created, usual]).breaks == ()


@pytest.mark.postgres
def test_a_store_told_to_keep_outcomes_durable_commits_them_synchronously(pg_databases, monkeypatch):
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    store = open_store(url, migrate=False, async_outcomes=False)
    try:
        it = submit(store)
        seen = Statements(monkeypatch)
        assert Dispatcher(store, Platform(), CONFIG).dispatch(it.key) == "read_back.match"
        assert not any("synchronous_commit" in q for q in seen.sent)
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.postgres
def test_an_outcome_lost_in_a_database_crash_is_settled_by_reconciliation_and_never_resent():
    """The outcome commits without waiting for the disk, so a crash of the server right after it may
    lose it (likely here: the WAL writer sleeps 10 s). Whatever survived, the intent is either where the
    outcome put it or where the authorization left it (both moves of the outcome, or neither), and it
    ends published with one object on the platform: the lease expires, the send is unknown, and the
    lookup finds it. A lost authorization, which this rule exists to prevent, would instead have sent
    the intent again."""
    from atmostonce_http import HttpTransport, PlatformSink, sink_config
    from atmostonce_sql import open_store
    from atmostonce_sql.testing import age_leases

    store = None
    with crashable_cluster("async-outcome") as cluster:
        try:
            url = cluster.create_database("crash")
            store = open_store(url)
            with PlatformSink(dedupe=False, fenced_lookup=True) as sink:
                cfg = sink_config(sink.url, key_field="/delivery_key", lookup_fenced=True)
                with HttpTransport(cfg) as transport:
                    keys = [submit(store, text=f"crash {i}", target=f"room-{i}").key for i in range(5)]
                    d = Dispatcher(store, transport, CONFIG)
                    assert [d.dispatch(k) for k in keys] == ["read_back.match"] * 5
                    store.close()
                    cluster.stop()  # pg_ctl stop -m immediate: the server crashes, WAL buffers are gone
                    cluster.start()
                    store = open_store(url, migrate=False)
                    after = {k: store.get(k).state for k in keys}
                    assert set(after.values()) <= {"published", "authorized"}
                    for k in keys:
                        hist = events(store, k)
                        assert hist[-1] in ("confirm_read_back", "authorize_dispatch")
                    age_leases(store, 60)
                    Sweeper(store, CONFIG).tick()
                    Reconciler(store, transport, CONFIG).run()
                    assert {k: store.get(k).state for k in keys} == dict.fromkeys(keys, "published")
                    assert sink.creates_by_key == dict.fromkeys(keys, 1)  # nothing sent twice
        finally:
            if store is not None:
                store.close()


def _dsn(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def _until_waiting(admin: psycopg.Connection, waiters: int) -> None:
    """Poll until ``waiters`` backends of this database wait for a lock (a wait condition, not a timing)."""
    for _ in range(2000):
        n = admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchone()[0]
        if n >= waiters:
            return
        admin.execute("SELECT pg_sleep(0.005)")
    raise AssertionError(f"{waiters} backend(s) never waited for a lock")


def _in_thread(results: dict, name: str, fn) -> threading.Thread:
    def run():
        try:
            results[name] = fn()
        except BaseException as exc:  # noqa: BLE001 - the test inspects it
            results[name] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.postgres
@pytest.mark.parametrize("path", ["begin_and_authorize", "authorize_dispatch alone"])
def test_a_kill_switch_set_while_the_authorization_waits_for_the_row_is_obeyed(pg_databases, path):
    """Another transaction holds the intent's row; the authorization started before the kill switch was
    set, and waits. The switch commits, then the row is released: the authorization must see the switch
    (its guards read a snapshot taken after the wait), so nothing is authorized and nothing can be sent."""
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    store = open_store(url, migrate=False)
    try:
        it = submit(store)
        if path == "begin_and_authorize":
            authorize = lambda: store.begin_and_authorize(it.key, request_digest=it.request_digest)  # noqa: E731
        else:
            lease = store.begin(it.key, lease_seconds=30)
            authorize = lambda: store.authorize_dispatch(lease, request_digest=it.request_digest)  # noqa: E731
        before = events(store, it.key)
        with psycopg.connect(_dsn(url), autocommit=True) as admin, psycopg.connect(_dsn(url)) as holder:
            holder.execute("SELECT 1 FROM aom_intents WHERE key = %s FOR UPDATE", (it.key,))
            results: dict = {}
            t = _in_thread(results, "authorize", authorize)
            _until_waiting(admin, 1)
            store.set_kill_switch("global", True, operator="ops")
            holder.commit()
            t.join()
        refused = results["authorize"]
        assert isinstance(refused, GuardRefused), refused
        assert (refused.event, refused.guard) == ("authorize_dispatch", "kill_switch_off")
        assert events(store, it.key) == before and store.get(it.key).state == "pending"
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["publish", "dispatch", "dispatch step by step"])
@pytest.mark.parametrize("change", ["kill switch", "new source version"])
def test_a_policy_change_committed_while_the_authorization_waits_for_the_rate_window_is_obeyed(
    pg_databases, how, change
):
    """The account has a rate window, and another transaction has taken a slot on its row and not committed.
    The authorization waits for that row; meanwhile a kill switch, or a new head version of the source the
    intent rests on, commits; then the slot's transaction commits. The authorization must read the change (the
    window row is locked before the statement whose guards read the switch and the source), so nothing is
    sent."""
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    store = open_store(url, migrate=False)
    try:
        version = store.capture_source("src-1", "version one").version
        store.set_rate_limit("acct", 100, window_seconds=3600, operator="ops")
        Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-0", {"text": "first"})  # window running
        request = ("acct", "post", "room-2", {"text": "second"})
        platform, results = Platform(), {}
        d = Dispatcher(store, platform, CONFIG, fused=how != "dispatch step by step")
        if how == "publish":
            run = lambda: d.publish(*request, source=("src-1", version))  # noqa: E731
        else:
            it = store.submit(*request, source=("src-1", version))
            run = lambda: d.dispatch(it.key)  # noqa: E731
        with psycopg.connect(_dsn(url), autocommit=True) as admin, psycopg.connect(_dsn(url)) as other:
            other.execute("UPDATE aom_rate_limits SET used = used + 1 WHERE account = 'acct'")  # a slot, uncommitted
            t = _in_thread(results, "run", run)
            _until_waiting(admin, 1)
            if change == "kill switch":
                store.set_kill_switch("global", True, operator="ops")
            else:
                store.capture_source("src-1", "version two")
            other.commit()
            t.join()
        outcome = results["run"]
        outcome = outcome[1] if isinstance(outcome, tuple) else outcome
        assert platform.sends == 0, outcome
        # step by step, begin committed before the wait: the refused authorization parks the intent at the gate
        stop = {"kill switch": "gate.paused", "new source version": "gate.stale_source"}[change]
        assert outcome == ("gate.blocked" if how == "dispatch step by step" else stop)
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.postgres
@pytest.mark.parametrize("how", ["publish", "dispatch"])
def test_a_kill_switch_committed_while_another_claim_of_the_text_is_open_is_obeyed(pg_databases, how):
    """Another transaction is claiming the same text of the same account, as the store claims one (the account's
    text lock, then its claim row), and has not committed. The authorization waits for it; meanwhile a kill
    switch commits; then the other transaction rolls back, so the text is free. The authorization's guards
    must be read after that wait: it sees the switch, and nothing is sent."""
    from atmostonce_sql import open_store
    from atmostonce_sql.effects import TEXT_CLAIM_LOCK_CLASS

    url = pg_databases.fresh()
    store = open_store(url, migrate=False)
    try:
        queued = store.submit("acct", "post", "room-1", {"text": "raced"})  # the same text, elsewhere: no claim
        request = ("acct", "post", "room-2", {"text": "raced"})
        platform, results = Platform(), {}
        d = Dispatcher(store, platform, CONFIG)
        if how == "publish":
            run = lambda: d.publish(*request)  # noqa: E731
        else:
            it = store.submit(*request)
            run = lambda: d.dispatch(it.key)  # noqa: E731
        with psycopg.connect(_dsn(url), autocommit=True) as admin, psycopg.connect(_dsn(url)) as other:
            other.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(concat(%s::text, ':', %s::text)))",
                (TEXT_CLAIM_LOCK_CLASS, queued.account, queued.text_hash),
            )
            other.execute(
                "INSERT INTO aom_text_claims (key, account, text_hash, start_at, end_at, released) "
                "VALUES (%s, %s, %s, 0, 1e12, false)",
                (queued.key, queued.account, queued.text_hash),
            )
            t = _in_thread(results, "run", run)
            _until_waiting(admin, 1)
            store.set_kill_switch("global", True, operator="ops")
            other.rollback()
            t.join()
        outcome = results["run"]
        assert platform.sends == 0, outcome
        assert (outcome[1] if how == "publish" else outcome) == "gate.paused"
    finally:
        store.close()
        pg_databases.drop(url)


@pytest.mark.postgres
@pytest.mark.parametrize("move", ["authorization", "outcome"])
def test_a_restore_declared_while_a_dispatch_writes_waits_for_it_and_never_deadlocks(pg_databases, move):
    """The restore locks the tables it resynchronizes; a fused authorization writes the intent, then its
    attempt and history rows, a fused outcome the intent, history, then the attempt's outcome. Held
    between two of the restore's tables (another session holds one), the restore must finish, and the
    move that started meanwhile waits for it at the intent table, before it holds any table the restore
    still needs, then finds the intent fenced: refused, with nothing written."""
    from atmostonce.audit import verify_store
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    worker = open_store(url, migrate=False)
    # the restore's session is the one that would detect a wait cycle (and be rolled back by it)
    operator = open_store(url + ("&" if "?" in url else "?") + "options=-c%20deadlock_timeout%3D100ms", migrate=False)
    try:
        it = submit(worker)
        if move == "authorization":
            write = lambda: worker.begin_and_authorize(it.key, request_digest=it.request_digest)  # noqa: E731
        else:
            lease, _ = worker.begin_and_authorize(it.key, request_digest=it.request_digest)
            write = lambda: worker.record_sent(lease, remote_id="r-1", read_back="read_back.match")  # noqa: E731
        before = events(worker, it.key)
        with psycopg.connect(_dsn(url), autocommit=True) as admin, psycopg.connect(_dsn(url)) as holder:
            holder.execute("LOCK TABLE aom_failovers IN ROW EXCLUSIVE MODE")  # sorted among the restore's tables
            results: dict = {}
            restore = _in_thread(results, "restore", lambda: operator.declare_restore(operator="ops"))
            _until_waiting(admin, 1)
            dispatch = _in_thread(results, "move", write)
            _until_waiting(admin, 2)
            holder.commit()
            restore.join()
            dispatch.join()
        assert not isinstance(results["restore"], BaseException), results["restore"]
        assert isinstance(results["move"], Rejected), results["move"]
        assert worker.get(it.key).state == "indeterminate"  # the restore fenced it; the move wrote nothing
        assert events(worker, it.key) == [*before, "restore_fence"]
        assert verify_store(worker, [it.key]).breaks == ()
    finally:
        worker.close()
        operator.close()
        pg_databases.drop(url)


@pytest.mark.postgres
def test_publishing_a_delivery_that_exists_dispatches_it_without_driver_warnings(pg_store, caplog):
    """The one-round-trip create-and-authorize finds the key taken, rolls back and falls back to dispatching
    the stored intent; the aborted pipeline is ours to handle, so psycopg has nothing to warn a user about."""
    it = submit(pg_store)
    with caplog.at_level("WARNING", logger="psycopg"):
        key, outcome = Dispatcher(pg_store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "hello"})
    assert (key, outcome) == (it.key, "read_back.match")
    assert [r.getMessage() for r in caplog.records if r.name.startswith("psycopg")] == []
    assert events(pg_store, it.key).count("authorize_dispatch") == 1
