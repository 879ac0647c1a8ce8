"""Approvals bound to exact bytes and per-target dispatch claims (docs/design.md#approvals-and-per-target-dispatch-claims), on the
model, SQLite and PostgreSQL alike."""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused, IllegalMove, IntakeError, Rejected
from atmostonce.checks import MACHINE_CHECKS, check_machines
from atmostonce.table import MACHINES, machine, table

TARGET = "room-9"


def gated(s, text="hello", target=TARGET, kind="post"):
    return s.submit("acct", kind, target, {"text": text}, requires_approval=True)


def twins(s, text="the same words"):
    """Two distinct drafts with the same bytes: a post and a reply of one text to one target share a
    request digest (the action kind is in the key, not in the wire bytes)."""
    a, c = gated(s, text), gated(s, text, kind="reply")
    assert a.key != c.key and a.request_digest == c.request_digest
    assert (a.account, a.target) == (c.account, c.target)
    return a, c


def approve(s, it, **kw):
    kw.setdefault("approver", "alice")
    kw.setdefault("expires_in", 600)
    return s.approve(it.key, **kw)


def reserve(s, it, apv, owner="w1", **kw):
    return s.reserve_claim(it.key, approval_id=apv.approval_id, request_digest=it.request_digest, owner=owner, **kw)


def authorize(s, it, claim, lease=None):
    lease = lease or s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    return lease


def everything(s, it, target=TARGET):
    """All a refused move could have changed."""
    c = s.claim(target)
    return (
        s.get(it.key),
        len(s.history(it.key)),
        s.attempts(it.key),
        c,
        [a.state for a in s.approvals(it.key)],
        len(s.claim_history(target)),
    )


# ---------------------------------------------------------------- the table
def test_shipped_machines_pass_their_checks():
    assert check_machines(table(), {m: machine(m) for m in MACHINES}) == {}


def test_every_machine_check_bites(monkeypatch):
    import dataclasses
    from types import MappingProxyType

    intent, claim = table(), machine("claim")
    machines = {m: machine(m) for m in MACHINES}

    def with_event(t, name, **changes):
        events = dict(t.events)
        events[name] = dataclasses.replace(events[name], **changes)
        return dataclasses.replace(t, events=MappingProxyType(events))

    broken = {
        # authorization without the claim
        "dispatch_needs_the_claim": (with_event(intent, "authorize_dispatch", couples_required=()), machines),
        # an unknown outcome that leaves the claim sending
        "in_flight_exits_move_the_claim": (
            with_event(intent, "record_unknown", couples=MappingProxyType({})),
            machines,
        ),
        # lease expiry reclaiming a sending claim
        "uncertain_claim_left_only_on_evidence": (
            intent,
            machines | {"claim": with_event(claim, "expire_sending", target="free")},
        ),
        # parking a queued intent that holds a reservation, without releasing it
        "queue_exits_release_the_claim": (with_event(intent, "park", couples=MappingProxyType({})), machines),
        "couplings_resolve": (
            with_event(intent, "record_unknown", couples=MappingProxyType({"claim": "no_such_event"})),
            machines,
        ),
        # a pre-flight on a guard no worker's write checks again would be the only gate
        "preflight_guards_belong_to_worker_moves": (
            intent,
            machines
            | {
                "claim": dataclasses.replace(
                    claim,
                    guards=MappingProxyType(
                        dict(claim.guards)
                        | {"claim_owner": dataclasses.replace(claim.guards["claim_owner"], preflight=True)}
                    ),
                )
            },
        ),
        "machine_graphs_hold": (
            intent,
            machines | {"claim": with_event(claim, "reserve", guards=("no_such_guard",))},
        ),
    }
    assert set(broken) == set(MACHINE_CHECKS)
    for name, (t, ms) in broken.items():
        assert name in check_machines(t, ms), name


# ---------------------------------------------------------------- approvals (docs/design.md#approvals-and-per-target-dispatch-claims)
def test_the_preflight_names_for_each_approval_the_guard_the_reservation_refuses_it_by(any_store):
    s = any_store.store
    it = gated(s)
    lapsed, withdrawn, live = approve(s, it, expires_in=5), approve(s, it), approve(s, it)
    s.withdraw_approval(withdrawn.approval_id, operator="alice")
    any_store.advance(6)
    before = everything(s, it)
    verdicts = s.check_approvals(it.key, request_digest=it.request_digest)
    assert [a.approval_id for a, _ in verdicts] == [a.approval_id for a in s.approvals(it.key)]
    assert dict((a.approval_id, g) for a, g in verdicts) == {
        lapsed.approval_id: "approval_usable",
        withdrawn.approval_id: "approval_usable",
        live.approval_id: None,
    }
    other_bytes = dict((a.approval_id, g) for a, g in s.check_approvals(it.key, request_digest="0" * 64))
    assert other_bytes[live.approval_id] == "approval_binds_request"
    assert everything(s, it) == before  # a check writes nothing
    for apv in (lapsed, withdrawn):  # the reservation refuses each by the guard the check named
        with pytest.raises(GuardRefused) as e:
            reserve(s, it, apv)
        assert e.value.guard == "approval_usable"
    with pytest.raises(GuardRefused) as e:
        s.reserve_claim(it.key, approval_id=live.approval_id, request_digest="0" * 64, owner="w1")
    assert e.value.guard == "approval_binds_request"
    assert reserve(s, it, live).approval_id == live.approval_id


def test_the_preflight_of_an_intent_without_approvals_is_empty_and_of_no_intent_refused(any_store):
    s = any_store.store
    it = gated(s)
    assert s.check_approvals(it.key, request_digest=it.request_digest) == []
    with pytest.raises(Rejected) as e:
        s.check_approvals("no-such-key", request_digest=it.request_digest)
    assert e.value.guard == "intent_exists"
    with pytest.raises(IntakeError) as bad:
        s.check_approvals(it.key, request_digest=it.request_digest, guards=["no_such_guard"])
    assert bad.value.field == "guards"


def test_an_approval_without_an_approver_is_refused_and_writes_nothing(any_store):
    s = any_store.store
    it = gated(s)
    with pytest.raises(GuardRefused) as e:
        approve(s, it, approver="   ")
    assert e.value.guard == "approver_identified"
    assert s.approvals(it.key) == [] and s.claim_history(TARGET) == []
    with pytest.raises(IntakeError):
        approve(s, it, expires_in=0)


def test_approval_binds_digest_account_target_and_version(any_store):
    s = any_store.store
    it = gated(s)
    a = approve(s, it)
    assert (a.key, a.request_digest, a.account, a.target, a.target_version, a.approver, a.state) == (
        it.key,
        it.request_digest,
        "acct",
        TARGET,
        0,
        "alice",
        "approved",
    )


def test_editing_the_draft_after_approval_sends_nothing_but_the_unchanged_bytes_dispatch(any_store):
    s = any_store.store
    original = gated(s, "the approved text")
    apv = approve(s, original)
    edited = gated(s, "the approved text, edited afterwards")  # a new draft revision: new bytes
    before = everything(s, edited)
    with pytest.raises(GuardRefused) as e:  # the old approval does not cover the edited bytes
        s.reserve_claim(edited.key, approval_id=apv.approval_id, request_digest=edited.request_digest, owner="w")
    assert e.value.guard == "approval_binds_request"
    assert everything(s, edited) == before
    # a worker presenting other bytes than the approved ones under the approval claims nothing either
    with pytest.raises(GuardRefused) as e:
        s.reserve_claim(original.key, approval_id=apv.approval_id, request_digest=edited.request_digest, owner="w")
    assert e.value.guard == "approval_binds_request"
    assert s.claim(TARGET).state == "free"
    claim = reserve(s, original, apv)
    authorize(s, original, claim)
    assert s.get(original.key).state == "authorized"
    assert s.get(edited.key).state == "pending" and s.attempts(edited.key) == []


def test_an_approval_of_one_draft_reserves_nothing_for_another_draft_with_the_same_bytes(any_store):
    s = any_store.store
    a, c = twins(s)
    apv_a = approve(s, a)
    before_a, before_c = everything(s, a), everything(s, c)
    with pytest.raises(GuardRefused) as e:  # same digest, account and target: only whose draft it was differs
        s.reserve_claim(c.key, approval_id=apv_a.approval_id, request_digest=c.request_digest, owner="w")
    assert e.value.guard == "approval_for_intent" and e.value.event == "reserve"
    assert (everything(s, a), everything(s, c)) == (before_a, before_c)
    assert s.claim(TARGET).state == "free" and s.approval(apv_a.approval_id).state == "approved"
    # C's own approval reserves, and it dispatches under it
    apv_c = approve(s, c, approver="bob")
    claim = reserve(s, c, apv_c)
    assert (claim.key, claim.approval_id) == (c.key, apv_c.approval_id)
    authorize(s, c, claim)
    assert s.get(c.key).state == "authorized" and s.approval(apv_c.approval_id).state == "consumed"
    assert s.get(a.key).state == "pending" and s.approval(apv_a.approval_id).state == "approved"


def test_an_approval_of_one_draft_replaces_nothing_for_another_draft_with_the_same_bytes(any_store):
    s = any_store.store
    a, c = twins(s)
    apv_a = approve(s, a)
    reserve(s, a, apv_a, lease_seconds=10)
    any_store.advance(11)  # the reservation lapsed: replace is the move now
    before_a, before_c = everything(s, a), everything(s, c)
    with pytest.raises(GuardRefused) as e:
        s.reserve_claim(c.key, approval_id=apv_a.approval_id, request_digest=c.request_digest, owner="w2")
    assert e.value.guard == "approval_for_intent" and e.value.event == "replace"
    assert (everything(s, a), everything(s, c)) == (before_a, before_c)
    assert s.claim(TARGET).key == a.key and s.claim(TARGET).epoch == 1


def test_expiry_between_approval_and_publish_updates_nothing(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it, expires_in=60)
    claim = reserve(s, it, apv, lease_seconds=600)
    lease = s.begin(it.key, lease_seconds=600)
    any_store.advance(61)  # the approval's deadline passes by the store clock
    before = everything(s, it)
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    assert e.value.guard == "approval_usable"
    assert everything(s, it) == before
    assert s.get(it.key).state == "pending" and s.claim(TARGET).state == "reserved"
    # expiry is a transition the sweeper makes
    due = s.due_approvals()
    assert [a.approval_id for a in due] == [apv.approval_id]
    assert s.expire_approval(due[0]).state == "expired"
    assert s.due_approvals() == []
    with pytest.raises(IllegalMove):
        s.expire_approval(due[0])


def test_an_unexpired_approval_cannot_be_expired(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    with pytest.raises(GuardRefused) as e:
        s.expire_approval(apv)
    assert e.value.guard == "approval_deadline_passed"
    assert s.approval(apv.approval_id).state == "approved"


def test_a_withdrawn_approval_authorizes_nothing(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    with pytest.raises(GuardRefused) as e:
        s.withdraw_approval(apv.approval_id, operator=" ")
    assert e.value.guard == "withdrawer_identified"
    assert s.withdraw_approval(apv.approval_id, operator="ops", reason="no longer wanted").state == "withdrawn"
    with pytest.raises(GuardRefused) as e:
        reserve(s, it, apv)
    assert e.value.guard == "approval_usable"


def test_a_gated_intent_is_never_authorized_without_its_claim(any_store):
    s = any_store.store
    it = gated(s)
    approve(s, it)
    lease = s.begin(it.key, lease_seconds=30)
    before = everything(s, it)
    with pytest.raises(Rejected) as e:  # the claim is free: no start_sending from there
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert e.value.guard == "source_state" and e.value.event == "start_sending"
    assert everything(s, it) == before
    claim = reserve(s, it, s.approvals(it.key)[0])
    with pytest.raises(GuardRefused) as e:  # reserved, but the caller does not present the claim
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert e.value.guard == "claim_owner"
    assert s.get(it.key).state == "pending"
    s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    assert s.get(it.key).state == "authorized"


def test_approved_dispatched_and_confirmed_stay_three_facts(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    claim = reserve(s, it, apv)
    assert (s.approval(apv.approval_id).state, s.claim(TARGET).state, s.get(it.key).state) == (
        "approved",
        "reserved",
        "pending",
    )
    lease = authorize(s, it, claim)
    assert (s.approval(apv.approval_id).state, s.claim(TARGET).state, s.get(it.key).state) == (
        "consumed",
        "sending",
        "authorized",
    )
    s.record_success(lease, remote_id="obj-1")
    assert s.get(it.key).state == "authorized"  # a 200 is not remote confirmation
    s.confirm_read_back(lease)
    assert (s.approval(apv.approval_id).state, s.claim(TARGET).state, s.get(it.key).state) == (
        "consumed",
        "free",
        "published",
    )
    assert s.approval(apv.approval_id).used_epoch == claim.epoch


# ---------------------------------------------------------------- target version (docs/design.md#approvals-and-per-target-dispatch-claims)
def test_the_loser_of_two_approvals_on_one_target_stays_pending_with_nothing_sent(any_store):
    s = any_store.store
    a, b = gated(s, "draft a"), gated(s, "draft b")  # parallel drafting on one target is allowed
    pa, pb = approve(s, a), approve(s, b)
    assert pa.target_version == pb.target_version == 0
    lease = authorize(s, a, reserve(s, a, pa))
    s.record_success(lease, remote_id="obj-a")
    s.confirm_read_back(lease)
    assert s.claim(TARGET).target_version == 1  # publication is a compare-and-set that bumps it
    with pytest.raises(GuardRefused) as e:
        reserve(s, b, pb, owner="w2")
    assert e.value.guard == "target_version_current"
    assert s.get(b.key).state == "pending" and s.attempts(b.key) == []
    # re-approved against the current version, it may go
    pb2 = approve(s, b, approver="bob")
    assert pb2.target_version == 1
    lease_b = authorize(s, b, reserve(s, b, pb2, owner="w2"))
    assert s.get(b.key).state == "authorized" and lease_b.key == b.key


def test_a_version_bump_while_reserved_stops_the_send(any_store):
    """The compare-and-set is re-checked at authorization: a stale approval loses there too."""
    s = any_store.store
    a, b = gated(s, "draft a"), gated(s, "draft b")
    pa = approve(s, a)
    pb = approve(s, b, target_version=1)  # drafted against a version that does not exist yet
    with pytest.raises(GuardRefused) as e:
        reserve(s, b, pb)
    assert e.value.guard == "target_version_current"
    claim = reserve(s, a, pa)
    lease = authorize(s, a, claim)
    s.record_not_sent(lease, reason="refused by platform")
    assert s.claim(TARGET).state == "free" and s.claim(TARGET).target_version == 1
    assert s.approval(pa.approval_id).state == "consumed"  # an approval authorizes one dispatch
    reserve(s, b, pb)  # now b's drafted version is current
    assert s.claim(TARGET).key == b.key


# ---------------------------------------------------------------- the claim (docs/design.md#approvals-and-per-target-dispatch-claims)
def test_parallel_drafts_one_dispatch(any_store):
    s = any_store.store
    drafts = [gated(s, f"draft {i}") for i in range(3)]
    apvs = [approve(s, d) for d in drafts]
    reserve(s, drafts[0], apvs[0])
    for d, a in zip(drafts[1:], apvs[1:], strict=True):
        with pytest.raises(GuardRefused) as e:
            reserve(s, d, a, owner="other")
        assert e.value.guard == "claim_lease_expired"
    assert [s.get(d.key).state for d in drafts] == ["pending"] * 3


def test_an_expired_reservation_is_replaced_and_the_old_token_is_void_and_recorded(any_store):
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    pa, pb = approve(s, a), approve(s, b)
    old = reserve(s, a, pa, owner="worker-A", lease_seconds=10)
    assert old.epoch == 1
    any_store.advance(11)
    new = reserve(s, b, pb, owner="worker-B")
    assert new.epoch == 2 and s.claim(TARGET).owner == "worker-B"
    before = everything(s, a)
    with pytest.raises(GuardRefused) as e:
        s.release_claim(old)
    assert e.value.guard == "claim_owner"
    assert everything(s, a) == before
    assert s.claim(TARGET).state == "reserved" and s.claim(TARGET).epoch == 2
    # the refusal is recorded, not silent: who presented what, what was current, what superseded it
    [ref] = s.refusals(f"claim:{TARGET}")
    assert ref.presented["owner"] == "worker-A" and ref.presented["claim_epoch"] == 1
    assert ref.current["epoch"] == 2 and ref.current["owner"] == "worker-B"
    replace_seq = [h.seq for h in s.claim_history(TARGET) if h.event == "replace"]
    assert ref.superseded_by_seq == replace_seq[-1]
    # ordered by the store's sequence: reserved, replaced, then the refusal after both
    events = [h.event for h in s.claim_history(TARGET) if h.machine == "claim"]
    assert events == ["reserve", "replace"]
    assert ref.seq > replace_seq[-1] or ref.recorded_at >= s.claim_history(TARGET)[-1].recorded_at
    # and the stale owner cannot use it to send either
    with pytest.raises(GuardRefused) as e:
        authorize(s, a, old)
    assert e.value.guard in ("bound_to_intent", "claim_owner")
    assert s.get(a.key).state == "pending"
    # the new owner releases with its own token
    assert s.release_claim(new).state == "free"


def test_a_live_reservation_cannot_be_replaced_and_a_stale_one_cannot_send(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    claim = reserve(s, it, apv, lease_seconds=10)
    with pytest.raises(GuardRefused) as e:
        reserve(s, it, apv, owner="w2")
    assert e.value.guard == "claim_lease_expired"
    lease = s.begin(it.key, lease_seconds=600)
    any_store.advance(11)
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    assert e.value.guard == "claim_lease_live"
    assert s.get(it.key).state == "pending"


def test_once_sending_lease_expiry_cannot_reclaim_it_only_uncertain(any_store):
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    pa, pb = approve(s, a), approve(s, b)
    authorize(s, a, reserve(s, a, pa))
    any_store.advance(3600)  # both leases long gone
    with pytest.raises(IllegalMove):  # replace needs a reserved claim: a sending one is not reclaimable
        reserve(s, b, pb, owner="w2")
    [due] = s.due_leases()
    s.expire_lease(due)  # the sweeper: intent indeterminate, claim uncertain
    assert s.get(a.key).state == "indeterminate" and s.claim(TARGET).state == "uncertain"
    with pytest.raises(IllegalMove):
        reserve(s, b, pb, owner="w2")
    assert s.get(b.key).state == "pending" and s.attempts(b.key) == []


def test_uncertain_is_left_only_on_remote_evidence(any_store):
    s = any_store.store
    it = gated(s)
    lease = authorize(s, it, reserve(s, it, approve(s, it)))
    s.record_unknown(lease, reason="connection reset")
    assert s.claim(TARGET).state == "uncertain"
    s.reconcile_not_found(s.get(it.key).plan)  # a lookup that finds nothing proves nothing
    assert s.claim(TARGET).state == "uncertain"
    s.reconcile_found(s.get(it.key).plan, remote_id="obj-7")
    assert s.get(it.key).state == "published" and s.claim(TARGET).state == "free"
    assert s.claim(TARGET).key is None


def test_a_fenced_absence_or_a_human_settles_an_uncertain_claim(any_store):
    s = any_store.store
    a = gated(s, "a")
    lease = authorize(s, a, reserve(s, a, approve(s, a)))
    s.record_unknown(lease, reason="timeout")
    s.reconcile_absent(s.get(a.key).plan, fenced=True)
    assert s.get(a.key).state == "failed" and s.claim(TARGET).state == "free"
    b = gated(s, "b")
    lease = authorize(s, b, reserve(s, b, approve(s, b)))
    s.record_unknown(lease, reason="timeout")
    s.park(b.key, operator="ops")  # parking is not evidence: the claim stays uncertain
    assert s.claim(TARGET).state == "uncertain"
    s.resolve_published(b.key, operator="ops", remote_id="obj-b")
    assert s.claim(TARGET).state == "free"
    kinds = [(h.event, h.actor) for h in s.claim_history(TARGET) if h.event == "settle_by_operator"]
    assert kinds == [("settle_by_operator", "operator:ops")]


def test_a_definitive_not_sent_releases_and_a_block_at_the_gate_frees_the_reservation(any_store):
    s = any_store.store
    it = gated(s)
    lease = authorize(s, it, reserve(s, it, approve(s, it)))
    s.record_not_sent(lease, reason="400")
    assert s.claim(TARGET).state == "free"
    other = gated(s, "other")
    reserve(s, other, approve(s, other))
    lease = s.begin(other.key, lease_seconds=30)
    s.block_at_gate(lease, reason="kill switch")
    assert s.get(other.key).state == "parked" and s.claim(TARGET).state == "free"


def test_a_refused_coupled_move_changes_nothing_anywhere(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    claim = reserve(s, it, apv)
    lease = s.begin(it.key, lease_seconds=30)
    s.withdraw_approval(apv.approval_id, operator="ops", reason="no longer wanted")
    before = everything(s, it)
    with pytest.raises(Rejected):
        s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    assert everything(s, it) == before


def test_intents_without_an_approval_requirement_never_touch_claims(any_store):
    s = any_store.store
    it = s.submit("acct", "post", TARGET, {"text": "plain"})
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest)
    s.record_unknown(lease, reason="x")
    assert s.claim(TARGET) is None and s.claim_history(TARGET) == []


# ---------------------------------------------------------------- docs/design.md#two-sql-traps, on both dialects
def test_trap_one_a_partial_unique_index_forbids_parallel_drafts_our_schema_allows_them(sql_store):
    """A UNIQUE(target) WHERE status IN (open statuses) index refuses a second pending draft; our schema
    keeps drafting parallel and serializes dispatch in a separate per-target claim row instead."""
    import sqlalchemy as sa

    s = sql_store
    with s.engine.connect() as conn:
        tx = conn.begin()
        conn.exec_driver_sql("CREATE TABLE trap_drafts (id INTEGER PRIMARY KEY, target TEXT, status TEXT)")
        conn.exec_driver_sql(
            "CREATE UNIQUE INDEX trap_one_open ON trap_drafts (target) "
            "WHERE status IN ('pending', 'approved', 'dispatched')"
        )
        conn.exec_driver_sql("INSERT INTO trap_drafts VALUES (1, 't', 'pending')")
        with pytest.raises(sa.exc.IntegrityError):
            with conn.begin_nested():
                conn.exec_driver_sql("INSERT INTO trap_drafts VALUES (2, 't', 'pending')")
        tx.rollback()
    drafts = [gated(s, f"parallel {i}") for i in range(3)]
    assert [s.get(d.key).state for d in drafts] == ["pending"] * 3
    for d in drafts:
        approve(s, d)
    assert len({a.approval_id for d in drafts for a in s.approvals(d.key)}) == 3


def test_trap_two_an_unguarded_claim_update_claims_two_approved_rows_ours_claims_one(sql_store):
    import sqlalchemy as sa

    s = sql_store
    a, b = gated(s, "a"), gated(s, "b")
    pa, pb = approve(s, a), approve(s, b)
    with s.engine.connect() as conn:  # the trap, on our own rows, rolled back
        tx = conn.begin()
        claimed = conn.execute(
            sa.text(
                "UPDATE aom_approvals SET state = 'consumed' WHERE target = :t AND state = 'approved' "
                "RETURNING approval_id"
            ),
            {"t": TARGET},
        ).all()
        assert len(claimed) == 2, "the unguarded UPDATE claims both approved rows"
        tx.rollback()
    assert {s.approval(x.approval_id).state for x in (pa, pb)} == {"approved"}
    won = reserve(s, a, pa)
    with pytest.raises(GuardRefused):
        reserve(s, b, pb, owner="w2")
    authorize(s, a, won)
    assert [s.approval(x.approval_id).state for x in (pa, pb)] == ["consumed", "approved"]
    assert [s.get(x.key).state for x in (a, b)] == ["authorized", "pending"]


def test_model_and_sql_registries_cover_exactly_the_machine_catalogues():
    from atmostonce.claims import APPROVAL_GUARDS, CLAIM_GUARDS
    from atmostonce_sql.claims import APPROVAL_SQL_GUARDS, CLAIM_SQL_GUARDS

    assert set(APPROVAL_GUARDS) == set(APPROVAL_SQL_GUARDS) == set(machine("approval").guards)
    assert set(CLAIM_GUARDS) == set(CLAIM_SQL_GUARDS) == set(machine("claim").guards)


def test_each_machine_effect_has_exactly_one_model_and_one_sql_implementation():
    from atmostonce.claims import APPROVAL_EFFECTS, CLAIM_EFFECTS
    from atmostonce_sql.claims import APPROVAL_SQL_EFFECTS, CLAIM_SQL_EFFECTS

    assert set(APPROVAL_EFFECTS) == set(APPROVAL_SQL_EFFECTS) == set(machine("approval").effects)
    assert set(CLAIM_EFFECTS) == set(CLAIM_SQL_EFFECTS) == set(machine("claim").effects)


def test_a_failed_read_back_leaves_the_claim_uncertain_and_the_target_held(any_store):
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    lease = authorize(s, a, reserve(s, a, approve(s, a)))
    s.record_success(lease, remote_id="obj-a")
    s.read_back_failed(lease, reason="read_back.not_found")  # the platform said yes, the read-back does not show it
    assert s.get(a.key).state == "indeterminate"
    c = s.claim(TARGET)
    assert (c.state, c.key) == ("uncertain", a.key)
    [entry] = [h for h in s.claim_history(TARGET) if h.event == "mark_uncertain"]
    assert entry.from_state == "sending"
    apv_b = approve(s, b)
    before = everything(s, b)
    with pytest.raises(IllegalMove):  # the target stays held: the post may exist
        reserve(s, b, apv_b)
    assert everything(s, b) == before


def test_a_person_establishing_not_sent_frees_the_uncertain_claim(any_store):
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    lease = authorize(s, a, reserve(s, a, approve(s, a)))
    s.record_unknown(lease, reason="timeout")
    s.park(a.key, operator="ops")
    assert s.claim(TARGET).state == "uncertain"
    s.resolve_not_sent(a.key, operator="ops")
    assert s.get(a.key).state == "failed"
    c = s.claim(TARGET)
    assert (c.state, c.key) == ("free", None)
    [entry] = [h for h in s.claim_history(TARGET) if h.event == "settle_by_operator"]
    assert (entry.from_state, entry.actor) == ("uncertain", "operator:ops")
    claim = reserve(s, b, approve(s, b))  # the target is free for the next draft
    authorize(s, b, claim)
    assert s.get(b.key).state == "authorized"


def test_a_deliberate_resend_by_an_operator_reopens_an_uncertain_claim(any_store):
    s = any_store.store
    it = gated(s)
    lease = authorize(s, it, reserve(s, it, approve(s, it)))
    s.record_unknown(lease, reason="timeout")
    s.park(it.key, operator="ops")
    assert s.claim(TARGET).state == "uncertain"
    s.resend(it.key, operator="ops")  # a person decided to send again, under a new resend epoch
    assert s.get(it.key).state == "pending" and s.claim(TARGET).state == "free"
    [entry] = [h for h in s.claim_history(TARGET) if h.event == "reopen_by_operator"]
    assert entry.actor == "operator:ops" and entry.from_state == "uncertain"
    # and it needs a new approval of its bytes to go again
    with pytest.raises(GuardRefused) as e:
        reserve(s, it, s.approvals(it.key)[0])
    assert e.value.guard == "approval_usable"


@pytest.mark.parametrize("where", ["reserved", "sending"])
def test_a_declared_restore_makes_a_held_claim_uncertain(any_store, where):
    s = any_store.store
    it = gated(s)
    claim = reserve(s, it, approve(s, it))
    if where == "sending":
        authorize(s, it, claim)
    else:
        s.begin(it.key, lease_seconds=30)
    epoch, fenced = s.declare_restore(operator="ops")
    assert fenced >= 1 and s.get(it.key).state == "indeterminate"
    c = s.claim(TARGET)
    assert c.state == "uncertain" and c.key == it.key  # after a restore nothing local proves what was sent
    [entry] = [h for h in s.claim_history(TARGET) if h.event == "fence_claim"]
    assert entry.from_state == where


def test_a_claim_is_reserved_only_for_a_queued_intent(any_store):
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    s.park(it.key, operator="ops")
    before = everything(s, it)
    with pytest.raises(GuardRefused) as e:
        reserve(s, it, apv)
    assert e.value.guard == "intent_queued"
    assert everything(s, it) == before


@pytest.mark.parametrize("how", ["park", "exhaust"])
def test_a_queued_intent_leaving_the_queue_releases_its_reservation(any_store, how):
    """The formal check's P16 (docs/formal.md): parking or exhausting a queued intent used to leave its
    reservation holding the target until the claim lease passed. It is now released in the same move."""
    s = any_store.store
    it = s.submit("acct", "post", TARGET, {"text": "a"}, requires_approval=True, max_attempts=1)
    other = gated(s, "b")
    reserve(s, it, approve(s, it))
    epoch = s.claim(TARGET).epoch
    if how == "park":
        s.park(it.key, operator="ops")
    else:  # its one attempt is begun and abandoned by the sweeper: the cap is spent
        s.begin(it.key, lease_seconds=5)
        any_store.advance(6)
        s.abandon_attempt(s.get(it.key))
        s.exhaust(it.key)
    assert s.get(it.key).state == "parked"
    c = s.claim(TARGET)
    assert (c.state, c.key, c.epoch) == ("free", None, epoch)
    [entry] = [h for h in s.claim_history(TARGET) if h.event == "release_with_intent"]
    assert entry.from_state == "reserved"
    assert entry.actor == ("operator:ops" if how == "park" else "worker")
    # the target is free at once: the other draft reserves without waiting out the parked one's lease
    claim = reserve(s, other, approve(s, other))
    authorize(s, other, claim)
    assert s.get(other.key).state == "authorized"


def test_parking_an_intent_whose_claim_is_bound_to_another_leaves_that_claim_alone(any_store):
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    reserve(s, a, approve(s, a))
    before = s.claim(TARGET)
    s.park(b.key, operator="ops")
    assert s.get(b.key).state == "parked" and s.claim(TARGET) == before


def test_a_claim_bound_to_one_draft_cannot_authorize_another(any_store):
    s = any_store.store
    d, e_ = gated(s, "draft d"), gated(s, "draft e")
    claim_d = reserve(s, d, approve(s, d))
    approve(s, e_)
    lease_e = s.begin(e_.key, lease_seconds=30)
    before = everything(s, e_)
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease_e, request_digest=e_.request_digest, claim=claim_d)
    assert e.value.guard == "bound_to_intent"
    assert everything(s, e_) == before
    authorize(s, d, claim_d)
    assert s.get(d.key).state == "authorized"


def test_a_claim_bound_to_one_draft_cannot_authorize_another_with_the_same_bytes(any_store):
    """Every other guard of start_sending holds here (the claim's owner token, its lease, the reserved
    approval, its digest, account, target and version are all the other draft's too): only the claim's
    binding to the intent keeps E from being authorized and sent under D's claim and D's approval."""
    s = any_store.store
    d, e_ = twins(s)
    apv_d = approve(s, d)
    claim_d = reserve(s, d, apv_d)
    approve(s, e_)
    lease_e = s.begin(e_.key, lease_seconds=30)
    before_d, before_e = everything(s, d), everything(s, e_)
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease_e, request_digest=e_.request_digest, claim=claim_d)
    assert e.value.guard == "bound_to_intent" and e.value.event == "start_sending"
    assert (everything(s, d), everything(s, e_)) == (before_d, before_e)
    assert s.get(e_.key).state == "pending" and s.get(d.key).state == "pending"
    assert [a.state for a in s.approvals(e_.key)] == ["approved"] and s.approval(apv_d.approval_id).state == "approved"
    assert s.claim(TARGET).state == "reserved" and s.claim(TARGET).key == d.key
    authorize(s, d, claim_d)
    assert s.get(d.key).state == "authorized" and s.approval(apv_d.approval_id).state == "consumed"
