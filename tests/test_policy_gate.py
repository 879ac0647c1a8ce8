"""Before-byte policy gate, fencing on (epoch, generation), refusals recorded, and the duplicate-text
window enforced by the database (issues 6 and 7), on every store."""

from __future__ import annotations

import ast
import re
import threading
from pathlib import Path

import pytest

from atmostonce import GuardRefused, Rejected
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.table import table
from atmostonce_http import HttpTransport, PlatformSink, sink_config
from tests.helpers import begin_authorize, submit, to_state

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, retry_backoff=0)


@pytest.fixture
def platform():
    with PlatformSink(dedupe=False, fenced_lookup=True) as sink:
        with HttpTransport(sink_config(sink.url, key_field="/delivery_key", lookup_fenced=True)) as transport:
            yield sink, transport


def _other_text_intent(store):
    other = store.submit("acct", "post", "room-other", {"text": "hello"})
    begin_authorize(store, other.key)


FLIPS = {
    # flipped by the worker's own expensive step, i.e. after begin and before authorize
    "kill_switch_off": lambda s, it: s.set_kill_switch("global", True, operator="ops"),
    "kill_switch_account": lambda s, it: s.set_kill_switch(f"account:{it.account}", True, operator="ops"),
    "credential_current": lambda s, it: s.set_credential_version(it.account, "v2"),
    "contract_supported": lambda s, it: s.set_contract_version("http", "2026-12"),
    "text_window_clear": lambda s, it: _other_text_intent(s),
}


@pytest.mark.parametrize("condition", sorted(FLIPS))
def test_each_gate_condition_flipped_before_authorize_stops_every_byte(any_store, platform, condition):
    sink, transport = platform
    store = any_store.store
    it = submit(store, text="hello", account="acct", target="room-1")
    guard = "kill_switch_off" if condition == "kill_switch_account" else condition
    d = Dispatcher(store, transport, CONFIG, work=lambda intent: FLIPS[condition](store, intent))
    assert d.dispatch(it.key) == "gate.blocked"
    assert sink.requests == 0 and sink.creates == 0, "a byte left after the gate refused"
    final = store.get(it.key)
    assert final.state == "parked"  # a block at publish time is terminal and human-owned
    assert store.history(it.key)[-1].detail["reason"] == f"gate.blocked:{guard}"


def test_a_kill_switch_seen_before_begin_spends_nothing_and_stays_queued(any_store, platform):
    sink, transport = platform
    store = any_store.store
    it = submit(store)
    store.set_kill_switch("global", True, operator="ops")
    assert Dispatcher(store, transport, CONFIG).dispatch(it.key) == "gate.paused"
    assert store.get(it.key).state == "pending" and store.attempts(it.key) == []
    store.set_kill_switch("global", False, operator="ops")
    assert Dispatcher(store, transport, CONFIG).dispatch(it.key) == "read_back.match"
    assert sink.creates == 1


def test_matching_credential_and_contract_versions_pass_the_gate(any_store, platform):
    sink, transport = platform
    store = any_store.store
    store.set_credential_version("acct", "v7")
    store.set_contract_version("http", None)
    it = submit(store, account="acct")
    d = Dispatcher(store, transport, CONFIG, credential_version=lambda account: "v7")
    assert d.dispatch(it.key) == "read_back.match"
    assert store.history(it.key)[2].detail["credential_version"] == "v7"


def test_kill_switch_scope_is_validated(any_store):
    from atmostonce import IntakeError

    with pytest.raises(IntakeError):
        any_store.store.set_kill_switch("everything", True, operator="ops")


def test_a_slow_worker_is_fenced_and_its_refusal_recorded(any_store):
    s = any_store.store
    it = submit(s)
    slow = s.begin(it.key, lease_seconds=10)
    any_store.advance(11)  # the window passed: a per-window lease is not execution serialization
    [due] = s.due_leases()
    s.abandon_attempt(due)
    fresh = s.begin(it.key, lease_seconds=10)
    assert fresh.generation > slow.generation
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(slow, request_digest=it.request_digest)
    assert e.value.guard == "lease_holder"
    [refusal] = s.refusals(it.key)
    assert refusal.presented["generation"] == slow.generation
    assert refusal.current["generation"] == fresh.generation
    assert refusal.superseded_by_seq == s.history(it.key)[-1].seq
    assert s.history(it.key)[-1].event == "begin"


def test_generations_come_from_one_sequence_across_intents(any_store):
    s = any_store.store
    gens = [s.begin(submit(s, text=f"g{i}").key).generation for i in range(5)]
    assert gens == sorted(set(gens))
    # a brand-new intent does not restart at 1: a stale generation-1 worker cannot collide with it
    assert s.begin(submit(s, text="new").key).generation > max(gens)


def test_declared_restore_fences_old_leases_and_resends_nothing(any_store, platform):
    sink, transport = platform
    s = any_store.store
    queued = submit(s, text="queued")
    begun = submit(s, text="begun")
    inflight = submit(s, text="in flight")
    lease = s.begin(begun.key)
    begin_authorize(s, inflight.key)  # authorized, nothing sent yet
    failed, _ = to_state(s, "failed", text="failed")
    epoch, fenced = s.declare_restore(operator="ops")
    assert epoch == 2 and fenced == 4
    with pytest.raises(Rejected):  # the worker from before the restore sends nothing
        s.authorize_dispatch(lease, request_digest=begun.request_digest)
    keys = (queued.key, begun.key, inflight.key, failed.key)
    assert {s.get(k).state for k in keys} == {"indeterminate"}
    # a fenced lookup proves nothing for an attempt begun before the restore (its key may have been
    # rewound): the machine never resends; the budget runs out and a person decides
    for _ in range(3):
        assert set(Reconciler(s, transport, CONFIG).run()) == {"lookup.not_found_before_restore"}
    assert Reconciler(s, transport, CONFIG).run() == {"reconcile.budget_spent": 4}
    Sweeper(s, CONFIG).retry_failed()
    assert s.claimable() == [] and sink.requests == 0
    assert {s.get(k).state for k in keys} == {"parked"}
    # each fenced look tombstoned the key it asked about, so each moved the fence epoch on
    assert {s.get(k).fence_epoch for k in keys} == {3}
    for k in keys:  # the person establishes nothing was sent: each is sent exactly once
        s.resolve_not_sent(k, operator="ops")
    Sweeper(s, CONFIG).retry_failed()
    for key in s.claimable():
        Dispatcher(s, transport, CONFIG).dispatch(key)
    assert sink.creates_by_key == dict.fromkeys(keys, 1)


def test_declared_restore_gives_a_parked_intent_one_more_lookup_and_resends_nothing(any_store, platform):
    """A parked intent may have been settled by a person and sent after the backup: the restore moves it to
    indeterminate with one lookup more than it has made (docs/design.md#what-a-restore-cannot-know); a miss for
    an attempt from before the restore proves nothing, so it parks again and nothing is sent."""
    sink, transport = platform
    s = any_store.store
    config = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, first_look_after=0)
    it, _ = to_state(s, "indeterminate", text="parked after its lookups", max_reconciles=1)
    looked = s.reconcile_not_found(it.plan)  # the one lookup its budget allows
    s.park_unreconcilable(looked.plan, reason="reconcile.budget_spent")
    spent = s.get(it.key)
    assert spent.state == "parked" and spent.reconcile_count == spent.max_reconciles == 1
    requests = sink.requests

    _, fenced = s.declare_restore(operator="ops")

    fenced_row = s.get(it.key)
    assert fenced == 1 and fenced_row.state == "indeterminate"
    assert (fenced_row.reconcile_count, fenced_row.max_reconciles) == (1, 2)
    assert Reconciler(s, transport, config).run() == {"lookup.not_found_before_restore": 1}
    assert Reconciler(s, transport, config).run() == {"reconcile.budget_spent": 1}
    assert s.get(it.key).state == "parked" and sink.requests == requests


def test_restore_epoch_guard_refuses_a_lease_from_an_older_epoch(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key)
    s._bump_epoch()  # the epoch moved (a restore) while this row still shows the old lease
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert e.value.guard == "restore_epoch_current"
    assert s.refusals(it.key)[0].current["epoch"] == lease.epoch + 1


COMPLETING = {
    # every write a lease holder makes after begin, with a state it may make it in
    "block_at_gate": ("pending", lambda s, le: s.block_at_gate(le, reason="gate.blocked:x")),
    "record_success": ("authorized", lambda s, le: s.record_success(le, remote_id="r-late")),
    "record_not_sent": ("authorized", lambda s, le: s.record_not_sent(le, reason="refused")),
    "record_unknown": ("authorized", lambda s, le: s.record_unknown(le, reason="timeout")),
    "confirm_read_back": ("success", lambda s, le: s.confirm_read_back(le)),
    "read_back_failed": ("success", lambda s, le: s.read_back_failed(le, reason="read_back.not_found")),
}


@pytest.mark.parametrize("event", sorted(COMPLETING))
def test_a_straggler_completing_write_after_a_restore_is_refused(any_store, event):
    """Fencing on (epoch, generation): the restored row still shows the straggler's token and
    generation, but its lease is of an older restore epoch (docs/formal.md, F3)."""
    s = any_store.store
    where, write = COMPLETING[event]
    it = submit(s, text=event)
    lease = s.begin(it.key)
    if where != "pending":
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    if where == "success":
        s.record_success(lease, remote_id="r-1")
    before = s.get(it.key)
    s._bump_epoch()  # declare-restore has advanced the epoch and not fenced this row yet
    with pytest.raises(GuardRefused) as e:
        write(s, lease)
    assert e.value.guard == "restore_epoch_current"
    after = s.get(it.key)
    assert (after.state, after.attempt_token, after.remote_id) == (before.state, before.attempt_token, before.remote_id)
    assert s.refusals(it.key)[-1].guard == "restore_epoch_current"


def test_a_plan_taken_before_a_restore_is_refused_after_it(any_store):
    s = any_store.store
    it, _ = to_state(s, "indeterminate", text="planned")
    stale = s.get(it.key).plan
    assert stale.epoch == s.current_epoch() == 1
    s.declare_restore(operator="ops")
    for move in (
        lambda p: s.reconcile_absent(p, fenced=True),
        lambda p: s.reconcile_found(p, remote_id="r-x"),
        lambda p: s.reconcile_not_found(p),
        lambda p: s.park_unreconcilable(p, reason="lookup.unsupported"),
    ):
        with pytest.raises(GuardRefused) as e:
            move(stale)
        assert e.value.guard == "plan_unchanged"
    assert s.refusals(it.key)[-1].presented["plan_epoch"] == 1
    fresh = s.get(it.key).plan
    assert fresh.epoch == 2
    with pytest.raises(GuardRefused) as e:  # a fresh plan cannot prove absence either
        s.reconcile_absent(fresh, fenced=True)
    assert e.value.guard == "absence_provable"
    assert s.reconcile_found(fresh, remote_id="r-x").state == "published"


# ------------------------------------------------------------------ duplicate-text window


def _authorize(store, text="same text", target="room-1"):
    it = store.submit("acct", "post", target, {"text": text})
    lease = store.begin(it.key)
    return it, lease, lambda: store.authorize_dispatch(lease, request_digest=it.request_digest)


def test_the_same_normalized_text_is_refused_inside_the_window(any_store):
    s = any_store.store
    a, la, auth_a = _authorize(s, "Same  text ", "room-1")
    auth_a()
    b, lb, auth_b = _authorize(s, "Same text", "room-2")
    assert a.key != b.key and a.text_hash == b.text_hash
    with pytest.raises(GuardRefused) as e:
        auth_b()
    assert e.value.guard == "text_window_clear"
    c, _, auth_c = _authorize(s, "Same text", "room-3")
    other_account = s.submit("acct-2", "post", "room-2", {"text": "Same text"})
    begin_authorize(s, other_account.key)  # another account may say the same thing


@pytest.mark.parametrize("elapsed, allowed", [(86_399, False), (86_400, True), (86_401, True)])
def test_window_edges_by_the_store_clock(set_clock_store, elapsed, allowed):
    # a clock the test sets: on the wall clock, a slow second between the two authorizations crossed the edge
    s, set_clock = set_clock_store
    set_clock(1_000_000.0)
    _, _, auth_a = _authorize(s, target="room-1")
    auth_a()
    set_clock(1_000_000.0 + elapsed)
    _, _, auth_b = _authorize(s, target="room-2")
    if allowed:
        assert auth_b().state == "authorized"
    else:
        with pytest.raises(GuardRefused):
            auth_b()


def test_a_definitive_not_sent_frees_the_slot_and_an_unknown_keeps_it(any_store):
    s = any_store.store
    _, la, auth_a = _authorize(s, target="room-1")
    auth_a()
    s.record_unknown(la, reason="read timeout")
    _, _, auth_b = _authorize(s, target="room-2")
    with pytest.raises(GuardRefused):
        auth_b()
    _, lc, auth_c = _authorize(s, text="another", target="room-1")
    auth_c()
    s.record_not_sent(lc, reason="connect refused")
    _, _, auth_d = _authorize(s, text="another", target="room-2")
    assert auth_d().state == "authorized"


@pytest.mark.postgres
def test_eight_workers_race_the_same_text_and_exactly_one_is_authorized(pg_databases):
    from atmostonce_sql import open_store

    url = pg_databases.fresh()
    store = open_store(url, migrate=False, pool_size=8)
    try:
        for round_ in range(20):
            pairs = []
            for w in range(8):
                it = store.submit("acct", "post", f"room-{round_}-{w}", {"text": f"race {round_}"})
                pairs.append((it, store.begin(it.key)))
            barrier = threading.Barrier(8)
            results: list[str] = []

            def go(it, lease, barrier=barrier, results=results):
                barrier.wait()
                try:
                    store.authorize_dispatch(lease, request_digest=it.request_digest)
                    results.append("ok")
                except GuardRefused as exc:
                    results.append(exc.guard)
                except Exception as exc:  # reported by the assertion below
                    results.append(f"{type(exc).__name__}: {exc}")

            threads = [threading.Thread(target=go, args=p) for p in pairs]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert sorted(results) == ["ok"] + ["text_window_clear"] * 7, results
    finally:
        store.close()
        pg_databases.drop(url)


# ------------------------------------------------------------------ the retryable-versus-terminal table

OUTCOME = re.compile(r"^[a-z_]+\.[a-z_]+$")


def _outcome_literals(path: Path) -> set[str]:
    tree = ast.parse(path.read_text("utf-8"))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            value = node.value.split(":", 1)[0]
            if OUTCOME.match(value) and not value.startswith(("atmostonce.", "send.success")):
                names.add(value)
    return names


def test_every_outcome_name_the_runtime_produces_is_declared_in_the_table():
    root = Path(__file__).resolve().parents[1]
    produced = _outcome_literals(root / "reference" / "atmostonce" / "runtime.py")
    produced |= _outcome_literals(root / "reference" / "atmostonce" / "transport.py")
    assert produced, "the scan found no outcome names"
    undeclared = produced - set(table().outcomes)
    assert undeclared == set(), f"outcomes with no declared state: {sorted(undeclared)}"


def test_only_failed_is_retryable_and_policy_blocks_are_terminal():
    t = table()
    assert [(e.name, e.sources) for e in t.events.values() if e.target == "pending" and e.actor == "worker"] == [
        ("begin", ("pending",)),
        ("retry", ("failed",)),
    ]
    assert t.outcomes["gate.blocked"].state == "parked" and t.states["parked"].terminal
    assert t.outcomes["gate.paused"].state == "pending"  # a stop that spent nothing stays queued
