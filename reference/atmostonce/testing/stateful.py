"""The shipped stateful conformance machine (Hypothesis ``RuleBasedStateMachine``).

One machine, constructed with a store under test, applies every operation to
the reference model and to that store, and after every step checks that both
agree (states, attempt counts, which guard refused) and that the protocol
invariants hold on both (docs/design.md#one-table-read-by-everything, docs/design.md#testing).
Rules include injected faults: a worker that dies after ``begin``, after
``authorize_dispatch`` or after the send; sweeper passes at arbitrary times;
the database clock moving forward; stale workers presenting old leases.

Use it from any test suite (zarr.testing-style)::

    from atmostonce.testing.stateful import StoreUnderTest, make_machine
    TestMyStore = make_machine(lambda: StoreUnderTest(my_store, advance=my_advance)).TestCase

The machine owns the clock it compares. Give ``set_clock(t)`` when the store's clock can be set
(``atmostonce_sql.testing.SetClockStore`` does it for the SQL stores): the machine then sets the
store's clock to the model's at the start of every example and after every clock step, so no
judgement (a due lease, an expired approval, a rate window) moves with real time. Otherwise
``advance(seconds)`` must move the store's clock forward by ``seconds`` as far as lease and expiry
judgements go (a SQL store may age its deadlines instead); real time then still passes under the
store, and a lease judged within the wall time of a step may differ from the model's.
Every strategy draws from the model's state only, never from the store's, so a replayed example
draws the same values whatever the store does. With no store factory the machine checks the model alone.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ..errors import Rejected
from ..model import MemoryStore
from ..names import ACTOR, EVENT, STATE
from ..records import Intent, Lease
from ..store import Store

__all__ = ["FakeClock", "StoreUnderTest", "make_machine"]

ACCOUNTS = ("acct-a", "acct-b")
KINDS = ("post", "like")
TARGETS = ("t1", "t2")
TEXTS = ("hello", "hello ", "other")


class FakeClock:
    """A clock the test moves by hand (seconds)."""

    def __init__(self, start: float = 1_000_000.0):
        self.t = start

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


@dataclass
class StoreUnderTest:
    """A store plus the hook that moves its clock; ``close`` runs after each example."""

    store: Store
    advance: Callable[[float], None] | None = None
    close: Callable[[], None] = lambda: None
    set_clock: Callable[[float], None] | None = None
    """Sets the store's clock to ``t`` (float seconds since the Unix epoch); preferred over ``advance``."""

    def __post_init__(self) -> None:
        if self.advance is None and self.set_clock is None:
            raise TypeError("a store under test needs set_clock (preferred) or advance")


def _has_evidence(sut: Any) -> bool:
    """The implementation keeps late outcomes: it declares the ``evidence`` feature, or (declaring none)
    its store has ``record_late_outcome`` and ``evidence``."""
    declared = getattr(sut, "features", None)
    if declared is not None:
        return "evidence" in declared
    return all(callable(getattr(sut.store, m, None)) for m in ("record_late_outcome", "evidence"))


def _clock_moved(sut: Any, now: float, seconds: float) -> None:
    """The machine's clock moved by ``seconds`` to ``now``: move the store's the same way. ``sut`` is a
    :class:`StoreUnderTest` or anything with ``advance`` (and optionally ``set_clock``), such as the
    conformance suite's ``Implementation``."""
    set_clock = getattr(sut, "set_clock", None)
    if set_clock is not None:
        set_clock(now)
    elif seconds:
        sut.advance(seconds)


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", fn()
    except Rejected as exc:
        return type(exc).__name__, exc.guard


_COMPARED = (
    "state",
    "attempt_count",
    "remote_id",
    "reconcile_count",
    "resend_epoch",
    "fence_epoch",
    "max_attempts",
    "epoch",
    "request",
)
"""Compared between the model and the store. The identities (key, request digest, text key) are the
store's own, held to the shipped identity vectors by the conformance cases: the machine maps the
model's keys to the store's (one request, one key on each side) instead of assuming they are equal."""


def _same_intent(a: Intent, b: Intent) -> list[str]:
    diffs = [
        f"{f}: model={getattr(a, f)!r} store={getattr(b, f)!r}" for f in _COMPARED if getattr(a, f) != getattr(b, f)
    ]
    if (a.attempt_token is None) != (b.attempt_token is None):
        diffs.append(f"open attempt: model={a.attempt_token is not None} store={b.attempt_token is not None}")
    if (a.lease_expires_at is None) != (b.lease_expires_at is None):
        diffs.append("lease presence differs")
    return diffs


def make_machine(factory: Callable[[], StoreUnderTest] | None = None) -> type[RuleBasedStateMachine]:
    """Build the machine class; ``factory()`` gives a fresh, empty store under test per example."""

    class AtMostOnceMachine(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.clock = FakeClock()
            self.model = MemoryStore(clock=self.clock)
            self.sut: StoreUnderTest | None = None

        @initialize()
        def reset(self) -> None:
            self.model.reset()
            if factory is not None:
                self.sut = factory()
                _clock_moved(self.sut, self.clock(), 0.0)
            self.keys: list[str] = []
            # model key -> the store's own key for the same request: identities are the store's, checked
            # against the shipped vectors by the cases, never assumed byte-equal to the model's
            self.kmap: dict[str, str] = {}
            # key -> (model lease, store lease) for the live worker; stale ones kept for replay
            self.live: dict[str, tuple[Lease, Lease | None]] = {}
            self.stale: list[tuple[Lease, Lease | None]] = []
            # plans taken before the last declared restore (model plan, store plan)
            self.pre_restore_plans: list[tuple[Any, Any]] = []
            self.history_len: dict[str, int] = {}
            self.attempt_len: dict[str, int] = {}
            # late outcomes (docs/design.md#late-outcomes-are-evidence) are checked only on a store that has them
            self.has_evidence = self.sut is None or _has_evidence(self.sut)

        def teardown(self) -> None:
            try:
                if self.store is not None:
                    self.audits_agree()
            finally:
                if self.sut is not None:
                    self.sut.close()

        def audits_agree(self) -> None:
            """At the end of a run: both histories verify as hash chains, and both stores wrote the same
            reconciliation records, each joined to the same history row (append-only, so the final
            records include every record ever written)."""
            stores = (self.model, self.store)
            if not all(hasattr(st_, "audit_chain") for st_ in stores):
                return
            from atmostonce.audit import verify_store

            for i, st_ in enumerate(stores):
                assert st_ is not None  # audit_chain was found on both
                report = verify_store(st_, [self.k(k, i) for k in self.keys])
                assert report.intact, f"audit chain broken in {type(st_).__name__}: {report.breaks}"

            def records(st_, key):
                where = {h.seq: i for i, h in enumerate(st_.history(key))}
                return [(r.event, r.result, where.get(r.send_seq)) for r in st_.reconciliations(key)]

            for key in self.keys:
                assert records(self.model, key) == records(self.store, self.k(key, 1)), (
                    f"{key[:12]}: reconciliations differ"
                )

        # -- helpers ------------------------------------------------------------------
        def k(self, key: str, i: int) -> str:
            """``key`` (a model key) as store ``i`` knows it: 0 the model, 1 the store under test."""
            return key if i == 0 else self.kmap.get(key, key)

        def digest(self, st_: Store, key: str, i: int) -> str:
            """The request digest store ``i`` computed for model key ``key`` (its own identity function)."""
            return st_.get(self.k(key, i)).request_digest

        def back(self, store_key: str) -> str:
            """The model key of a store key."""
            for mk, sk in self.kmap.items():
                if sk == store_key:
                    return mk
            return store_key

        def learn(self, model_key: str, store_key: str) -> None:
            """The store answered ``store_key`` where the model answered ``model_key``: one request, one key
            on both sides (the same request twice gives the same key; two requests never share one)."""
            known = self.kmap.get(model_key)
            assert known in (None, store_key), "the store gave one request two delivery keys"
            assert known is not None or store_key not in self.kmap.values(), "the store gave two requests one key"
            self.kmap[model_key] = store_key

        @property
        def store(self) -> Store | None:
            return None if self.sut is None else self.sut.store

        def both(self, op: Callable[[Store, int], Any]) -> tuple[tuple[str, Any], tuple[str, Any] | None]:
            m = _outcome(lambda: op(self.model, 0))
            store = self.store
            s = None if store is None else _outcome(lambda: op(store, 1))
            if s is not None:
                assert m[0] == s[0], f"model {m} vs store {s}"
                if m[0] != "ok":
                    assert m[1] == s[1], f"refusing guard: model {m[1]} vs store {s[1]}"
            return m, s

        def lease_of(self, key: str) -> tuple[Lease, Lease | None] | None:
            return self.live.get(key)

        def pick(self, data, *states: str, where: Callable[[Intent], bool] | None = None) -> str | None:
            """A key whose model state is one of ``states`` (mostly), or any key (sometimes, to probe refusals)."""
            if not self.keys:
                return None
            fitting = [
                k
                for k in self.keys
                if (not states or self.model.get(k).state in states) and (where is None or where(self.model.get(k)))
            ]
            if fitting and data.draw(st.integers(0, 7), label="fitting") > 0:
                return data.draw(st.sampled_from(fitting), label="key")
            return data.draw(st.sampled_from(self.keys), label="any key")

        # -- intake -------------------------------------------------------------------
        @rule(
            account=st.sampled_from(ACCOUNTS),
            kind=st.sampled_from(KINDS),
            tgt=st.sampled_from(TARGETS),
            text=st.sampled_from(TEXTS),
            max_attempts=st.integers(1, 3),
        )
        def submit(self, account, kind, tgt, text, max_attempts):
            req = {"text": text} if kind == "post" else {}
            (m, mi), s = self.both(
                lambda st_, i: st_.submit(account, kind, tgt, req, max_attempts=max_attempts, max_reconciles=2)
            )
            assert m == "ok"
            if s is not None:
                self.learn(mi.key, s[1].key)
            if mi.key not in self.keys:
                self.keys.append(mi.key)

        # -- worker -------------------------------------------------------------------
        @precondition(lambda self: self.keys)
        @rule(data=st.data(), lease=st.sampled_from([10, 30]))
        def begin(self, data, lease):
            key = self.pick(data, STATE.pending, where=lambda it: it.attempt_token is None)
            (m, ml), s = self.both(lambda st_, i: st_.begin(self.k(key, i), lease_seconds=lease))
            if m == "ok":
                old = self.live.pop(key, None)
                if old is not None:
                    self.stale.append(old)
                self.live[key] = (ml, s[1] if s else None)

        @precondition(lambda self: self.keys)
        @rule(
            data=st.data(),
            ending=st.sampled_from(
                ["published", "read_back_failed", "not_sent", "unknown", "dies_after_begin", "dies_after_authorize"]
            ),
        )
        def dispatch_flow(self, data, ending):
            """A whole dispatch in one rule: begin, authorize, send, record (or a crash on the way)."""
            key = self.pick(data, STATE.pending, where=lambda it: it.attempt_token is None)
            (m, ml), s = self.both(lambda st_, i: st_.begin(self.k(key, i), lease_seconds=30))
            if m != "ok":
                return
            pair = (ml, s[1] if s else None)
            if ending == "dies_after_begin":
                self.stale.append(pair)
                return
            (m, g), _ = self.both(
                lambda st_, i: st_.authorize_dispatch(
                    pair[i], request_digest=self.digest(st_, key, i), send_lease_seconds=30
                )
            )
            if m != "ok":  # only a policy gate, or the account's full rate window, may refuse a fresh lease
                if g in self.model.table.waiting_guards:  # a wait, not a block: the rate window is full
                    assert self.model.rate_limited(self.model.get(key).account), "refused by a rate window with room"
                else:
                    assert g in self.model.table.policy_guards, f"a fresh lease was refused by {g}"
                self.live[key] = pair
                return
            if ending == "dies_after_authorize":
                self.stale.append(pair)
                return
            if ending in ("published", "read_back_failed"):
                self.both(lambda st_, i: st_.record_success(pair[i], remote_id=f"r-{key[:8]}"))
                if ending == "published":
                    self.both(lambda st_, i: st_.confirm_read_back(pair[i]))
                else:
                    self.both(lambda st_, i: st_.read_back_failed(pair[i], reason="read_back.differs"))
            elif ending == "not_sent":
                self.both(lambda st_, i: st_.record_not_sent(pair[i], reason="connect refused"))
            else:
                self.both(lambda st_, i: st_.record_unknown(pair[i], reason="read timeout"))
            self.stale.append(pair)

        def _live_pair(self, data, *states: str) -> tuple[Lease, Lease | None]:
            keys = sorted(self.live)
            fitting = [k for k in keys if self.model.get(k).state in states]
            return self.live[data.draw(st.sampled_from(fitting or keys), label="live key")]

        @precondition(lambda self: self.live)
        @rule(data=st.data(), good_digest=st.sampled_from([True, True, True, False]))
        def authorize(self, data, good_digest):
            pair = self._live_pair(data, STATE.pending)
            m, _ = self.both(
                lambda st_, i: st_.authorize_dispatch(
                    pair[i],
                    request_digest=self.digest(st_, pair[0].key, i) if good_digest else "0" * 64,
                    send_lease_seconds=30,
                )
            )
            if not good_digest:
                assert m[0] != "ok", "authorized bytes that differ from the intent's request"

        @precondition(lambda self: self.stale)
        @rule(data=st.data())
        def stale_worker_authorizes(self, data):
            pair = data.draw(st.sampled_from(self.stale))
            current = self.model.get(pair[0].key).attempt_token == pair[0].attempt_token
            m, _ = self.both(
                lambda st_, i: st_.authorize_dispatch(pair[i], request_digest=self.digest(st_, pair[0].key, i))
            )
            assert current or m[0] != "ok", "a superseded lease was authorized"

        @precondition(lambda self: self.live)
        @rule(
            data=st.data(),
            what=st.sampled_from(["success", "not_sent", "unknown", "confirm", "read_back_failed", "block"]),
        )
        def record(self, data, what):
            ops = {
                "success": lambda st_, lease: st_.record_success(lease, remote_id=f"r-{self.back(lease.key)[:8]}"),
                "not_sent": lambda st_, lease: st_.record_not_sent(lease, reason="refused"),
                "unknown": lambda st_, lease: st_.record_unknown(lease, reason="timeout"),
                "confirm": lambda st_, lease: st_.confirm_read_back(lease),
                "read_back_failed": lambda st_, lease: st_.read_back_failed(lease, reason="read_back.not_found"),
                "block": lambda st_, lease: st_.block_at_gate(lease, reason="gate.blocked"),
            }
            pair = self._live_pair(data, STATE.pending if what == "block" else STATE.authorized)
            self.both(lambda st_, i: ops[what](st_, pair[i]))

        @precondition(lambda self: self.stale)
        @rule(data=st.data(), what=st.sampled_from(["success", "not_sent", "unknown"]))
        def stale_worker_records(self, data, what):
            ops = {
                "success": lambda st_, lease: st_.record_success(lease, remote_id="stale"),
                "not_sent": lambda st_, lease: st_.record_not_sent(lease, reason="stale"),
                "unknown": lambda st_, lease: st_.record_unknown(lease, reason="stale"),
            }
            pair = data.draw(st.sampled_from(self.stale))
            current = (
                self.model.get(pair[0].key).attempt_token == pair[0].attempt_token
                and pair[0].epoch == self.model.current_epoch()
            )
            m, _ = self.both(lambda st_, i: ops[what](st_, pair[i]))
            assert current or m[0] != "ok", "a superseded worker's write was accepted (fenced on epoch and generation)"
            if m[0] != "ok" and self.has_evidence:  # the worker keeps its refused outcome as evidence; it moves nothing
                before = self.model.get(pair[0].key)
                refused = Rejected(f"record_{what}", pair[0].key, m[1], None)
                outcome = {"success": "send.success", "not_sent": "send.not_sent", "unknown": "send.unknown"}[what]
                self.both(
                    lambda st_, i: st_.record_late_outcome(
                        pair[i], outcome=outcome, refused=refused, remote_id="stale" if what == "success" else None
                    )
                )
                assert _same_intent(before, self.model.get(pair[0].key)) == [], "a late outcome moved the intent"

        @precondition(lambda self: self.live)
        @rule(data=st.data())
        def worker_dies(self, data):
            """The worker holding this lease crashes (after begin, authorize or send): it never calls again."""
            key = data.draw(st.sampled_from(sorted(self.live)))
            self.stale.append(self.live.pop(key))

        # -- clock and maintenance ---------------------------------------------------
        @rule(seconds=st.sampled_from([1, 1, 1, 1, 5, 9, 29, 31, 120]))
        def database_clock_advances(self, seconds):
            self.clock.advance(seconds)
            if self.sut is not None:
                _clock_moved(self.sut, self.clock(), seconds)

        @rule()
        def sweeper(self):
            due_m = sorted(i.key for i in self.model.due_leases(1000))
            if self.store is not None:
                due_s = sorted(self.back(i.key) for i in self.store.due_leases(1000))
                assert due_m == due_s, f"due leases differ: {due_m} vs {due_s}"
            for key in due_m:
                it_m = self.model.get(key)
                it_s = None if self.store is None else self.store.get(self.k(key, 1))
                ev = [
                    e for e in self.model.table.events.values() if e.actor == ACTOR.sweeper and it_m.state in e.sources
                ]
                assert len(ev) == 1
                (m, g), _ = self.both(lambda st_, i, e=ev[0].name, p=(it_m, it_s): getattr(st_, e)(p[i]))
                assert m == "ok", f"sweeper refused a due lease: {g}"

        @rule(data=st.data())
        def sweeper_batch(self, data):
            """The sweeper's batch form (``expire_leases``): every due lease, perhaps one listed twice and one
            whose lease has not lapsed, in one call; each result is what the one-at-a-time move gives, on both
            (docs/design.md#the-sweeper-moves-a-batch-per-statement)."""
            due = sorted(i.key for i in self.model.due_leases(1000))
            keys = list(due)
            live = [k for k in self.keys if (self.model.get(k).lease_expires_at or 0) > self.clock()]
            if keys and data.draw(st.booleans()):
                keys.append(data.draw(st.sampled_from(keys)))  # refused the second time: already moved
            if live and data.draw(st.booleans()):
                keys.append(data.draw(st.sampled_from(sorted(live))))  # refused by lease_expired
            if not keys:
                return
            moves: list[tuple[str, Any, Any]] = []
            for key in keys:
                it_m = self.model.get(key)
                it_s = None if self.store is None else self.store.get(self.k(key, 1))
                ev = [
                    e for e in self.model.table.events.values() if e.actor == ACTOR.sweeper and it_m.state in e.sources
                ]
                if len(ev) != 1:
                    return
                moves.append((ev[0].name, it_m, it_s))

            def kinds(results: list[Any]) -> list[tuple[str, Any]]:
                return [(type(r).__name__, r.guard) if isinstance(r, Rejected) else ("ok", r.state) for r in results]

            (_, got_m), s = self.both(lambda st_, i: kinds(st_.expire_leases([(e, p[i]) for e, *p in moves])))
            if s is not None:
                assert got_m == s[1], f"batch results: model {got_m} vs store {s[1]}"
            assert all(kind == "ok" for kind, _ in got_m[: len(due)]), f"the batch refused a due lease: {got_m}"
            assert all(kind != "ok" for kind, _ in got_m[len(due) :]), f"a repeated or live lease moved: {got_m}"

        @precondition(lambda self: self.keys)
        @rule(data=st.data())
        def sweeper_too_early(self, data):
            """A sweeper acting on a lease that has not expired is refused by ``lease_expired``."""
            key = self.pick(data, STATE.pending, STATE.authorized, where=lambda it: it.lease_expires_at is not None)
            it_m = self.model.get(key)
            if it_m.lease_expires_at is None or it_m.lease_expires_at <= self.clock():
                return
            it_s = None if self.store is None else self.store.get(self.k(key, 1))
            ev = [e for e in self.model.table.events.values() if e.actor == ACTOR.sweeper and it_m.state in e.sources]
            (m, g), _ = self.both(lambda st_, i: getattr(st_, ev[0].name)((it_m, it_s)[i]))
            assert (m, g) == ("GuardRefused", "lease_expired"), (m, g)

        @precondition(lambda self: self.keys)
        @rule(
            data=st.data(),
            how=st.sampled_from(["found", "not_found", "not_found", "absent", "unfenced_absent", "park"]),
            stale_plan=st.sampled_from([False, False, False, True, "before_restore"]),
        )
        def reconciler(self, data, how, stale_plan):
            key = self.pick(data, STATE.indeterminate)
            plans = [self.model.get(key).plan, None if self.store is None else self.store.get(self.k(key, 1)).plan]
            if stale_plan == "before_restore":  # a reconciler that planned before the last restore
                if not self.pre_restore_plans:
                    return
                plans = list(data.draw(st.sampled_from(self.pre_restore_plans)))
            elif stale_plan:  # a second reconciler that planned before the first one wrote
                plans = [p if p is None else replace(p, reconcile_count=p.reconcile_count - 1) for p in plans]
            ops = {
                "found": lambda st_, p: st_.reconcile_found(p, remote_id="r-found"),
                "not_found": lambda st_, p: st_.reconcile_not_found(p),
                "absent": lambda st_, p: st_.reconcile_absent(p, fenced=True),
                "unfenced_absent": lambda st_, p: st_.reconcile_absent(p, fenced=False),
                "park": lambda st_, p: st_.park_unreconcilable(p, reason="lookup.unsupported"),
            }
            m, _ = self.both(lambda st_, i: ops[how](st_, plans[i]))
            if how == "unfenced_absent" or stale_plan:
                assert m[0] != "ok", f"reconciler moved on no evidence ({how}, stale plan {stale_plan})"

        @rule(data=st.data())
        def reconciler_batch(self, data):
            """The reconciler's batch form (``reconcile_many``): a lookup result for every indeterminate intent,
            perhaps one under a stale plan, in one call; each result is what the one-at-a-time move gives, on
            both (docs/design.md#the-reconciler-records-a-batch-per-statement)."""
            keys = sorted(k for k in self.keys if self.model.get(k).state == STATE.indeterminate)
            if not keys:
                return
            kinds_of = [
                (EVENT.reconcile_found, {"remote_id": "r-found"}),
                (EVENT.reconcile_not_found, {}),
                (EVENT.reconcile_absent, {"fenced": True}),
                (EVENT.park_unreconcilable, {"reason": "lookup.unsupported"}),
            ]
            looks = [data.draw(st.sampled_from(kinds_of)) for _ in keys]
            looked = [k for k in keys if self.model.get(k).reconcile_count > 0]  # a plan one look older exists
            stale = data.draw(st.sampled_from([None, *looked]))
            moves: list[tuple[str, Any, Any, Any]] = []
            for key, (event, kw) in zip(keys, looks, strict=True):
                pm = self.model.get(key).plan
                ps = None if self.store is None else self.store.get(self.k(key, 1)).plan
                if key == stale:  # planned before another reconciler wrote: refused by plan_unchanged
                    pm, ps = (p if p is None else replace(p, reconcile_count=p.reconcile_count - 1) for p in (pm, ps))
                moves.append((event, pm, ps, kw))

            def kinds(results: list[Any]) -> list[tuple[str, Any]]:
                return [(type(r).__name__, r.guard) if isinstance(r, Rejected) else ("ok", r.state) for r in results]

            (_, got_m), s = self.both(lambda st_, i: kinds(st_.reconcile_many([(e, p[i], kw) for e, *p, kw in moves])))
            if s is not None:
                assert got_m == s[1], f"batch results: model {got_m} vs store {s[1]}"
            if stale is not None:
                assert got_m[keys.index(stale)][0] != "ok", f"a stale plan was recorded: {got_m}"

        # -- sources: captures, supersession, freshness ---------------------------------
        @rule(body=st.sampled_from(["v-one", "v-one ", "v-two", "v-three"]))
        def capture_source(self, body):
            (m, cm), s = self.both(lambda st_, i: st_.capture_source("https://src/1", body))
            assert m == "ok"
            if s is not None:
                assert (s[1].version, s[1].new_version, s[1].supersedes) == (cm.version, cm.new_version, cm.supersedes)

        @precondition(lambda self: self.model.source_head("https://src/1") is not None)
        @rule(text=st.sampled_from(["from source", "also from source"]))
        def submit_from_source(self, text):
            head = self.model.source_head("https://src/1")
            src = ("https://src/1", head)
            (m, mi), s = self.both(lambda st_, i: st_.submit("acct-a", "post", "t1", {"text": text}, source=src))
            assert m == "ok"
            if s is not None:
                self.learn(mi.key, s[1].key)
            if mi.key not in self.keys:
                self.keys.append(mi.key)

        @rule()
        def claimable_agree(self):
            if self.store is not None:
                got = sorted(self.back(k) for k in self.store.claimable(1000))
                assert sorted(self.model.claimable(1000)) == got, "claimable differs"

        # -- the policy layer and restores --------------------------------------------
        @rule(scope=st.sampled_from(["global", "account:acct-a"]), engaged=st.booleans())
        def flip_kill_switch(self, scope, engaged):
            self.both(lambda st_, i: st_.set_kill_switch(scope, engaged, operator="ops"))

        @rule(account=st.sampled_from(ACCOUNTS), version=st.sampled_from([None, "v1", "v2"]))
        def rotate_credential(self, account, version):
            self.both(lambda st_, i: st_.set_credential_version(account, version))

        @rule(version=st.sampled_from([None, "c1"]))
        def change_contract(self, version):
            self.both(lambda st_, i: st_.set_contract_version("none", version))

        @rule(account=st.sampled_from(ACCOUNTS), cap=st.sampled_from([None, 1, 2, 5]), window=st.sampled_from([10, 60]))
        def change_rate_limit(self, account, cap, window):
            """Lower, raise or lift an account's rate limit (docs/design.md#the-policy-gate-and-the-retryable-versus-terminal-contract: cap changes)."""
            self.both(lambda st_, i: st_.set_rate_limit(account, cap, window_seconds=window))

        @precondition(lambda self: self.keys)
        @rule()
        def declare_restore(self):
            self.pre_restore_plans = [
                (self.model.get(k).plan, None if self.store is None else self.store.get(self.k(k, 1)).plan)
                for k in self.keys
            ]
            (m, mv), s = self.both(lambda st_, i: st_.declare_restore(operator="ops"))
            assert m == "ok"
            if s is not None:
                assert s[1] == mv, f"restore: model {mv} vs store {s[1]}"
            self.stale.extend(self.live.values())
            self.live.clear()

        # -- retry policy and operator -----------------------------------------------
        @precondition(lambda self: self.keys)
        @rule(data=st.data(), what=st.sampled_from(["retry", "retry", "exhaust"]))
        def retry_policy(self, data, what):
            key = self.pick(data, STATE.failed)
            before = self.model.total_attempts()
            self.both(lambda st_, i: getattr(st_, what)(self.k(key, i)))
            assert self.model.total_attempts() == before, "retry/exhaust created an attempt"
            if self.store is not None:
                assert self.store.total_attempts() == before, "retry/exhaust created an attempt in the store"

        @precondition(lambda self: self.keys)
        @rule(
            data=st.data(),
            what=st.sampled_from(["park", "resolve_published", "resolve_not_sent", "resend"]),
            named=st.sampled_from([True, True, True, False]),
            seen=st.sampled_from(["none", "current", "current", "overtaken"]),
        )
        def operator(self, data, what, named, seen):
            key = self.pick(
                data, *((STATE.parked,) if what != "park" else (STATE.pending, STATE.indeterminate, STATE.failed))
            )
            who = "alice" if named else " "

            def plan(st_: Any, k: str) -> dict[str, Any]:
                # a person's resend and not-sent present the read they decided on: none (the row as the move
                # reads it), the current read, or one another lookup has overtaken (refused: plan_unchanged)
                if seen == "none":
                    return {}
                p = st_.get(k).plan
                return {"plan": p if seen == "current" else replace(p, reconcile_count=p.reconcile_count + 1)}

            ops = {
                "park": lambda st_, k: st_.park(k, operator=who),
                "resolve_published": lambda st_, k: st_.resolve_published(k, operator=who, remote_id="r-human"),
                "resolve_not_sent": lambda st_, k: st_.resolve_not_sent(k, operator=who, **plan(st_, k)),
                "resend": lambda st_, k: st_.resend(k, operator=who, **plan(st_, k)),
            }
            m, _ = self.both(lambda st_, i: ops[what](st_, self.k(key, i)))
            if m[0] == "ok" and key in self.live:
                self.stale.append(self.live.pop(key))
            if not named:
                assert m[0] != "ok", "an anonymous operator moved an intent"
            if seen == "overtaken" and what in ("resend", "resolve_not_sent"):
                assert m[0] != "ok", f"{what} went through on a read another lookup had overtaken"

        # -- invariants ---------------------------------------------------------------
        @invariant()
        def model_and_store_agree(self):
            if self.store is None:
                return
            for key in self.keys:
                sk = self.k(key, 1)
                ra, rb = self.model.refusals(key), self.store.refusals(sk)
                assert [(r.event, r.guard) for r in ra] == [(r.event, r.guard) for r in rb], "refusals differ"
                a, b = self.model.get(key), self.store.get(sk)
                diffs = _same_intent(a, b)
                assert not diffs, f"{key[:12]}: " + "; ".join(diffs)
                ha, hb = self.model.history(key), self.store.history(sk)
                assert [(h.event, h.from_state, h.to_state) for h in ha] == [
                    (h.event, h.from_state, h.to_state) for h in hb
                ]
                ea, eb = (self.model.evidence(key), self.store.evidence(sk)) if self.has_evidence else ([], [])
                assert [(e.outcome, e.refused_event, e.refused_by, e.remote_id) for e in ea] == [
                    (e.outcome, e.refused_event, e.refused_by, e.remote_id) for e in eb
                ], "late outcomes differ"
                aa, ab = self.model.attempts(key), self.store.attempts(sk)
                assert [(x.number, x.outcomes) for x in aa] == [(x.number, x.outcomes) for x in ab]
            assert self.model.count_by_state() == self.store.count_by_state()

        @invariant()
        def protocol_holds(self):
            check_protocol_invariants(self.model, self.keys, self.history_len)
            if self.store is not None:
                check_protocol_invariants(self.store, [self.k(k, 1) for k in self.keys], None)

    AtMostOnceMachine.__name__ = "AtMostOnceMachine"
    return AtMostOnceMachine


def check_protocol_invariants(store: Store, keys: list[str], grow: dict[str, int] | None = None) -> None:
    """The invariants of docs/design.md#one-table-read-by-everything over one store's visible data. Raises ``AssertionError``."""
    t = store.table
    for key in keys:
        it = store.get(key)
        assert it.state in t.states, f"undeclared state {it.state}"
        atts = store.attempts(key)
        open_ = [a for a in atts if not a.outcomes]
        assert len(open_) <= 1, "more than one live attempt"
        assert (len(open_) == 1) == (it.attempt_token is not None), "open attempt and intent token disagree"
        assert all(len(a.outcomes) <= 1 for a in atts), "an attempt was closed twice"
        assert it.attempt_count == len(atts)
        assert it.attempt_count <= it.max_attempts, "attempt cap exceeded"
        hist = store.history(key)
        seqs = [h.seq for h in hist]
        assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), "history not ordered by a unique sequence"
        for h in hist:
            if h.from_state is not None and t.states[h.from_state].terminal:
                assert t.actors[t.events[h.event].actor].human, f"machine event {h.event} left {h.from_state}"
        # no second authorization unless the previous attempt ended definitively not-sent
        armed = True
        for h in hist:
            if h.event == EVENT.authorize_dispatch:
                assert armed, "second authorization without a definitive not-sent in between"
                armed = False
            elif t.events[h.event].target == STATE.failed or (
                t.actors[t.events[h.event].actor].human and t.events[h.event].target == t.initial
            ):
                armed = True
        if grow is not None:
            assert len(hist) >= grow.get(key, 0), "history shrank"
            grow[key] = len(hist)
