"""Adversarial review of approvals bound to exact bytes and per-target dispatch claims (docs/design.md#approvals-and-per-target-dispatch-claims).

Every test here states what the feature promises and fails where the code does not keep it; the library
keeps all of them now. None of them sleeps or asserts on timing.
"""

from __future__ import annotations

import dataclasses
import threading

import pytest

from atmostonce import GuardRefused, IntakeError, MemoryStore, Rejected
from atmostonce.errors import StoreError
from atmostonce.records import Approval
from atmostonce.runtime import Dispatcher, RuntimeConfig
from atmostonce.testing.stateful import FakeClock
from atmostonce_http import HttpTransport, PlatformSink, sink_config
from tests.test_claims import approve, reserve

TARGET = "room-r"
CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)


def gated(s, text="hello", target=TARGET, **kw):
    return s.submit("acct", "post", target, {"text": text}, requires_approval=True, **kw)


@pytest.fixture
def platform():
    with PlatformSink(dedupe=False) as sink, HttpTransport(sink_config(sink.url, key_field="/delivery_key")) as t:
        yield sink, t


# ---------------------------------------------------------------- the gate can be lost at intake
def test_resubmitting_a_delivery_with_an_approval_requirement_never_hands_back_an_ungated_intent(any_store):
    """The delivery key ignores ``requires_approval``: a caller who asks for an approval gate on a delivery
    that was once submitted without one silently gets the ungated intent, which then dispatches with no
    approval and no claim. Either the resubmission is refused or the intent it returns is gated."""
    s = any_store.store
    s.submit("acct", "post", TARGET, {"text": "needs a yes"})
    try:
        it = s.submit("acct", "post", TARGET, {"text": "needs a yes"}, requires_approval=True)
    except (IntakeError, Rejected):
        return  # refusing the conflicting resubmission keeps the promise too
    assert it.requires_approval, "asked for an approval gate, got an intent without one"
    lease = s.begin(it.key, lease_seconds=30)
    with pytest.raises(Rejected):  # no approval, no claim: nothing may authorize this send
        s.authorize_dispatch(lease, request_digest=it.request_digest)


# ---------------------------------------------------------------- retractions around the gate
def test_a_correction_of_an_approval_gated_post_needs_an_approval_of_its_bytes(any_store, platform):
    """A correction replaces a published object's body with bytes nobody approved: ``submit_retraction``
    submits it without the approval requirement of the intent it corrects, so the dispatcher sends it
    straight away (and outside the target's claim)."""
    sink, transport = platform
    s = any_store.store
    orig = gated(s, "approved text")
    approve(s, orig)
    assert Dispatcher(s, transport, CONFIG).dispatch(orig.key) == "read_back.match"
    r = s.submit_retraction(s.get(orig.key).key, correction={"text": "text nobody approved"})
    outcome = Dispatcher(s, transport, CONFIG).dispatch(r.key)
    assert sink.updates == 0, f"unapproved correction bytes were sent ({outcome})"
    assert outcome == "gate.awaiting_approval"


def test_a_retraction_cannot_be_forged_through_plain_submit(any_store, platform):
    """``submit_retraction`` refuses to retract what is not published, but ``submit`` accepts any
    ``retract.delete`` intent with any remote id, and the dispatcher then deletes that object: a
    retraction of an intent that does not exist removes someone else's published post."""
    sink, transport = platform
    s = any_store.store
    victim = s.submit("acct", "post", "room", {"text": "somebody's post"})
    assert Dispatcher(s, transport, CONFIG).dispatch(victim.key) == "read_back.match"
    remote_id = s.get(victim.key).remote_id
    body = {"retracts": "no-such-intent", "remote_id": remote_id, "mode": "delete"}
    try:
        forged = s.submit("acct", "retract.delete", "room", body)
    except IntakeError:
        return  # refused at intake: the promise holds
    Dispatcher(s, transport, CONFIG).dispatch(forged.key)
    assert remote_id in sink.objects, "a retraction of an unknown intent deleted a published object"


# ---------------------------------------------------------------- bad input
def test_a_claim_lease_with_an_out_of_range_epoch_is_bad_input_not_a_driver_error(any_store):
    """``_claim_lease_args`` passes any int epoch through; a 64-bit overflow reaches the driver
    (SQLite: a raw OverflowError; PostgreSQL: StoreError 'bigint out of range')."""
    s = any_store.store
    it = gated(s)
    claim = reserve(s, it, approve(s, it))
    forged = dataclasses.replace(claim, epoch=2**63)
    with pytest.raises((IntakeError, Rejected)):
        s.release_claim(forged)
    lease = s.begin(it.key, lease_seconds=30)
    with pytest.raises((IntakeError, Rejected)):
        s.authorize_dispatch(lease, request_digest=it.request_digest, claim=forged)
    assert s.claim(TARGET).state == "reserved" and s.get(it.key).state == "pending"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.release_claim(None), id="release_claim(None)"),
        pytest.param(lambda s: s.release_claim("not a lease"), id="release_claim(str)"),
        pytest.param(lambda s: s.expire_approval(None), id="expire_approval(None)"),
        pytest.param(
            lambda s: s.expire_approval(Approval(12345, "k", "d", "a", "t", 0, "x", 0.0, "approved", 0.0)),
            id="expire_approval(int id)",
        ),
        pytest.param(
            lambda s: s.expire_approval(Approval("apv\x00", "k", "d", "a", "t", 0, "x", 0.0, "approved", 0.0)),
            id="expire_approval(NUL id)",
        ),
    ],
)
def test_claim_and_approval_operations_map_bad_records_to_intake_error(any_store, call):
    """``release_claim`` reads ``lease.target`` before checking the type; ``expire_approval`` never
    checks ``approval.approval_id``: AttributeError / TypeError (all stores), StoreError (PostgreSQL)."""
    with pytest.raises((IntakeError, Rejected)):
        call(any_store.store)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda s: s.approvals("k\x00"), id="approvals(NUL)"),
        pytest.param(lambda s: s.approvals(5), id="approvals(int)"),
        pytest.param(lambda s: s.claim_history("t\x00"), id="claim_history(NUL)"),
        pytest.param(lambda s: s.claim_history(5), id="claim_history(int)"),
    ],
)
def test_claim_reads_never_surface_bad_input_as_a_database_failure(any_store, call):
    """``approvals`` and ``claim_history`` skip ``check_text``: the model answers [], PostgreSQL raises
    StoreError (a NUL byte, or 'operator does not exist: text = integer'), as if the database failed."""
    try:
        out = call(any_store.store)
    except IntakeError:
        return
    except StoreError as exc:
        pytest.fail(f"bad input reported as a store failure: {exc}")
    assert out == []


def test_due_approvals_checks_its_limit_on_every_store(any_store):
    """SQL stores call ``check_limit``; the model does not: ``due_approvals(-1)`` silently drops the last
    due approval there, and a non-integer limit raises TypeError."""
    s = any_store.store
    with pytest.raises(IntakeError):
        s.due_approvals(-1)
    with pytest.raises(IntakeError):
        s.due_approvals("10")


# ---------------------------------------------------------------- model and SQL agree on the refusal record
def test_the_recorded_claim_refusal_is_the_same_on_the_model_and_sqlite(sqlite_store):
    """A gated authorization refused for a stale claim lease is recorded alike on the model and SQL (docs/design.md#refusals-are-recorded);
    one that presents no claim lease at all has nothing to attribute and is recorded by neither."""

    def scenario(s, advance):
        it = gated(s)
        apv = approve(s, it)
        old = reserve(s, it, apv, owner="worker-A", lease_seconds=10)
        lease = s.begin(it.key, lease_seconds=600)
        with pytest.raises(GuardRefused) as e:
            s.authorize_dispatch(lease, request_digest=it.request_digest)
        assert e.value.guard == "claim_owner"
        assert s.refusals(f"claim:{TARGET}") == []
        advance(11)
        reserve(s, it, apv, owner="worker-B")
        with pytest.raises(GuardRefused) as e:
            s.authorize_dispatch(lease, request_digest=it.request_digest, claim=old)
        [ref] = s.refusals(f"claim:{TARGET}")
        return (
            ref.event,
            ref.guard,
            dict(ref.presented),
            ref.current["state"],
            ref.current["epoch"],
            ref.current["owner"],
        )

    from atmostonce_sql.testing import age_leases

    clock = FakeClock()
    model = scenario(MemoryStore(clock=clock), clock.advance)
    assert model == scenario(sqlite_store, lambda secs: age_leases(sqlite_store, secs))
    assert model[2] == {"owner": "worker-A", "claim_epoch": 1, "key": model[2]["key"]} and model[2]["key"]


# ---------------------------------------------------------------- the dispatcher leaks reservations
def test_a_dispatch_refused_at_begin_does_not_keep_the_reservation_it_just_took(any_store, platform):
    """The dispatcher reserves the target's claim before ``begin``; when ``begin`` refuses (here another
    attempt is open), the exception leaves the fresh reservation held by nobody until its lease lapses,
    so every other approved draft for the target is turned away as busy meanwhile."""
    sink, transport = platform
    s = any_store.store
    it = gated(s, "first")
    approve(s, it)
    s.begin(it.key, lease_seconds=600)  # another worker's attempt, not yet authorized
    with pytest.raises(Rejected) as e:
        Dispatcher(s, transport, CONFIG, owner="w-late").dispatch(it.key)
    assert e.value.event == "begin"
    c = s.claim(TARGET)
    assert c.state == "free", f"claim left {c.state} by {c.owner} after its dispatch gave up"


# ---------------------------------------------------------------- PostgreSQL READ COMMITTED
@pytest.mark.postgres
def test_a_coupled_release_is_not_refused_when_the_claim_moved_on_meanwhile(pg_store, monkeypatch):
    """A non-required coupling (``block_at_gate`` -> ``release_with_intent``) decides from an unlocked
    SELECT of the claim whether it applies. If the claim is replaced between that SELECT and the UPDATE
    (READ COMMITTED), the UPDATE re-evaluates ``bound_to_intent`` on the new row and the whole intent
    move is refused, where the model (and a locked read) would skip the release and park the intent."""
    from atmostonce_sql.testing import age_leases

    s = pg_store
    a, b = gated(s, "a"), gated(s, "b")
    pa, pb = approve(s, a), approve(s, b)
    reserve(s, a, pa, owner="worker-A", lease_seconds=10)
    lease_a = s.begin(a.key, lease_seconds=600)
    age_leases(s, 11)  # A's reservation lapsed; its attempt lease did not

    original = type(s)._claim_row_before
    armed = {"on": False}
    replaced = {}
    threads = []

    def row_then_replace(self, conn, target, **kw):
        row = original(self, conn, target, **kw)
        if armed["on"]:
            armed["on"] = False
            t = threading.Thread(target=lambda: replaced.setdefault("claim", reserve(s, b, pb, owner="worker-B")))
            t.start()
            t.join(2)
            threads.append(t)
        return row

    monkeypatch.setattr(type(s), "_claim_row_before", row_then_replace)
    armed["on"] = True
    s.block_at_gate(lease_a, reason="gate.blocked:kill_switch_off")  # decides on the locked claim row
    for t in threads:
        t.join(60)
    assert s.get(a.key).state == "parked"
    assert replaced["claim"].key == b.key  # B's reservation waited for A's move, then took the freed claim
    c = s.claim(TARGET)
    assert (c.state, c.key) == ("reserved", b.key)


def test_the_dispatcher_does_not_pick_a_lapsed_approval_over_a_live_one(any_store, platform):
    """The dispatcher takes the newest approval still in state ``approved`` without looking at its
    deadline: a newer short approval that lapsed (and is not swept yet) hides an older live one, and the
    dispatch is refused until the sweeper runs, although the docs say the sweeper's timing never matters."""
    sink, transport = platform
    s = any_store.store
    it = gated(s)
    approve(s, it, expires_in=600)  # live for ten minutes
    any_store.advance(1)
    approve(s, it, approver="bob", expires_in=5)  # a second, short approval of the same bytes
    any_store.advance(6)  # the short one lapsed; nobody swept it yet
    outcome = Dispatcher(s, transport, CONFIG).dispatch(it.key)
    assert outcome == "read_back.match", f"a live approval of these bytes exists, yet: {outcome}"


def test_an_approval_and_claim_taken_for_an_ungated_intent_do_not_outlive_its_publication(any_store):
    """``approve`` and ``reserve_claim`` accept an intent submitted without the approval requirement, but
    its moves never couple the claim: once it is published the claim is still reserved for it (blocking
    every gated draft on the target until the lease lapses), the approval still reads ``approved`` for
    bytes already sent, and the target version was not bumped. Refusing is fine; this is not."""
    s = any_store.store
    plain = s.submit("acct", "post", TARGET, {"text": "no gate asked"})
    try:
        apv = approve(s, plain)
        claim = reserve(s, plain, apv)
    except (IntakeError, Rejected):
        return
    lease = s.begin(plain.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=plain.request_digest, claim=claim)
    s.record_success(lease, remote_id="obj-plain")
    s.confirm_read_back(lease)
    assert s.get(plain.key).state == "published"
    c = s.claim(TARGET)
    assert (c.state, c.key) != ("reserved", plain.key), "the target stays reserved for a published intent"
    assert s.approval(apv.approval_id).state != "approved", "an approval still usable after its bytes went out"


def test_a_stale_token_arriving_after_the_claim_moved_past_reserved_is_recorded_too(any_store):
    """docs/design.md#refusals-are-recorded: a stale release or use is refused *and recorded* (who presented which epoch, what was
    current). Only a ``claim_owner`` refusal is recorded; once the new owner's claim has moved on to
    ``sending`` (exactly the late-waking worker of docs/design.md#refusals-are-recorded) the old token is refused by the source state
    and nothing is written: the late worker leaves no trace."""
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    pa, pb = approve(s, a), approve(s, b)
    old = reserve(s, a, pa, owner="worker-A", lease_seconds=10)
    lease_a = s.begin(a.key, lease_seconds=600)
    any_store.advance(11)
    new = reserve(s, b, pb, owner="worker-B")
    s.authorize_dispatch(s.begin(b.key, lease_seconds=600), request_digest=b.request_digest, claim=new)
    assert s.claim(TARGET).state == "sending"
    with pytest.raises(Rejected):
        s.release_claim(old)  # worker A wakes up late and gives its claim back
    with pytest.raises(Rejected):
        s.authorize_dispatch(lease_a, request_digest=a.request_digest, claim=old)  # ... or tries to use it
    refs = s.refusals(f"claim:{TARGET}")
    assert [(r.presented["owner"], r.presented["claim_epoch"]) for r in refs] == [("worker-A", 1)] * 2, refs
    assert all(r.current["epoch"] == 2 and r.current["owner"] == "worker-B" for r in refs)


def test_a_stale_use_of_a_replaced_reservation_is_recorded(any_store):
    """The stale owner's attempt to *send* under a replaced reservation is refused by ``bound_to_intent``
    (the claim is now bound to the other draft), which is not a recorded fencing guard: the refused use
    leaves no row in the refusals, unlike the refused release right beside it."""
    s = any_store.store
    a, b = gated(s, "a"), gated(s, "b")
    pa, pb = approve(s, a), approve(s, b)
    old = reserve(s, a, pa, owner="worker-A", lease_seconds=10)
    lease_a = s.begin(a.key, lease_seconds=600)
    any_store.advance(11)
    reserve(s, b, pb, owner="worker-B")
    with pytest.raises(GuardRefused):
        s.authorize_dispatch(lease_a, request_digest=a.request_digest, claim=old)
    refs = s.refusals(f"claim:{TARGET}")
    assert [(r.event, r.presented["owner"], r.presented["claim_epoch"]) for r in refs] == [
        ("start_sending", "worker-A", 1)
    ], refs


def test_an_object_already_deleted_by_a_retraction_cannot_be_retracted_again(any_store, platform):
    """``submit_retraction`` only checks that the original is published with a remote id; the original
    stays ``published`` after its deletion, so a correction of the object that no longer exists is
    accepted and spends attempts on a PUT to nothing (a platform whose PUT upserts would create it)."""
    sink, transport = platform
    s = any_store.store
    orig = s.submit("acct", "post", "room", {"text": "doomed"})
    assert Dispatcher(s, transport, CONFIG).dispatch(orig.key) == "read_back.match"
    deletion = s.submit_retraction(orig.key)
    assert Dispatcher(s, transport, CONFIG).dispatch(deletion.key) == "read_back.match"
    assert s.get(deletion.key).state == "published" and s.get(orig.key).remote_id not in sink.objects
    with pytest.raises(IntakeError):
        s.submit_retraction(orig.key, correction={"text": "fixed after it was deleted"})


@pytest.mark.postgres
def test_a_withdrawal_racing_the_authorization_is_refused_as_the_model_refuses_it(pg_store, monkeypatch):
    """READ COMMITTED: ``start_sending`` checks ``approval_usable`` in the claim UPDATE, then
    ``consume_approval`` updates the approval with no guard. A withdrawal that commits in between makes
    the authorization fail with ``IllegalMove`` on ``consume_approval`` (an event the caller never named),
    not the ``GuardRefused(approval_usable)`` the model gives in either serial order; the dispatcher only
    releases its claim on a GuardRefused, so it leaks the reservation and raises instead."""
    from atmostonce_sql.claims import SqlClaims

    s = pg_store
    it = gated(s)
    apv = approve(s, it)
    claim = reserve(s, it, apv)
    lease = s.begin(it.key, lease_seconds=30)

    original = SqlClaims._aux_step
    done, threads = {}, []

    def withdraw():
        try:
            done["w"] = s.withdraw_approval(apv.approval_id, operator="ops", reason="no longer wanted")
        except Rejected as exc:
            done["w"] = exc

    def step_then_withdraw(self, conn, mname, event, subject, args, *, coupled=False):
        row = original(self, conn, mname, event, subject, args, coupled=coupled)
        if event == "start_sending" and not threads:
            t = threading.Thread(target=withdraw)
            t.start()
            t.join(2)  # it waits on the approval row this transaction locked before the claim's check
            threads.append(t)
        return row

    monkeypatch.setattr(SqlClaims, "_aux_step", step_then_withdraw)
    s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    for t in threads:
        t.join(60)
    assert threads and "w" in done
    # serialized as the model would: the authorization took the approval first, the withdrawal is refused
    assert isinstance(done["w"], Rejected) and done["w"].guard == "source_state", repr(done["w"])
    assert s.get(it.key).state == "authorized" and s.approval(apv.approval_id).state == "consumed"


BLANKS = ["\t", "\n", " \t ", "\u00a0", "\u3000"]
BLANK_IDS = [
    "tab",
    "newline",
    "spaces-and-tab",
    "no-break-space",
    "ideographic-space",
]  # plain ids: tools re-select by id


@pytest.mark.parametrize("blank", BLANKS, ids=BLANK_IDS)
def test_a_whitespace_only_approver_is_no_approver_on_every_store(any_store, blank):
    """``approver_identified`` is ``str.strip() != ""`` in the model but ``length(trim(x)) > 0`` in SQL (and
    in the CHECK constraint); SQL ``trim`` strips only the space character, so an approval 'by' a tab, a
    newline or a no-break space is refused by the model and accepted as a gate by SQLite and PostgreSQL."""
    s = any_store.store
    it = gated(s)
    with pytest.raises(GuardRefused) as e:
        approve(s, it, approver=blank)
    assert e.value.guard == "approver_identified"
    assert s.approvals(it.key) == []


@pytest.mark.parametrize("blank", BLANKS, ids=BLANK_IDS)
def test_a_whitespace_only_operator_cannot_withdraw_an_approval(any_store, blank):
    """The same trim mismatch in ``withdrawer_identified``: on SQL an unnamed operator withdraws approvals."""
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    with pytest.raises(GuardRefused) as e:
        s.withdraw_approval(apv.approval_id, operator=blank)
    assert e.value.guard == "withdrawer_identified"
    assert s.approval(apv.approval_id).state == "approved"


@pytest.mark.parametrize("blank", BLANKS, ids=BLANK_IDS)
def test_a_whitespace_only_operator_cannot_free_an_uncertain_claim(any_store, blank):
    """And in ``operator_identified``: through ``resolve_published`` an unnamed operator moves an uncertain
    claim to free on SQL (docs/design.md#approvals-and-per-target-dispatch-claims: uncertain is left only on remote evidence or by a *named* person)."""
    s = any_store.store
    it = gated(s)
    apv = approve(s, it)
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest, claim=reserve(s, it, apv))
    s.record_unknown(lease, reason="timeout")
    s.park(it.key, operator="ops")
    with pytest.raises(GuardRefused) as e:
        s.resolve_published(it.key, operator=blank, remote_id="obj-x")
    assert e.value.guard == "operator_identified"
    assert s.claim(TARGET).state == "uncertain"


def test_a_worker_idles_instead_of_spinning_on_drafts_that_await_approval(any_store, platform):
    """``Worker.run`` counts any returned outcome as progress (``did = True``) and so never waits: with
    a gated draft that awaits its approval (``gate.awaiting_approval``) or a busy target (``claim.busy``)
    among the claimable keys, a worker re-polls the store in a hot loop for as long as the draft waits."""
    import threading as th

    from atmostonce.runtime import Worker

    sink, transport = platform
    s = any_store.store
    waiting = gated(s, "nobody approved me yet")

    class CountingStop(th.Event):
        waits = 0

        def wait(self, timeout=None):
            CountingStop.waits += 1
            return super().wait(timeout)

    stop = CountingStop()
    rounds = {"n": 0}
    outcomes = []

    def keys():
        rounds["n"] += 1
        if rounds["n"] > 3:
            stop.set()
        return [waiting.key]

    w = Worker(Dispatcher(s, transport, CONFIG), keys, stop=stop, on_result=lambda k, r: outcomes.append(r))
    w.run()  # in this thread: three rounds, then the stop
    assert outcomes and set(outcomes) == {"gate.awaiting_approval"}
    assert CountingStop.waits >= 2, "no idle wait between rounds that could not make progress"
