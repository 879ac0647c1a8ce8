"""Reconciliation records of external sends (docs/design.md#reconciliation-records), on the model, SQLite and PostgreSQL.

A send whose outcome becomes unknown opens its own record, keyed by the history seq of that move
(``send_seq``), at ``unknown``; only evidence moves it: ``confirmed`` by a lookup that finds the
object or a person who did, ``failed`` by a fenced absence or a person's not-sent. A local refusal
never writes a result. Each change is a new row; a send's current result is its newest row.
"""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused, IllegalMove, Rejected, table
from atmostonce.audit import reconciliation_step, verify_store
from tests.helpers import begin_authorize, submit, to_state


def _moved_into_unknown(store, key):
    return [h for h in store.history(key) if h.to_state == "indeterminate" and h.from_state != "indeterminate"]


def test_the_table_decides_which_moves_open_and_which_settle():
    t = table()
    steps = {name: reconciliation_step(t, name) for name in t.events}
    assert {n for n, s in steps.items() if s and s[0] == "open"} == {
        "record_unknown",
        "expire_lease",
        "read_back_failed",
        "restore_fence",
    }
    assert {n: s for n, s in steps.items() if s and s[0] != "open"} == {
        "reconcile_found": ("lookup", "confirmed"),
        "reconcile_not_found": ("lookup", "unknown"),
        "reconcile_unproven": ("lookup", "unknown"),
        "reconcile_absent": ("lookup", "failed"),
        "resolve_published": ("settle", "confirmed"),
        "resolve_not_sent": ("settle", "failed"),
    }


@pytest.mark.parametrize("how", ["record_unknown", "expire_lease", "read_back_failed", "restore_fence"])
def test_a_send_whose_outcome_becomes_unknown_opens_its_record_at_unknown(any_store, how):
    s = any_store.store
    it = submit(s)
    lease = begin_authorize(s, it.key)
    if how == "record_unknown":
        s.record_unknown(lease, reason="read timeout")
    elif how == "expire_lease":
        s.record_success(lease, remote_id="r-1")
        any_store.advance(120)
        s.expire_lease(s.get(it.key))
    elif how == "read_back_failed":
        s.record_success(lease, remote_id="r-1")
        s.read_back_failed(lease, reason="read_back.not_found")
    else:
        s.declare_restore(operator="alice")
    [move] = _moved_into_unknown(s, it.key)
    assert move.event == how
    [rec] = s.reconciliations(it.key)
    assert (rec.result, rec.send_seq, rec.event) == ("unknown", move.seq, how)
    assert rec.remote_id == (None if how in ("record_unknown", "restore_fence") else "r-1")
    assert s.reconciliation_results(it.key) == {move.seq: rec}


def test_lookups_append_to_the_open_record_and_only_evidence_moves_it(any_store):
    s = any_store.store
    a, _ = to_state(s, "indeterminate", text="a", max_reconciles=3)
    b, _ = to_state(s, "indeterminate", text="b")
    s.reconcile_not_found(s.get(a.key).plan)  # nothing proven: still unknown
    [send_a] = _moved_into_unknown(s, a.key)
    assert s.reconciliation_results(a.key)[send_a.seq].result == "unknown"
    s.reconcile_found(s.get(a.key).plan, remote_id="r-a")
    s.reconcile_absent(s.get(b.key).plan, fenced=True)
    [send_b] = _moved_into_unknown(s, b.key)
    assert [(r.event, r.result, r.send_seq) for r in s.reconciliations(a.key)] == [
        ("record_unknown", "unknown", send_a.seq),
        ("reconcile_not_found", "unknown", send_a.seq),
        ("reconcile_found", "confirmed", send_a.seq),
    ]
    assert s.reconciliations(a.key)[-1].remote_id == "r-a"
    assert {k: r.result for k, r in s.reconciliation_results(b.key).items()} == {send_b.seq: "failed"}
    seqs = [r.seq for r in s.reconciliations(a.key)]
    assert seqs == sorted(seqs)  # append-only: each change is a new row
    assert [h.event for h in s.history(a.key)][-2:] == ["reconcile_not_found", "reconcile_found"]
    assert verify_store(s).intact  # the records ride in the same write as the audited move


@pytest.mark.parametrize(("resolve", "result"), [("published", "confirmed"), ("not_sent", "failed")])
def test_a_persons_resolution_settles_the_unknown_send(any_store, resolve, result):
    s = any_store.store
    it, _ = to_state(s, "indeterminate")
    s.park_unreconcilable(s.get(it.key).plan, reason="lookup.unsupported")  # no evidence: still unknown
    [send] = _moved_into_unknown(s, it.key)
    assert s.reconciliation_results(it.key)[send.seq].result == "unknown"
    if resolve == "published":
        s.resolve_published(it.key, operator="alice", remote_id="r-seen")
    else:
        s.resolve_not_sent(it.key, operator="alice")
    cur = s.reconciliation_results(it.key)[send.seq]
    assert (cur.result, cur.event) == (result, f"resolve_{resolve}")
    assert len(s.reconciliations(it.key)) == 2


def test_resolving_work_that_was_never_unknown_writes_no_reconciliation(any_store):
    s = any_store.store
    it = submit(s)
    lease = s.begin(it.key)
    s.block_at_gate(lease, reason="gate.blocked")  # refused before any byte
    s.resolve_not_sent(it.key, operator="alice")
    assert s.reconciliations(it.key) == []


def test_a_local_refusal_never_becomes_a_reconciliation_result(any_store):
    s = any_store.store
    it = submit(s)
    stale = s.begin(it.key, lease_seconds=30)  # worker A, who will fall asleep before authorizing
    any_store.advance(60)
    s.abandon_attempt(s.get(it.key))
    begin_authorize(s, it.key)  # worker B sends
    # A wakes and claims its send never happened: refused by the fence and recorded as a refusal
    with pytest.raises(GuardRefused) as e:
        s.record_not_sent(stale, reason="connect refused")
    assert e.value.guard == "lease_holder"
    any_store.advance(120)
    s.expire_lease(s.get(it.key))  # B vanished holding the send lease: the send's outcome is unknown
    with pytest.raises(IllegalMove):  # A again: a local rejection, still no evidence about B's send
        s.record_not_sent(stale, reason="connect refused")
    stale_plan = s.get(it.key).plan
    s.reconcile_not_found(stale_plan)
    with pytest.raises(GuardRefused):  # a reconciler on a stale plan: refused, recorded
        s.reconcile_absent(stale_plan, fenced=True)
    assert [r.guard for r in s.refusals(it.key)] == ["lease_holder", "plan_unchanged"]
    assert [(r.event, r.result) for r in s.reconciliations(it.key)] == [
        ("expire_lease", "unknown"),
        ("reconcile_not_found", "unknown"),
    ]
    assert [r.result for r in s.reconciliation_results(it.key).values()] == ["unknown"]


def test_a_deliberate_resend_leaves_the_old_send_unknown_and_opens_a_new_record(any_store):
    s = any_store.store
    it, _ = to_state(s, "parked", text=None)  # record_unknown, then an operator park: the send stays unknown
    s.resend(it.key, operator="alice")
    lease = begin_authorize(s, it.key)
    s.record_unknown(lease, reason="read timeout again")
    first, second = _moved_into_unknown(s, it.key)
    s.reconcile_found(s.get(it.key).plan, remote_id="r-2")
    assert {k: r.result for k, r in s.reconciliation_results(it.key).items()} == {
        first.seq: "unknown",  # nothing ever proved what the first send did
        second.seq: "confirmed",
    }
    with pytest.raises(Rejected):
        s.resolve_not_sent(it.key, operator="alice")  # published is terminal


@pytest.mark.parametrize("answer", [None, {"found": False}], ids=["none", "a-mapping"])
def test_a_lookup_answering_neither_found_nor_not_found_is_a_failed_lookup_that_writes_nothing(any_store, answer):
    """A transport (a plugin) whose lookup returns something that is not ``Found``, ``NotFound`` or
    ``Unsupported``: the reconciler counts a failed lookup and writes nothing; on a fenced platform it must not
    take the answer as a proven absence (docs/design.md#a-lookup-must-answer-for-its-key)."""
    from atmostonce.runtime import Reconciler, RuntimeConfig
    from atmostonce.transport import Capabilities

    class Plugin:
        name, protocol_version = "plugin", 1
        capabilities = Capabilities(read_back=False, lookup_by_key=True, fenced_lookup=True)

        def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
            return answer

        def close(self):
            pass

    store = any_store.store
    it, _ = to_state(store, "indeterminate", text="asked a plugin")
    rows = len(store.history(it.key))
    assert Reconciler(store, Plugin(), RuntimeConfig(reconcile_interval=0)).run() == {"lookup.error": 1}
    after = store.get(it.key)
    assert (after.state, after.reconcile_count, len(store.history(it.key))) == ("indeterminate", 0, rows)
