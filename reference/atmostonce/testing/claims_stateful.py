"""The shipped stateful machine for approvals and per-target claims (docs/design.md#approvals-and-per-target-dispatch-claims).

Like :mod:`atmostonce.testing.stateful`: one Hypothesis machine, constructed with a store under
test, applies each step to the reference model and to that store, and after every step checks that
they agree (intent, claim and approval states, epochs, target versions, which guard refused) and
that the claim invariants hold. Rules: submit approval-gated drafts (several per target), approve
(with a blank approver, a stale target version, or the digest of an edited draft), reserve and
replace claims, release with a live or a stale token, authorize with the claim or with a stale
one, record every outcome, workers that die, sweeper passes (leases and approval expiry), the
database clock moving, reconciliation, withdrawal and operator settlement.

Use::

    from atmostonce.testing.claims_stateful import make_claims_machine
    from atmostonce.testing.stateful import StoreUnderTest
    TestClaims = make_claims_machine(lambda: StoreUnderTest(store, advance=...)).TestCase
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from ..errors import Rejected
from ..model import MemoryStore
from ..records import ClaimLease, Lease, Refusal
from .stateful import FakeClock, StoreUnderTest, _clock_moved

__all__ = ["make_claims_machine"]

TARGETS = ("store-1", "store-2")
TEXTS = ("v1", "v1 edited", "v2", "other")


def _outcome(fn: Callable[[], Any]) -> tuple[str, Any, Any]:
    try:
        return "ok", None, fn()
    except Rejected as exc:
        return type(exc).__name__, exc.guard, None


def _log_shape(log: list) -> list[tuple]:
    """A claim log without store-specific numbers: each entry's kind and fields, a refusal's supersession as
    the position of that move in the log."""
    where = {e.seq: i for i, e in enumerate(log)}
    out: list[tuple] = []
    for e in log:
        if isinstance(e, Refusal):
            out.append(
                (
                    "refused",
                    e.event,
                    e.guard,
                    e.presented.get("owner"),
                    e.presented.get("claim_epoch"),
                    where.get(e.superseded_by_seq),
                )
            )
        else:
            out.append((e.machine, e.event, e.actor, e.from_state, e.to_state, e.epoch, e.detail.get("owner")))
    return out


def make_claims_machine(factory: Callable[[], StoreUnderTest] | None = None) -> type[RuleBasedStateMachine]:
    """Build the machine class; ``factory()`` gives a fresh, empty store under test per example."""

    class ClaimsMachine(RuleBasedStateMachine):
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
            self.keys: list[str] = []
            self.approvals: list[tuple[str, str | None]] = []  # (model id, store id)
            self.claims: list[tuple[ClaimLease, ClaimLease | None]] = []  # every claim lease ever handed out
            self.leases: dict[str, tuple[Lease, Lease | None]] = {}  # key -> live intent lease pair
            self.sent_under: dict[str, int] = {}  # approval model id -> dispatches authorized under it

        def teardown(self) -> None:
            if self.sut is not None:
                self.sut.close()

        # -- plumbing -------------------------------------------------------------------------
        def both(self, fn: Callable[[Any, bool], Any]) -> tuple[tuple, tuple | None]:
            """Apply ``fn(store, is_model)`` to the model and the store; they must agree on the outcome."""
            m = _outcome(lambda: fn(self.model, True))
            if self.sut is None:
                return m, None
            store = self.sut.store
            s = _outcome(lambda: fn(store, False))
            assert m[:2] == s[:2], f"model {m[:2]} != store {s[:2]}"
            return m, s

        def advance(self, seconds: float) -> None:
            self.clock.advance(seconds)
            if self.sut is not None:  # set_clock when the store under test has it, else advance
                _clock_moved(self.sut, self.clock(), seconds)

        # -- drafting and approval ----------------------------------------------------------------
        @rule(tgt=st.sampled_from(TARGETS), text=st.sampled_from(TEXTS))
        def draft(self, tgt, text):
            (_, _, it), _ = self.both(
                lambda s, _m: s.submit("acct", "post", tgt, {"text": text}, requires_approval=True)
            )
            if it.key not in self.keys:
                self.keys.append(it.key)

        @rule(
            data=st.data(),
            approver=st.sampled_from(["alice", "bob", " "]),
            expires=st.sampled_from([120, 600, 3600]),  # long beside the wall time an example takes: the
            # real database clock moves too, and only advance() may decide an expiry the model can see
            edited=st.sampled_from([False, False, False, True]),
            version=st.sampled_from([None, None, None, 0, 1, 2]),
        )
        def approve(self, data, approver, expires, edited, version):
            if not self.keys:
                return
            key = data.draw(st.sampled_from(self.keys))
            digest = None
            if edited:  # the digest of another draft: an approval of bytes this intent does not carry
                other = data.draw(st.sampled_from(self.keys))
                digest = self.model.get(other).request_digest
            m, s = self.both(
                lambda st_, _m: st_.approve(
                    key, approver=approver, expires_in=expires, request_digest=digest, target_version=version
                )
            )
            if m[0] == "ok":
                self.approvals.append((m[2].approval_id, None if s is None else s[2].approval_id))

        def _approval_pair(self, data) -> tuple[str, str | None] | None:
            return data.draw(st.sampled_from(self.approvals)) if self.approvals else None

        @rule(data=st.data(), owner=st.sampled_from(["w1", "w2"]), lease=st.sampled_from([90, 300]))
        def reserve(self, data, owner, lease):
            pair = self._approval_pair(data)
            if pair is None:
                return
            a = self.model.approval(pair[0])
            key = a.key if data.draw(st.booleans()) or not self.keys else data.draw(st.sampled_from(self.keys))
            digest = self.model.get(key).request_digest

            def go(s, is_model):
                aid = pair[0] if is_model else pair[1]
                return s.reserve_claim(key, approval_id=aid, request_digest=digest, owner=owner, lease_seconds=lease)

            m, s = self.both(go)
            if m[0] == "ok":
                self.claims.append((m[2], None if s is None else s[2]))
                mc = self.model.claim(m[2].target)
                assert mc is not None and mc.epoch == m[2].epoch and mc.state == "reserved"

        @rule(data=st.data())
        def release(self, data):
            if not self.claims:
                return
            mc, sc = data.draw(st.sampled_from(self.claims))  # the newest one, or a stale one
            self.both(lambda s, is_model: s.release_claim(mc if is_model else sc))

        @rule()
        def stale_release_after_replace(self):
            """The newest reservation lapses, another worker replaces it under the same approval, and the first
            worker's release arrives late: refused and recorded after the reserve and the replace it followed."""
            if not self.claims:
                return
            mc, sc = self.claims[-1]
            c = self.model.claim(mc.target)
            pair = next((p for p in self.approvals if p[0] == mc.approval_id), None)
            if c is None or c.state != "reserved" or c.epoch != mc.epoch or pair is None:
                return
            step = max(0.0, mc.expires_at - self.model.now()) + 1
            later = self.model.now() + step
            if any(abs(a.expires_at - later) < 5 for a in self.model.due_approvals(10_000)) or any(
                abs(self.model.approval(p[0]).expires_at - later) < 5 for p in self.approvals
            ):
                return  # an approval deadline this close to the new time: the real database clock could decide it
            self.advance(step)
            digest = self.model.get(mc.key).request_digest

            def replace(s, is_model):
                aid = pair[0] if is_model else pair[1]
                return s.reserve_claim(mc.key, approval_id=aid, request_digest=digest, owner="w3", lease_seconds=90)

            m, s = self.both(replace)
            if m[0] == "ok":
                self.claims.append((m[2], None if s is None else s[2]))
            self.both(lambda s, is_model: s.release_claim(mc if is_model else sc))

        @rule(data=st.data(), present=st.sampled_from(["claim", "claim", "stale", "none"]))
        def begin_and_authorize(self, data, present):
            if not self.keys:
                return
            key = data.draw(st.sampled_from(self.keys))
            pair = self.leases.get(key)
            if pair is None:
                m, s = self.both(lambda st_, _m: st_.begin(key, lease_seconds=60))
                if m[0] != "ok":
                    return
                pair = (m[2], None if s is None else s[2])
                self.leases[key] = pair
            target = self.model.get(key).target
            mine = [c for c in self.claims if c[0].target == target]
            chosen: tuple[ClaimLease | None, ClaimLease | None] = (None, None)
            if mine and present != "none":
                chosen = mine[-1] if present == "claim" else data.draw(st.sampled_from(mine))
            digest = self.model.get(key).request_digest

            def go(s, is_model):
                lease = pair[0] if is_model else pair[1]
                claim = chosen[0] if is_model else chosen[1]
                return s.authorize_dispatch(lease, request_digest=digest, send_lease_seconds=60, claim=claim)

            m, _s = self.both(go)
            if m[0] == "ok" and chosen[0] is not None:
                aid = chosen[0].approval_id
                self.sent_under[aid] = self.sent_under.get(aid, 0) + 1

        @rule(data=st.data(), what=st.sampled_from(["published", "not_sent", "unknown", "read_back_failed"]))
        def record(self, data, what):
            live = [k for k, _ in self.leases.items() if self.model.get(k).state == "authorized"]
            if not live:
                return
            key = data.draw(st.sampled_from(live))
            pair = self.leases[key]

            def go(s, is_model):
                lease = pair[0] if is_model else pair[1]
                if what == "not_sent":
                    return s.record_not_sent(lease, reason="400")
                if what == "unknown":
                    return s.record_unknown(lease, reason="reset")
                s.record_success(lease, remote_id=f"obj-{key[:6]}")
                if what == "read_back_failed":
                    return s.read_back_failed(lease, reason="read_back.not_found")
                return s.confirm_read_back(lease)

            self.both(go)
            if self.model.get(key).state != "authorized":
                self.leases.pop(key, None)

        @rule(data=st.data())
        def worker_dies(self, data):
            if self.leases:
                self.leases.pop(data.draw(st.sampled_from(sorted(self.leases))))

        @rule(seconds=st.sampled_from([1, 91, 121, 301, 601, 3601]))
        def database_clock_advances(self, seconds):
            self.advance(seconds)

        @rule()
        def sweeper(self):
            for it in self.model.due_leases():
                ev = "expire_lease" if it.state == "authorized" else "abandon_attempt"
                self.both(lambda s, _m, it=it, ev=ev: getattr(s, ev)(s.get(it.key)))
                self.leases.pop(it.key, None)
            for a in self.model.due_approvals():
                pair = next(p for p in self.approvals if p[0] == a.approval_id)
                self.both(
                    lambda s, is_model, pair=pair: s.expire_approval(s.approval(pair[0] if is_model else pair[1]))
                )

        @rule(data=st.data(), how=st.sampled_from(["found", "absent", "not_found"]))
        def reconciler(self, data, how):
            unknown = [k for k in self.keys if self.model.get(k).state == "indeterminate"]
            if not unknown:
                return
            key = data.draw(st.sampled_from(unknown))

            def go(s, _m):
                plan = s.get(key).plan
                if how == "found":
                    return s.reconcile_found(plan, remote_id="obj-r")
                if how == "absent":
                    return s.reconcile_absent(plan, fenced=True)
                return s.reconcile_not_found(plan)

            self.both(go)

        @rule(
            data=st.data(),
            what=st.sampled_from(["park", "resolve_published", "resolve_not_sent", "resend", "withdraw"]),
        )
        def operator(self, data, what):
            if what == "withdraw":
                pair = self._approval_pair(data)
                if pair is not None:
                    # the approver (no reason needed), or another operator with or without a reason
                    who = data.draw(st.sampled_from(["alice", "ops"]))
                    why = data.draw(st.sampled_from([None, "", "no longer wanted"]))
                    self.both(
                        lambda s, is_model: s.withdraw_approval(
                            pair[0] if is_model else pair[1], operator=who, reason=why
                        )
                    )
                return
            if not self.keys:
                return
            key = data.draw(st.sampled_from(self.keys))
            if what == "park":
                self.both(lambda s, _m: s.park(key, operator="ops"))
            elif what == "resend":
                self.both(lambda s, _m: s.resend(key, operator="ops"))
            elif what == "resolve_published":
                self.both(lambda s, _m: s.resolve_published(key, operator="ops", remote_id="obj-h"))
            else:
                self.both(lambda s, _m: s.resolve_not_sent(key, operator="ops"))

        # -- invariants -------------------------------------------------------------------------------
        @invariant()
        def model_and_store_agree(self):
            if self.sut is None:
                return
            st_ = self.sut.store
            for key in self.keys:
                a, b = self.model.get(key), st_.get(key)
                assert (a.state, a.attempt_count) == (b.state, b.attempt_count), key
            for mid, sid in self.approvals:
                ma, sa_ = self.model.approval(mid), st_.approval(sid)
                assert (ma.state, ma.target_version, ma.key) == (sa_.state, sa_.target_version, sa_.key), mid
            for target in TARGETS:
                mc, sc = self.model.claim(target), st_.claim(target)
                assert (mc is None) == (sc is None), target
                if mc is not None and sc is not None:
                    assert (mc.state, mc.epoch, mc.target_version, mc.key, mc.owner) == (
                        sc.state,
                        sc.epoch,
                        sc.target_version,
                        sc.key,
                        sc.owner,
                    ), target

        @invariant()
        def preflights_agree(self):
            """The dispatcher's pre-flight (``check_approvals``) names the same refusing guard, or none, for
            each approval in the model and the store, for the intent's own bytes and for other bytes."""
            if self.sut is None:
                return
            st_ = self.sut.store
            ids = dict(self.approvals)
            for key in self.keys:
                for digest in (self.model.get(key).request_digest, "0" * 64):
                    m = {a.approval_id: g for a, g in self.model.check_approvals(key, request_digest=digest)}
                    s = {a.approval_id: g for a, g in st_.check_approvals(key, request_digest=digest)}
                    assert {ids[mid]: g for mid, g in m.items()} == s, key

        @invariant()
        def claim_logs_agree(self):
            """The full claim log of each target, moves and refused stale writes interleaved by the store's
            sequence, is the same in the model and the store; so is what each refusal names as its supersession
            (as a position in that log)."""
            if self.sut is None:
                return
            for target in TARGETS:
                assert _log_shape(self.model.claim_log(target)) == _log_shape(self.sut.store.claim_log(target)), target

        @invariant()
        def claims_hold(self):
            stores = [self.model] + ([self.sut.store] if self.sut is not None else [])
            for s in stores:
                for target in TARGETS:
                    c = s.claim(target)
                    inflight = [k for k in self.keys if s.get(k).target == target and s.get(k).state == "authorized"]
                    # at most one send in flight per target, and only under the claim that is sending
                    assert len(inflight) <= 1, (target, inflight)
                    if inflight:
                        assert c is not None and c.state == "sending" and c.key == inflight[0], (target, c)
                    if c is not None and c.state == "sending":
                        assert c.key is not None and s.get(c.key).state == "authorized", c
                    if c is not None and c.state == "uncertain":
                        # left only on evidence: the bound intent has not been settled without the claim
                        assert c.key is not None and s.get(c.key).state in ("indeterminate", "parked"), c
            for aid, n in self.sent_under.items():
                assert n <= 1, f"approval {aid} authorized {n} dispatches"
                assert self.model.approval(aid).state == "consumed"

    return ClaimsMachine
