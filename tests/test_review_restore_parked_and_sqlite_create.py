"""An adversarial review of two paths: a declared restore fencing ``parked`` intents (``restore_fence`` from
``parked``, effect ``grant_reconcile``; docs/design.md#what-a-restore-cannot-know), and SQLite's publish, which
creates the intent and authorizes it in one write transaction (docs/design.md#two-durable-points-per-send):
what it returns and stores against the stepwise path, its refusals, threads and processes on one file, and a
process dying inside that transaction. The review found that the async HA mode's automatic failover fence
moved a person's parked intents (fixed: it leaves terminal states to a person)."""

from __future__ import annotations

import multiprocessing
import os
import threading

import pytest
import sqlalchemy as sa

import atmostonce
from atmostonce.audit import verify_store
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig
from atmostonce.transport import Capabilities, Found, NotFound, Sent

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, first_look_after=0)


# ---------------------------------------------------------------- helpers


class Platform:
    """An in-memory platform that counts every send by delivery key; lookups find what was sent under a key."""

    name, protocol_version = "memory-platform", 1

    def __init__(self, lookup=True):
        self.objects: dict[str, dict] = {}
        self.by_key: dict[str, list[str]] = {}
        self.lock = threading.Lock()
        self.capabilities = Capabilities(read_back=True, lookup_by_key=lookup, fenced_lookup=False)

    def send(self, wire):
        with self.lock:
            rid = f"r{len(self.objects) + 1}"
            self.objects[rid] = dict(wire.body)
            self.by_key.setdefault(wire.delivery_key, []).append(rid)
        return Sent(rid, response_digest="d")

    def read_back(self, remote_id):
        body = self.objects.get(remote_id)
        return NotFound() if body is None else Found(remote_id, body)

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        rids = self.by_key.get(delivery_key)
        return Found(rids[0], self.objects[rids[0]]) if rids else NotFound()

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


def _to_parked_after_unknown(s, text, max_reconciles=1, **kw):
    """A fresh intent sent with an unknown outcome, its lookups spent, parked by the reconciler."""
    it = s.submit("acct", "post", "room-1", {"text": text}, max_reconciles=max_reconciles, **kw)
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest, send_lease_seconds=30)
    s.record_unknown(lease, reason="read timeout")
    for _ in range(max_reconciles):
        s.reconcile_not_found(s.get(it.key).plan)
    parked = s.park_unreconcilable(s.get(it.key).plan, reason="reconcile.budget_spent")
    assert parked.state == "parked" and parked.reconcile_count == parked.max_reconciles
    return parked


def _sqlite_url(tmp_path, name="outbox.sqlite3"):
    return f"sqlite:///{tmp_path / name}"


# ================================================================ 1. restore fences parked intents


def test_a_restore_moves_a_parked_intent_with_its_budget_spent_to_indeterminate_with_one_lookup_left(any_store):
    s = any_store.store
    parked = _to_parked_after_unknown(s, "spent", max_reconciles=2)
    epoch, fenced = s.declare_restore(operator="alice")
    after = s.get(parked.key)
    assert fenced == 1
    assert (after.state, after.reconcile_count, after.max_reconciles) == ("indeterminate", 2, 3)
    assert (after.attempt_token, after.lease_expires_at) == (None, None)
    last = s.history(parked.key)[-1]
    assert (last.event, last.from_state, last.to_state, last.actor) == (
        "restore_fence",
        "parked",
        "indeterminate",
        "operator:alice",
    )
    assert verify_store(s).breaks == ()


def test_a_restore_never_lowers_a_parked_intents_reconcile_budget(any_store):
    """A parked intent an operator stopped with lookups left keeps its budget (grant_reconcile never lowers)."""
    s = any_store.store
    it = s.submit("acct", "post", "room-1", {"text": "stopped"}, max_reconciles=7)
    s.park(it.key, operator="bob")
    s.declare_restore(operator="alice")
    after = s.get(it.key)
    assert (after.state, after.reconcile_count, after.max_reconciles) == ("indeterminate", 0, 7)


def test_a_restore_fences_parked_pending_authorized_and_failed_and_leaves_settled_intents(any_store):
    s = any_store.store
    parked = _to_parked_after_unknown(s, "p")
    pend = s.submit("acct", "post", "room-1", {"text": "q"})
    pub = s.submit("acct", "post", "room-1", {"text": "r"})
    lease = s.begin(pub.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=pub.request_digest)
    s.record_success(lease, remote_id="x")
    s.confirm_read_back(lease)
    _, fenced = s.declare_restore(operator="alice")
    assert fenced == 2
    assert [s.get(k).state for k in (parked.key, pend.key, pub.key)] == ["indeterminate", "indeterminate", "published"]


def test_the_lookup_a_restore_leaves_a_parked_approval_gated_intent_settles_it_and_frees_its_claim(any_store):
    """A parked approval-gated intent keeps its target's claim uncertain; after the restore the one lookup
    finds the object, the intent is published and the claim is free (settled by evidence, never resent)."""
    s = any_store.store
    it = s.submit("acct", "post", "room-9", {"text": "gated"}, requires_approval=True, max_reconciles=1)
    apv = s.approve(it.key, approver="alice", expires_in=600)
    claim = s.reserve_claim(it.key, approval_id=apv.approval_id, request_digest=it.request_digest, owner="w1")
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    s.record_unknown(lease, reason="timeout")
    s.reconcile_not_found(s.get(it.key).plan)
    s.park_unreconcilable(s.get(it.key).plan, reason="reconcile.budget_spent")
    assert (s.claim("room-9").state, s.claim("room-9").key) == ("uncertain", it.key)

    _, fenced = s.declare_restore(operator="alice")
    fenced_it = s.get(it.key)
    assert (fenced, fenced_it.state) == (1, "indeterminate")
    assert (s.claim("room-9").state, s.claim("room-9").key) == ("uncertain", it.key)  # not fence_claim'd
    found = s.reconcile_found(fenced_it.plan, remote_id="obj-1")
    assert (found.state, found.remote_id) == ("published", "obj-1")
    c = s.claim("room-9")
    assert (c.state, c.key) == ("free", None)
    assert verify_store(s).breaks == ()


def test_the_reconciler_looks_once_after_a_restore_then_parks_again_without_sending(tmp_path):
    store = atmostonce.open_store(_sqlite_url(tmp_path))
    try:
        parked = _to_parked_after_unknown(store, "blind")
        store.declare_restore(operator="alice")
        platform = Platform()
        out = Reconciler(store, platform, CONFIG).run()
        assert out.get("lookup.not_found", 0) + out.get("lookup.not_found_before_restore", 0) == 1
        assert store.get(parked.key).state == "indeterminate"
        out = Reconciler(store, platform, CONFIG).run()
        assert out == {"reconcile.budget_spent": 1}
        after = store.get(parked.key)
        assert after.state == "parked"
        assert platform.by_key == {}  # nothing was sent by the machine
    finally:
        store.close()


@pytest.mark.postgres
def test_an_automatic_async_failover_fence_leaves_a_persons_parked_intent_to_a_person(pg_url):
    """docs/design.md: "A person's parked is still left only by a person: declaring a restore is an operator's
    command", and the failover section says the async fence moves pending, authorized or failed intents. The
    async fence runs by itself on a store's first connection to a new timeline (actor operator:failover), and
    shares _declare_restore_in, which now fences parked intents too."""
    from atmostonce_sql import open_store

    store = open_store(pg_url)
    parked = _to_parked_after_unknown(store, "parked before the failover")
    pend = store.submit("acct", "post", "room-1", {"text": "queued before the failover"})
    with store.engine.begin() as conn:  # the database saw an older timeline: the server was promoted since
        conn.execute(
            sa.text(
                "INSERT INTO aom_failovers (timeline, kind, mode, recorded_at) VALUES (0, 'first_seen', 'async', 0)"
            )
        )
    store.close()
    ha = open_store(pg_url, ha="async")
    try:
        ha.now()  # the first use: the fence runs here
        [*_, row] = ha.failovers()
        assert (row["kind"], row["mode"]) == ("failover", "async")
        assert ha.get(pend.key).state == "indeterminate"  # queued work is fenced, as documented
        after = ha.get(parked.key)
        moves = [(h.event, h.actor) for h in ha.history(parked.key)][-1]
        assert after.state == "parked", f"the automatic failover fence moved a parked intent: {moves}"
        assert row["fenced"] == 1
    finally:
        ha.close()


def test_a_database_migrated_before_0017_refuses_the_whole_declaration_and_fences_parked_work_once_upgraded(tmp_path):
    """A store at 0016 (its move guard without parked -> indeterminate) refuses the declaration as a whole:
    nothing fenced, the epoch unchanged; migration 0017 reinstalls the guard and the declaration then fences."""
    from atmostonce.errors import StoreError
    from atmostonce_sql import make_engine, open_store
    from atmostonce_sql.migrate import upgrade
    from atmostonce_sql.moves import move_guard_statements

    url = _sqlite_url(tmp_path)
    engine = make_engine(url)
    upgrade(engine, "0016")
    with engine.begin() as conn:  # the guard as 0006 installed it from the table before the change
        for stmt in move_guard_statements("sqlite"):
            conn.exec_driver_sql(stmt.replace("'parked>indeterminate', ", ""))
    engine.dispose()
    old = open_store(url, migrate=False)
    it = old.submit("acct", "post", "room-1", {"text": "stopped"})
    old.park(it.key, operator="bob")
    with pytest.raises(StoreError):
        old.declare_restore(operator="alice")
    assert (old.current_epoch(), old.get(it.key).state) == (1, "parked")
    old.close()
    new = open_store(url)
    try:
        assert new.declare_restore(operator="alice") == (2, 1)
        assert new.get(it.key).state == "indeterminate"
    finally:
        new.close()


# ================================================================ 2. SQLite: a publish created already authorized


def _steps_for(store, text, target="room-1", body=None, **kw):
    from atmostonce.records import prepare_submission
    from atmostonce.store import _authorization_steps

    request = {"text": text} if body is None else dict(body, caption=text)
    sub = prepare_submission("acct", "post", target, request, max_payload_bytes=store.max_payload_bytes, **kw)
    steps = _authorization_steps(
        15, 45, request_digest=sub.request_digest, descriptor={"wire": "é😀"}, platform="memory-platform"
    )
    return sub, steps


def _row_counts(store):
    tables = ["aom_intents", "aom_history", "aom_attempts", "aom_text_claims", "aom_reconciliations"]
    with store.engine.connect() as conn:
        out = {t: conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar_one() for t in tables}
        gen = "SELECT value FROM aom_sequences WHERE name = 'generation'"
        return out | {"generation": conn.exec_driver_sql(gen).scalar_one()}


def _text_claims(store, key):
    with store.engine.connect() as conn:
        q = "SELECT account, text_hash, start_at, end_at, released FROM aom_text_claims WHERE key = :k"
        return [dict(r) for r in conn.execute(sa.text(q), {"k": key}).mappings()]


OWN = {"key", "request", "request_digest", "text_hash", "attempt_token", "generation"}
TIMES = {"created_at", "updated_at", "lease_expires_at"}


def _fields(it):
    return {k: v for k, v in vars(it).items() if k not in OWN | TIMES}


@pytest.mark.parametrize(
    "text, kw",
    [
        ("plain", {}),
        ("ünïcödé 😀 \u202e mixed", {"max_attempts": 1}),
        ("long " + "x" * 60_000, {"max_reconciles": 1}),
        ("sourced", {"source": True}),
        ("no text field", {"body": {"image": "a.png", "alt": "ß"}}),
    ],
    ids=["plain", "unicode-max-attempts-1", "long-text", "source-version", "no-text-hash"],
)
def test_sqlite_created_as_authorized_returns_and_stores_what_the_stepwise_path_does(sqlite_store, text, kw):
    s = sqlite_store
    if kw.pop("source", False):
        kw["source"] = ("src-1", s.capture_source("src-1", "the body").version)
    sub, steps = _steps_for(s, text, **kw)
    made, (begun, authorized) = s.core._create_and_apply(sub, steps)
    sub2, steps2 = _steps_for(s, text + " (stepwise)", **kw)
    made2, _ = s.core._create(sub2)
    begun2, authorized2 = s._moves(sub2.key, steps2)

    for one, two in [(made, made2), (begun, begun2), (authorized, authorized2)]:
        assert _fields(one) == _fields(two)
        assert (one.attempt_token is None, one.generation is None) == (
            two.attempt_token is None,
            two.generation is None,
        )
        assert (one.lease_expires_at is None) == (two.lease_expires_at is None)
    # one creation time; each lease counted from its own move's clock reading
    assert made.created_at == begun.created_at == authorized.created_at
    assert made.updated_at <= begun.updated_at <= authorized.updated_at
    assert begun.lease_expires_at == pytest.approx(begun.updated_at + 15)
    assert authorized.lease_expires_at == pytest.approx(authorized.updated_at + 45)
    # returned rows are the stored ones
    stored = s.get(sub.key)
    assert vars(stored) == vars(authorized)

    # what is stored beside it is what the stepwise path stores
    def shape(key):
        hist = [
            (h.event, h.actor, h.from_state, h.to_state, h.attempt_token is not None, h.generation)
            for h in s.history(key)
        ]
        atts = [
            (a.number, a.outcomes, a.resend_epoch, a.fence_epoch, a.generation == s.get(key).generation)
            for a in s.attempts(key)
        ]
        return hist, atts

    (h1, a1), (h2, a2) = shape(sub.key), shape(sub2.key)
    assert [x[:5] for x in h1] == [x[:5] for x in h2]
    assert [x[5] is None for x in h1] == [x[5] is None for x in h2]
    assert h1[1][5] == h1[2][5] == authorized.generation
    assert a1 == a2
    assert [h.detail for h in s.history(sub.key)] == [h.detail for h in s.history(sub2.key)]
    assert made.created_at <= s.attempts(sub.key)[0].opened_at <= authorized.updated_at
    if made.text_hash is None:
        assert _text_claims(s, sub.key) == _text_claims(s, sub2.key) == []
    else:
        [claim] = _text_claims(s, sub.key)
        assert claim["start_at"] >= authorized.updated_at and claim["released"] in (0, False)
        assert len(_text_claims(s, sub2.key)) == 1
    assert verify_store(s).breaks == ()


@pytest.mark.parametrize(
    "refusal",
    ["kill_switch", "duplicate_text", "rate_limit", "stale_source", "stale_credential", "key_taken", "approval_gated"],
)
def test_sqlite_a_refused_creation_as_authorized_writes_nothing_and_the_usual_path_names_the_refusal(
    sqlite_store, refusal
):
    s = sqlite_store
    platform = Platform()
    d = Dispatcher(s, platform, CONFIG, credential_version=lambda account: "v1")
    kw = {}
    if refusal == "stale_credential":
        s.set_credential_version("acct", "v2")
    elif refusal == "approval_gated":
        s.submit("acct", "post", "room-1", {"text": "T"}, requires_approval=True)
    elif refusal == "kill_switch":
        s.set_kill_switch("account:acct", True, operator="ops")
    elif refusal == "duplicate_text":
        assert d.publish("acct", "post", "room-0", {"text": "T"})[1] == "read_back.match"
    elif refusal == "rate_limit":
        s.set_rate_limit("acct", 1, window_seconds=600, operator="ops")
        assert d.publish("acct", "post", "room-0", {"text": "other"})[1] == "read_back.match"
    elif refusal == "stale_source":
        v1 = s.capture_source("src", "one").version
        s.capture_source("src", "two")
        kw = {"source": ("src", v1)}
    elif refusal == "key_taken":
        assert d.publish("acct", "post", "room-1", {"text": "T"})[1] == "read_back.match"
    before = _row_counts(s)
    sub, steps = _steps_for(s, "T", **kw)
    assert s.core._create_and_apply(sub, steps) is None
    assert _row_counts(s) == before
    sends = sum(map(len, platform.by_key.values()))
    if refusal == "key_taken":
        with pytest.raises(atmostonce.Rejected) as e:
            d.publish("acct", "post", "room-1", {"text": "T"}, **kw)
        assert (e.value.event, e.value.guard) == ("begin", "source_state")
    elif refusal == "approval_gated":
        with pytest.raises(atmostonce.IntakeError):
            d.publish("acct", "post", "room-1", {"text": "T"}, **kw)
        assert s.get(sub.key).state == "pending" and s.attempts(sub.key) == []
    else:
        expected = {
            "kill_switch": "gate.paused",
            "duplicate_text": "gate.blocked",
            "rate_limit": "gate.rate_limited",
            "stale_source": "gate.stale_source",
            "stale_credential": "gate.blocked",
        }[refusal]
        assert d.publish("acct", "post", "room-1", {"text": "T"}, **kw)[1] == expected
    assert sum(map(len, platform.by_key.values())) == sends  # nothing more was sent
    assert verify_store(s).breaks == ()


# ---------------------------------------------------------------- concurrency on one SQLite file


def _authorizations(store, key):
    return [h for h in store.history(key) if h.event == "authorize_dispatch"]


def _publish_together(url, n, request_for):
    """``n`` threads, each with its own store on the file at ``url``, publish at once; returns their results
    (the outcome, or the refusal's (event, guard)) and the shared platform."""
    platform = Platform()
    stores = [atmostonce.open_store(url) for _ in range(n)]
    barrier = threading.Barrier(n)
    results: list = [None] * n

    def run(i):
        barrier.wait()
        try:
            results[i] = Dispatcher(stores[i], platform, CONFIG).publish(*request_for(i))
        except atmostonce.Rejected as exc:
            results[i] = (exc.event, exc.guard)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for st in stores:
        st.close()
    return results, platform


def test_sqlite_one_delivery_published_from_several_threads_at_once_is_authorized_and_sent_once(tmp_path):
    url = _sqlite_url(tmp_path)
    atmostonce.open_store(url).close()
    results, platform = _publish_together(url, 4, lambda i: ("acct", "post", "room-1", {"text": "the same delivery"}))
    store = atmostonce.open_store(url)
    try:
        [key] = {it.key for it in store.list_intents(limit=10)}
        assert [len(v) for v in platform.by_key.values()] == [1]
        assert len(_authorizations(store, key)) == 1
        assert sum(1 for r in results if isinstance(r, tuple) and r[1] == "read_back.match") == 1
        assert store.get(key).state == "published"
        assert verify_store(store).breaks == ()
    finally:
        store.close()


def test_sqlite_one_text_published_to_several_targets_from_threads_at_once_is_sent_once_in_its_window(tmp_path):
    url = _sqlite_url(tmp_path)
    atmostonce.open_store(url).close()
    results, platform = _publish_together(url, 4, lambda i: ("acct", "post", f"room-{i}", {"text": "one text"}))
    store = atmostonce.open_store(url)
    try:
        keys = [it.key for it in store.list_intents(limit=10)]
        assert len(keys) == 4
        assert sum(map(len, platform.by_key.values())) == 1
        assert sum(len(_authorizations(store, k)) for k in keys) == 1
        with store.engine.connect() as conn:
            live = conn.exec_driver_sql("SELECT count(*) FROM aom_text_claims WHERE NOT released").scalar_one()
        assert live == 1
        assert sorted(r[1] for r in results) == ["gate.blocked"] * 3 + ["read_back.match"]
        assert verify_store(store).breaks == ()
    finally:
        store.close()


def test_sqlite_a_kill_switch_engaged_while_threads_publish_stops_every_later_creation(tmp_path):
    """The switch and the creations serialize on the file: every intent created after the switch's commit is
    held, none authorized; those before it are authorized once."""
    url = _sqlite_url(tmp_path)
    atmostonce.open_store(url).close()
    ops = atmostonce.open_store(url)
    platform = Platform()
    stores = [atmostonce.open_store(url) for _ in range(3)]
    barrier = threading.Barrier(4)
    outcomes: list[str] = []

    def run(i):
        barrier.wait()
        for j in range(5):
            outcomes.append(
                Dispatcher(stores[i], platform, CONFIG).publish("acct", "post", "room", {"text": f"{i}-{j}"})[1]
            )

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    barrier.wait()
    ops.set_kill_switch("global", True, operator="ops")
    switched_at = max(ops.policy_changes(), key=lambda c: c.seq).recorded_at
    for t in threads:
        t.join(60)
    try:
        assert len(outcomes) == 15 and set(outcomes) <= {"read_back.match", "gate.paused"}
        sent = {k for k, v in platform.by_key.items() if v}
        for it in ops.list_intents(limit=100):
            auths = _authorizations(ops, it.key)
            assert len(auths) == (1 if it.key in sent else 0)
            if auths:
                assert auths[0].recorded_at <= switched_at
        assert all(len(v) == 1 for v in platform.by_key.values())
        assert verify_store(ops).breaks == ()
    finally:
        for st in stores:
            st.close()
        ops.close()


class FilePlatform(Platform):
    """The platform of several processes: each send is a line in a file (O_APPEND), read back from it."""

    def __init__(self, path):
        super().__init__()
        self.path = path

    def _lines(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            return [line.rstrip("\n").split("\t") for line in f if line.strip()]

    def send(self, wire):
        rid = f"{os.getpid()}-{threading.get_ident()}-{len(self._lines())}"
        with open(self.path, "a") as f:
            f.write(f"{rid}\t{wire.delivery_key}\t{wire.body.get('text')}\n")
        return Sent(rid, response_digest="d")

    def read_back(self, remote_id):
        for rid, _, text in self._lines():
            if rid == remote_id:
                return Found(rid, {"text": text})
        return NotFound()

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        for rid, key, text in self._lines():
            if key == delivery_key:
                return Found(rid, {"text": text})
        return NotFound()


def _publish_in_process(url, sends, target, text, start):
    start.wait(30)
    store = atmostonce.open_store(url)
    try:
        Dispatcher(store, FilePlatform(sends), CONFIG).publish("acct", "post", target, {"text": text})
    except atmostonce.Rejected:
        pass
    finally:
        store.close()


def test_sqlite_one_delivery_and_one_text_published_from_several_processes_are_sent_once(tmp_path):
    url, sends = _sqlite_url(tmp_path), str(tmp_path / "sends.tsv")
    atmostonce.open_store(url).close()
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    jobs = [("room-1", "same delivery")] * 2 + [(f"other-{i}", "same text") for i in range(2)]
    procs = [ctx.Process(target=_publish_in_process, args=(url, sends, t, x, start)) for t, x in jobs]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)
    lines = FilePlatform(sends)._lines()
    assert sorted(text for _, _, text in lines) == ["same delivery", "same text"]
    store = atmostonce.open_store(url)
    try:
        assert sum(len(_authorizations(store, it.key)) for it in store.list_intents(limit=10)) == 2
        assert verify_store(store).breaks == ()
    finally:
        store.close()


# ---------------------------------------------------------------- crashes inside the creating transaction


def _publish_and_die(url, sends, after):
    """Publish, and end the process (no cleanup, no commit) inside the creating transaction: right after the
    statement that inserts the intent (``after="insert"``) or when that transaction is about to commit, every
    statement of it sent (``after="appends"``)."""
    import sqlalchemy.engine.default as default

    from atmostonce_sql.execution import Executor

    run = Executor.run_sqlite

    def dying(self, conn, stmts, name, params, fetch=True):
        out = run(self, conn, stmts, name, params, fetch)
        if after == "insert" and name == "insert" and "existing" in stmts:  # the creating statement
            os._exit(9)
        return out

    def commit_never(self, dbapi_connection):
        os._exit(9)

    store = atmostonce.open_store(url)
    Executor.run_sqlite = dying
    if after == "appends":
        default.DefaultDialect.do_commit = commit_never  # the publish's first commit is the creating transaction
    Dispatcher(store, FilePlatform(sends), CONFIG).publish("acct", "post", "room-1", {"text": "crash"})
    os._exit(0)  # pragma: no cover  (the publish never gets here)


@pytest.mark.parametrize("after", ["insert", "appends"])
def test_sqlite_a_process_dying_inside_the_creating_transaction_leaves_nothing_and_a_retry_sends_once(tmp_path, after):
    url, sends = _sqlite_url(tmp_path), str(tmp_path / "sends.tsv")
    atmostonce.open_store(url).close()
    ctx = multiprocessing.get_context("spawn")
    p = ctx.Process(target=_publish_and_die, args=(url, sends, after))
    p.start()
    p.join(120)
    assert p.exitcode == 9
    store = atmostonce.open_store(url)
    try:
        assert _row_counts(store) == {
            "aom_intents": 0,
            "aom_history": 0,
            "aom_attempts": 0,
            "aom_text_claims": 0,
            "aom_reconciliations": 0,
            "generation": 0,
        }
        platform = FilePlatform(sends)
        key, outcome = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "crash"})
        assert outcome == "read_back.match"
        assert [k for _, k, _ in platform._lines()] == [key]
        assert [h.event for h in store.history(key)] == [
            "submit",
            "begin",
            "authorize_dispatch",
            "record_success",
            "confirm_read_back",
        ]
        assert verify_store(store).breaks == ()
    finally:
        store.close()
