"""The reconciler records a batch of lookups per statement, under the same per-row guards as its single moves
(docs/design.md#the-reconciler-records-a-batch-per-statement): on every store the batch writes what the
one-at-a-time moves write, a lookup whose plan went stale before the batch is refused on its own by
``plan_unchanged`` (and the refusal recorded), and on the SQL stores one ``UPDATE`` records every lookup
that ended the same way."""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused, IntakeError, Rejected
from atmostonce.audit import verify_store
from atmostonce.names import EVENT, GUARD, OUTCOME, STATE
from atmostonce.runtime import Reconciler, RuntimeConfig
from atmostonce.transport import Capabilities
from tests.helpers import to_state
from tests.test_runtime_loops import Platform
from tests.test_sweeper_batch import shape, statements  # noqa: F401  (the statement-recording fixture)

CONFIG = RuntimeConfig(first_look_after=0, reconcile_interval=0)

LOOKS = [
    (EVENT.reconcile_found, {"remote_id": "r-found"}),
    (EVENT.reconcile_not_found, {}),
    (EVENT.park_unreconcilable, {"reason": OUTCOME.lookup_unsupported}),
    (EVENT.reconcile_absent, {"fenced": True}),
]


def unknowns(store, prefix: str, n: int) -> list[str]:
    return [to_state(store, STATE.indeterminate, text=f"{prefix} {i}")[0].key for i in range(n)]


def test_a_batch_of_mixed_lookups_is_recorded_as_the_one_at_a_time_moves_would_record_it(any_store):
    store = any_store.store
    single, batched = unknowns(store, "one", len(LOOKS)), unknowns(store, "many", len(LOOKS))
    for key, (event, kw) in zip(single, LOOKS, strict=True):
        getattr(store, event)(store.get(key).plan, **kw)
    moved = store.reconcile_many(
        [(event, store.get(key).plan, kw) for key, (event, kw) in zip(batched, LOOKS, strict=True)]
    )
    assert not any(isinstance(m, Rejected) for m in moved)
    assert [m.state for m in moved] == [STATE.published, STATE.indeterminate, STATE.parked, STATE.failed]
    for a, b in zip(single, batched, strict=True):
        assert shape(store, b) == shape(store, a)
    assert verify_store(store).intact


def test_a_lookup_whose_plan_went_stale_is_refused_by_plan_unchanged_and_alone(any_store):
    store = any_store.store
    keys = unknowns(store, "look", 3)
    plans = [store.get(k).plan for k in keys]
    store.reconcile_not_found(plans[1])  # another reconciler recorded a look since this one's plan was read
    got = store.reconcile_many([(EVENT.reconcile_not_found, p, {}) for p in plans])
    assert isinstance(got[1], GuardRefused) and (got[1].event, got[1].guard) == (
        EVENT.reconcile_not_found,
        GUARD.plan_unchanged,
    )
    assert [store.get(k).reconcile_count for k in keys] == [1, 1, 1]
    assert [r.guard for r in store.refusals(keys[1])] == [GUARD.plan_unchanged]  # a fencing refusal is recorded
    assert not isinstance(got[0], Rejected) and not isinstance(got[2], Rejected)


@pytest.mark.parametrize(
    "moves",
    [
        [(EVENT.expire_lease, None, {})],  # the sweeper's move, not the reconciler's
        [(EVENT.reconcile_found, None, {"remote_id": "r"})],  # not a plan
        [(EVENT.reconcile_found, "plan", {})],
        ["reconcile_found"],
    ],
)
def test_the_batch_takes_only_the_reconcilers_moves_and_writes_nothing_otherwise(any_store, moves):
    store = any_store.store
    key = unknowns(store, "kept", 1)[0]
    before = (store.get(key), len(store.history(key)))
    moves = [
        (m[0], store.get(key).plan if m[1] == "plan" else m[1], m[2]) if isinstance(m, tuple) else m for m in moves
    ]
    with pytest.raises(IntakeError) as e:
        store.reconcile_many([(EVENT.reconcile_not_found, store.get(key).plan, {}), *moves])
    assert e.value.field in ("moves", "plan", "remote_id")
    assert (store.get(key), len(store.history(key))) == before


def test_a_reconciler_pass_records_each_lookup_and_counts_it_by_outcome(any_store):
    store = any_store.store
    found, missing = unknowns(store, "found", 2), unknowns(store, "missing", 2)
    by_key = {(k, 0, 0): _found(store, k) for k in found}
    platform = Platform(Capabilities(lookup_by_key=True), by_key=by_key)
    assert Reconciler(store, platform, CONFIG).run() == {OUTCOME.lookup_found: 2, OUTCOME.lookup_not_found: 2}
    assert [store.get(k).state for k in found] == [STATE.published] * 2
    assert [store.get(k).reconcile_count for k in missing] == [1, 1]


def _found(store, key):
    from atmostonce.runtime import wire_request
    from atmostonce.transport import Found

    return Found(f"r-{key[:8]}", dict(wire_request(store.get(key)).body))


def test_one_update_records_every_lookup_that_ended_the_same_way(statements):  # noqa: F811
    store, sent = statements
    keys = unknowns(store, "unsupported", 6)
    sent.clear()
    # a platform with no read-back and no lookup by key: every look parks the intent for a person
    assert Reconciler(store, Platform(Capabilities()), CONFIG).run() == {OUTCOME.lookup_unsupported: 6}
    updates = [q for q, _ in sent if q.lstrip().upper().startswith("UPDATE AOM_INTENTS")]
    assert len(updates) == 1
    assert [store.get(k).state for k in keys] == [STATE.parked] * 6


def test_each_found_lookup_of_a_batch_records_its_own_object_and_each_park_its_own_reason(any_store):
    store = any_store.store
    found, parked = unknowns(store, "found", 3), unknowns(store, "parked", 2)
    moves = [(EVENT.reconcile_found, store.get(k).plan, {"remote_id": f"r-{i}"}) for i, k in enumerate(found)]
    reasons = [OUTCOME.lookup_unsupported, OUTCOME.reconcile_budget_spent]
    moves += [
        (EVENT.park_unreconcilable, store.get(k).plan, {"reason": r}) for k, r in zip(parked, reasons, strict=True)
    ]
    got = store.reconcile_many(moves)
    assert not any(isinstance(m, Rejected) for m in got)
    assert [store.get(k).remote_id for k in found] == ["r-0", "r-1", "r-2"]
    assert [store.history(k)[-1].detail.get("reason") for k in parked] == reasons
