"""SQL engine for the approval and claim machines (spec/approval.toml, spec/claim.toml; docs/design.md#approvals-and-per-target-dispatch-claims).

Each move is one conditional ``UPDATE ... WHERE <source states> AND <guard fragments> RETURNING``
on ``aom_claims`` or ``aom_approvals``, with a follow-up ``SELECT`` of the same fragments after zero
rows to name the guard that refused. An approval-gated intent's move and its coupled claim (and
approval) moves run in one transaction, intent first, then claim, then approval (one lock order,
so no cycle), and either all commit or none does. Every accepted move appends a row to
``aom_claim_history`` (append-only, ordered by its ``seq``).

Fragments take ``(c, now, x)``, as the intent guards of :mod:`atmostonce_sql.guards` do: ``c`` the
machine table's columns, ``now`` the database clock (seconds), ``x`` a
:class:`~atmostonce_sql.guards.GuardRefs` with the expressions of the intent key and approval id a guard
compares (bound parameters for direct moves, the claim row's own columns for coupled ones).
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, RowMapping

from atmostonce.claims import (
    DETAIL_FIELDS,
    RESERVE_OR_REPLACE,
    claim_refusal_recorded,
    claim_superseding_move,
    pick_reserve_event,
)
from atmostonce.errors import INTENT_EXISTS, LOST_RACE, SOURCE_STATE, GuardRefused, IllegalMove, Rejected, UnknownIntent
from atmostonce.names import CLAIM_EVENT
from atmostonce.records import Approval, Claim, ClaimEntry, OperatorKey, check_limit, check_text
from atmostonce.signing import SIGNED_FIELDS
from atmostonce.table import Table

from .guards import GuardRefs, SqlGuard
from .schema import approvals, claim_history, claims, intents, operator_keys, refusals, signing_policies

__all__ = ["APPROVAL_SQL_EFFECTS", "APPROVAL_SQL_GUARDS", "CLAIM_SQL_EFFECTS", "CLAIM_SQL_GUARDS", "SqlClaims"]


def _p(name: str, type_: Any = None) -> sa.BindParameter:
    return sa.bindparam(f"c_{name}", type_=sa.Text() if type_ is None else type_, required=False)


Refs = GuardRefs
"""The intent guards' :class:`~atmostonce_sql.guards.GuardRefs`: one calling convention for every machine."""


def _named(expr) -> sa.ColumnElement:
    return sa.func.length(sa.func.trim(expr)) > 0


# ------------------------------------------------------------------ claim guards
def intent_queued(c, now, x):
    i = intents.c
    return sa.exists().where(i.key == x.key, i.state == sa.literal(x.table.initial, sa.Text))


def approval_usable(c, now, x):
    a = approvals.c
    return sa.exists().where(
        a.approval_id == x.approval_id, a.state == sa.literal(x.approval_table.initial, sa.Text), a.expires_at > now
    )


def approval_binds_request(c, now, x):
    # the bytes, account and target of the move's own intent row; whose draft it was is approval_for_intent's
    a, i = approvals.c, intents.c
    return sa.exists().where(
        a.approval_id == x.approval_id,
        i.key == x.key,
        a.request_digest == _p("request_digest"),
        a.request_digest == i.request_digest,
        a.account == i.account,
        a.target == i.target,
        a.target == c.target,
    )


def approval_for_intent(c, now, x):
    a = approvals.c
    return sa.exists().where(a.approval_id == x.approval_id, a.key == x.key)


_SIG_TYPES = {"target_version": sa.BigInteger(), "expires_at": sa.Float(53)}


def approval_signature_verified(c, now, x):
    # What SQL can check: the account's signing policy, and that the approval row (signature, key id and
    # every signed field) is exactly what the worker verified in Python, under a key registered to the
    # approver with the public key the worker verified against. NULL parameters (nothing verified) fail.
    a, k, pol = approvals.c, operator_keys.c, signing_policies.c
    required = sa.exists().where(pol.account == a.account, pol.required)
    verified = sa.and_(
        a.approval_id == _p("sig_approval_id"),
        a.signature == _p("sig_signature"),
        a.signing_key_id == _p("sig_key_id"),
        *[a[f] == _p(f"sig_{f}", _SIG_TYPES.get(f)) for f in SIGNED_FIELDS],
        sa.exists().where(k.key_id == a.signing_key_id, k.operator == a.approver, k.public_key == _p("sig_public_key")),
    )
    return sa.exists().where(a.approval_id == x.approval_id, sa.or_(~required, sa.func.coalesce(verified, sa.false())))


def target_version_current(c, now, x):
    a = approvals.c
    return sa.exists().where(a.approval_id == x.approval_id, a.target_version == c.target_version)


def claim_owner(c, now, x):
    return sa.and_(c.owner_token == _p("claim_token"), c.epoch == _p("claim_epoch", sa.BigInteger()))


def claim_lease_live(c, now, x):
    return c.lease_expires_at > now


def claim_lease_expired(c, now, x):
    return c.lease_expires_at <= now


def bound_to_intent(c, now, x):
    return c.key == x.key


CLAIM_SQL_GUARDS: dict[str, SqlGuard] = {
    f.__name__: f
    for f in (
        intent_queued,
        approval_usable,
        approval_binds_request,
        approval_for_intent,
        approval_signature_verified,
        target_version_current,
        claim_owner,
        claim_lease_live,
        claim_lease_expired,
        bound_to_intent,
    )
}


# ------------------------------------------------------------------ effects: ``(c, now)`` to the columns they SET
def take_claim(c, now):
    return {
        "epoch": c.epoch + 1,
        "owner_token": _p("new_token"),
        "owner": _p("owner"),
        "key": _p("key"),
        "approval_id": _p("approval_id"),
        "lease_expires_at": now + _p("claim_lease_seconds", sa.Float(53)),
    }


def drop_claim(c, now):
    return {"owner_token": None, "owner": None, "key": None, "approval_id": None, "lease_expires_at": None}


def bump_target_version(c, now):
    return {"target_version": c.target_version + 1}


def extend_claim_lease(c, now):  # the intent's send lease, so both deadlines pass together
    return {"lease_expires_at": _p("lease_until", sa.Float(53))}


def mark_used(c, now):
    return {"used_epoch": _p("claim_epoch", sa.BigInteger())}


def record_approval(c, now):
    """The creating event's ``INSERT ... SELECT`` is :meth:`SqlClaims._approve`'s; no move applies it to a row."""
    raise AssertionError("record_approval creates the approval row; no move applies it")  # pragma: no cover


CLAIM_SQL_EFFECTS: dict[str, Any] = {
    f.__name__: f for f in (take_claim, drop_claim, bump_target_version, extend_claim_lease)
}
APPROVAL_SQL_EFFECTS: dict[str, Any] = {f.__name__: f for f in (mark_used, record_approval)}


# ------------------------------------------------------------------ approval guards
def approver_identified(c, now, x):
    return _named(_p("approver"))


_approved_intent = intents.alias("aom_approved_intent")  # not correlated with the approval INSERT's own FROM


def intent_awaiting_approval(c, now, x):
    i = _approved_intent.c
    return sa.exists().where(i.key == x.key, i.state == sa.literal(x.table.initial, sa.Text))


def approval_covers_intent_bytes(c, now, x):
    # the digest given (none: the intent's own, which the INSERT then writes) is the intent's
    i = _approved_intent.c
    return sa.exists().where(
        i.key == x.key, sa.func.coalesce(_p("request_digest"), i.request_digest) == i.request_digest
    )


def approval_deadline_passed(c, now, x):
    return c.expires_at <= now


def withdrawer_identified(c, now, x):
    return _named(_p("operator"))


def withdrawal_attributable(c, now, x):
    # NULL-safe: a missing reason or operator is false, never unknown
    return sa.or_(
        sa.and_(_p("operator").is_not(None), c.approver == _p("operator")),
        sa.func.coalesce(_named(_p("reason")), sa.false()),
    )


APPROVAL_SQL_GUARDS: dict[str, SqlGuard] = {
    f.__name__: f
    for f in (
        approver_identified,
        intent_awaiting_approval,
        approval_covers_intent_bytes,
        approval_deadline_passed,
        withdrawer_identified,
        withdrawal_attributable,
    )
}


class SqlClaims:
    """Approval and claim primitives for :class:`~atmostonce_sql.store.SqlStore` (mixed in)."""

    # what the store this is mixed into provides (SqlStore.__init__, atmostonce.store.Operations)
    table: Table
    approval_table: Table
    claim_table: Table
    dialect: str
    _disabled_guards: frozenset[str] = frozenset()
    _cache: dict[tuple[Any, ...], dict[str, Any]]
    _now: sa.ColumnElement[Any]
    if TYPE_CHECKING:

        def _tx(self, autocommit: bool = False) -> AbstractContextManager[Connection]: ...

    # -- building blocks -----------------------------------------------------------------------
    def _machine(self, mname: str):
        return (
            (self.approval_table, approvals, APPROVAL_SQL_GUARDS, approvals.c.approval_id)
            if mname == "approval"
            else (self.claim_table, claims, CLAIM_SQL_GUARDS, claims.c.target)
        )

    def _refs(self, mname: str, coupled: bool) -> Refs:
        if coupled and mname == "claim":  # the claim row's own binding
            return Refs(_p("key"), claims.c.approval_id, self.table, self.approval_table)
        return Refs(_p("key"), _p("approval_id"), self.table, self.approval_table)

    def _aux_statements(self, mname: str, event: str, coupled: bool) -> dict[str, Any]:
        cache_key = (f"<{mname}>{event}", self._disabled_guards, coupled)
        hit = self._cache.get(cache_key)
        if hit is not None:
            return hit
        t, tbl, guards, subject = self._machine(mname)
        ev = t.event(event)
        c, x = tbl.c, self._refs(mname, coupled)
        where = [subject == _p("subject"), c.state.in_([sa.literal(s, sa.Text) for s in ev.sources])]
        where += [guards[g](c, self._now, x) for g in ev.guards if g not in self._disabled_guards]
        values: dict[str, Any] = {"state": ev.target, "updated_at": self._now}
        for eff in ev.effects:
            values.update((APPROVAL_SQL_EFFECTS if mname == "approval" else CLAIM_SQL_EFFECTS)[eff](c, self._now))
        update = sa.update(tbl).where(*where).values(**values).returning(*tbl.c)
        checked = [g for g in ev.guards if g not in self._disabled_guards]
        diagnose = sa.select(c.state, *[sa.case((guards[g](c, self._now, x), 1), else_=0) for g in checked]).where(
            subject == _p("subject")
        )
        out = {"update": update, "diagnose": diagnose, "event": ev, "checked": checked}
        self._cache[cache_key] = out
        return out

    @staticmethod
    def _aux_params(subject: str, args: Mapping[str, Any]) -> dict[str, Any]:
        names = (
            "key",
            "approval_id",
            "request_digest",
            "claim_token",
            "claim_epoch",
            "owner",
            "operator",
            "approver",
            "new_token",
            "claim_lease_seconds",
            "lease_until",
            "reason",
            "sig_approval_id",
            "sig_signature",
            "sig_key_id",
            "sig_public_key",
            *(f"sig_{f}" for f in SIGNED_FIELDS),
        )
        out = {f"c_{n}": args.get(n) for n in names}
        out["c_subject"] = subject
        return out

    def _aux_step(self, conn: Connection, mname: str, event: str, subject: str, args, *, coupled: bool = False):
        """One conditional write of ``event`` on ``subject``; returns the moved row or raises the refusal."""
        stmts = self._aux_statements(mname, event, coupled)
        params = self._aux_params(subject, args)
        row = conn.execute(stmts["update"], params).mappings().first()
        if row is None:
            raise self._aux_diagnose(conn, stmts, subject, params)
        return row

    def _aux_diagnose(self, conn: Connection, stmts, subject: str, params) -> Rejected:
        ev = stmts["event"]
        found = conn.execute(stmts["diagnose"], params).first()
        if found is None:
            return UnknownIntent(ev.name, subject, "subject_exists", None)
        if found[0] not in ev.sources:
            return IllegalMove(ev.name, subject, SOURCE_STATE, found[0])
        for i, g in enumerate(stmts["checked"]):  # the guards this statement evaluates, in table order
            if not found[i + 1]:
                return GuardRefused(ev.name, subject, g, found[0])
        return Rejected(ev.name, subject, LOST_RACE, found[0], "the row changed between the write and the diagnosis")

    def _aux_history(self, conn, mname, subject, target, event, actor, from_state, row, args) -> None:
        detail = {k: args[k] for k in DETAIL_FIELDS if args.get(k)}
        conn.execute(
            sa.insert(claim_history).values(
                machine=mname,
                subject=subject,
                target=target,
                event=event,
                actor=actor,
                from_state=from_state,
                to_state=row["state"],
                epoch=row.get("epoch") if mname == "claim" else None,
                key=row.get("key"),
                detail=detail,
                recorded_at=self._now,
            )
        )

    def _ensure_claim_row(self, conn: Connection, target: str) -> None:
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:  # the same on_conflict_do_nothing API as PostgreSQL's
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        conn.execute(
            insert(claims)
            .values(target=target, state=self.claim_table.initial, epoch=0, target_version=0, updated_at=self._now)
            .on_conflict_do_nothing(index_elements=["target"])
        )

    def _claim_row_before(self, conn, target, *, lock: bool = False):
        """The claim row; ``lock``: held until the transaction ends (PostgreSQL ``FOR UPDATE``; SQLite's
        writer lock already serializes), so a coupled move decides on the row it then moves."""
        q = sa.select(claims).where(claims.c.target == target)
        if lock and self.dialect == "postgresql":
            q = q.with_for_update()
        return conn.execute(q).mappings().first()

    # -- primitives -----------------------------------------------------------------------------
    def _approve(self, args):
        ev = next(e for e in self.approval_table.events.values() if e.creates)
        with self._tx() as conn:
            it = conn.execute(sa.select(intents.c.target).where(intents.c.key == args["key"])).first()
            if it is None:
                raise UnknownIntent(ev.name, args["key"], INTENT_EXISTS, None)
            self._ensure_claim_row(conn, it[0])
            i, cl = intents.c, claims.c
            x = self._refs("approval", False)
            checks = [
                APPROVAL_SQL_GUARDS[g](approvals.c, self._now, x) for g in ev.guards if g not in self._disabled_guards
            ]
            version = sa.func.coalesce(_p("target_version", sa.BigInteger()), cl.target_version)
            src = (
                sa.select(
                    _p("approval_id"),
                    i.key,
                    sa.func.coalesce(_p("request_digest"), i.request_digest),
                    i.account,
                    i.target,
                    version,
                    _p("approver"),
                    sa.func.coalesce(_p("expires_at", sa.Float(53)), self._now + _p("expires_in", sa.Float(53))),
                    sa.literal(ev.target, sa.Text),
                    self._now,
                    self._now,
                    _p("signature"),
                    _p("signing_key_id"),
                )
                .select_from(intents.join(claims, cl.target == i.target))
                .where(i.key == _p("key"), *checks)
            )
            cols = [
                "approval_id",
                "key",
                "request_digest",
                "account",
                "target",
                "target_version",
                "approver",
                "expires_at",
                "state",
                "approved_at",
                "updated_at",
                "signature",
                "signing_key_id",
            ]
            params = self._aux_params(args["approval_id"], args) | {
                "c_target_version": args["target_version"],
                "c_expires_in": args["expires_in"],
                "c_expires_at": args["expires_at"],
                "c_signature": args["signature"],
                "c_signing_key_id": args["signing_key_id"],
            }
            row = (
                conn.execute(sa.insert(approvals).from_select(cols, src).returning(*approvals.c), params)
                .mappings()
                .first()
            )
            if row is None:
                for g in ev.guards:  # the only other reason for zero rows
                    ok = conn.execute(sa.select(APPROVAL_SQL_GUARDS[g](approvals.c, self._now, x)), params).scalar()
                    if not ok:
                        raise GuardRefused(ev.name, args["key"], g, None)
                raise Rejected(ev.name, args["key"], LOST_RACE, None)  # pragma: no cover
            actor = f"approver:{args['approver']}"
            self._aux_history(conn, "approval", row["approval_id"], row["target"], ev.name, actor, None, row, args)
            return _approval(row)

    def _claim_move(self, event, target, args):
        try:
            with self._tx() as conn:
                self._ensure_claim_row(conn, target)
                before = self._claim_row_before(conn, target, lock=True)
                if event == RESERVE_OR_REPLACE:  # decided on the locked row, so a concurrent move cannot stale it
                    event = pick_reserve_event(self.claim_table, before["state"])
                row = self._aux_step(conn, "claim", event, target, args)
                actor = self.claim_table.event(event).actor
                self._aux_history(conn, "claim", target, target, event, actor, before["state"], row, args)
                return _claim(row)
        except Rejected as exc:
            if claim_refusal_recorded(exc, args):
                self._record_claim_refusal(target, exc, args)
            raise

    def _preflight_statement(self, checked: tuple[str, ...]):
        """One ``SELECT`` of every approval of an intent with, per approval, whether each of ``checked`` passes:
        the claim fragments of the reserve, with the candidate's id where the move binds the presented one."""
        cache_key = ("<claim>preflight", checked)
        hit = self._cache.get(cache_key)
        if hit is not None:
            return hit["select"]
        subject, cand = intents.alias("subject"), approvals.alias("candidate")
        x = Refs(_p("key"), cand.c.approval_id, self.table, self.approval_table)
        passes = [
            sa.case((CLAIM_SQL_GUARDS[g](claims.c, self._now, x), 1), else_=0).label(f"passes_{i}")
            for i, g in enumerate(checked)
        ]
        stmt = (
            sa.select(subject.c.key.label("subject_key"), *cand.c, *passes)
            .select_from(
                subject.outerjoin(cand, cand.c.key == subject.c.key).outerjoin(
                    claims, claims.c.target == subject.c.target
                )
            )
            .where(subject.c.key == _p("key"))
            .order_by(cand.c.approved_at, cand.c.approval_id)  # as approvals() orders them
        )
        self._cache[cache_key] = {"select": stmt}
        return stmt

    def _check_approvals(self, key, args, guards):
        checked = tuple(g for g in guards if g not in self._disabled_guards)
        with self._tx() as conn:
            rows = conn.execute(self._preflight_statement(checked), self._aux_params(key, args)).mappings().all()
        if not rows:
            raise UnknownIntent(CLAIM_EVENT.reserve, key, INTENT_EXISTS, None)
        out = []
        for r in rows:
            if r["approval_id"] is None:
                continue  # the intent's row alone: it has no approval
            passed = {g: bool(r[f"passes_{i}"]) for i, g in enumerate(checked)}  # disabled guards are absent
            out.append((_approval(r), next((g for g in guards if not passed.get(g, True)), None)))
        return out

    def _approval_move(self, event, approval_id, args):
        with self._tx() as conn:
            before = conn.execute(sa.select(approvals).where(approvals.c.approval_id == approval_id)).mappings().first()
            if before is None:
                raise UnknownIntent(event, approval_id, "approval_exists", None)
            row = self._aux_step(conn, "approval", event, approval_id, args)
            actor = f"operator:{args['operator']}" if args.get("operator") else self.approval_table.event(event).actor
            self._aux_history(conn, "approval", approval_id, row["target"], event, actor, before["state"], row, args)
            return _approval(row)

    def _coupled_moves(
        self, conn: Connection, ev, intent_row: Mapping[str, Any] | RowMapping, args: Mapping[str, Any]
    ) -> None:
        """The claim (and approval) moves an approval-gated intent's move carries, in its transaction.
        A non-required coupling applies only when the claim is bound to the intent and in a source state."""
        cev_name = ev.couples.get("claim")
        if cev_name is None or not intent_row["requires_approval"]:
            return
        cev = self.claim_table.event(cev_name)
        target, key = intent_row["target"], intent_row["key"]
        required = "claim" in ev.couples_required
        before = self._claim_row_before(conn, target, lock=True)
        if before is None and not required:
            return
        if before is None:  # refused below (no claim was ever reserved), and rolled back with the move
            self._ensure_claim_row(conn, target)
            before = self._claim_row_before(conn, target)
        bound = before["key"] is not None and before["key"] == key
        if not required and (not bound or before["state"] not in cev.sources):
            return
        if (
            cev.couples.get("approval") is not None
            and before["approval_id"] is not None
            and self.dialect == "postgresql"
        ):
            # the approval row too, before the claim's guards read it: a withdrawal or expiry that
            # commits meanwhile is seen by the next statement, and refuses as approval_usable
            conn.execute(
                sa.select(approvals.c.approval_id)
                .where(approvals.c.approval_id == before["approval_id"])
                .with_for_update()
            )
        inputs = dict(args) | {"key": key, "lease_until": intent_row["lease_expires_at"]}
        try:
            row = self._aux_step(conn, "claim", cev_name, target, inputs, coupled=True)
        except Rejected as exc:
            exc.presented = inputs  # type: ignore[attr-defined]
            raise
        actor = f"operator:{args['operator']}" if args.get("operator") else cev.actor
        self._aux_history(conn, "claim", target, target, cev_name, actor, before["state"], row, inputs)
        aev = cev.couples.get("approval")
        if aev is not None:
            aid = before["approval_id"]
            a_before = conn.execute(sa.select(approvals.c.state).where(approvals.c.approval_id == aid)).scalar()
            arow = self._aux_step(conn, "approval", aev, aid, inputs | {"claim_epoch": before["epoch"]})
            self._aux_history(conn, "approval", aid, target, aev, cev.actor, a_before, arow, inputs)

    def _record_claim_refusal(self, target: str, exc: Rejected, args: Mapping[str, Any]) -> None:
        with self._tx() as conn:
            row = self._claim_row_before(conn, target)
            if row is None:
                return
            h = claim_history.c
            moves = conn.execute(
                sa.select(h.seq, h.epoch).where(h.target == target, h.machine == "claim").order_by(h.seq)
            ).all()
            last = claim_superseding_move([tuple(m) for m in moves], args.get("claim_epoch"))
            conn.execute(
                sa.insert(refusals).values(
                    claim_seq=self._next_claim_seq(conn),
                    key=f"claim:{target}",
                    event=exc.event,
                    guard=exc.guard,
                    presented={
                        "owner": args.get("owner"),
                        "claim_epoch": args.get("claim_epoch"),
                        "key": args.get("key"),
                    },
                    current={"state": row["state"], "epoch": row["epoch"], "owner": row["owner"], "key": row["key"]},
                    superseded_by_seq=last,
                    recorded_at=self._now,
                )
            )

    def _next_claim_seq(self, conn: Connection) -> int:
        """A number from the claim log's one sequence (``aom_claim_history.seq``), for a claim refusal, so
        moves and refusals of a target sort together (migration 0007). PostgreSQL: the identity's own
        sequence; SQLite: its AUTOINCREMENT counter, bumped in this write transaction in one statement."""
        if self.dialect == "postgresql":
            return int(
                conn.execute(sa.text("SELECT nextval(pg_get_serial_sequence('aom_claim_history', 'seq'))")).scalar_one()
            )
        top = "coalesce((SELECT max(seq) FROM aom_claim_history), 0)"
        got = conn.execute(
            sa.text(
                f"UPDATE sqlite_sequence SET seq = max(seq, {top}) + 1 WHERE name = 'aom_claim_history' RETURNING seq"
            )
        ).scalar()
        if got is None:  # no claim history row was ever written: the counter starts here
            conn.execute(sa.text(f"INSERT INTO sqlite_sequence (name, seq) VALUES ('aom_claim_history', {top} + 1)"))
            got = conn.execute(sa.text("SELECT seq FROM sqlite_sequence WHERE name = 'aom_claim_history'")).scalar()
        return int(got)  # type: ignore[arg-type]  # the statements above leave the counter set

    # -- signed approvals -----------------------------------------------------------------------
    def _write_operator_key(self, row):
        with self._tx() as conn:
            out = (
                conn.execute(sa.insert(operator_keys).values(**row, added_at=self._now).returning(*operator_keys.c))
                .mappings()
                .one()
            )
            return OperatorKey(**out)

    def operator_key(self, key_id: str) -> OperatorKey | None:
        check_text("key id", key_id, max_chars=64)
        with self._tx() as conn:
            row = conn.execute(sa.select(operator_keys).where(operator_keys.c.key_id == key_id)).mappings().first()
            return None if row is None else OperatorKey(**row)

    def signing_required(self, account: str) -> bool:
        check_text("account", account)
        p = signing_policies.c
        with self._tx() as conn:
            return bool(conn.execute(sa.select(sa.exists().where(p.account == account, p.required))).scalar_one())

    # -- reads ------------------------------------------------------------------------------------
    def claim(self, target: str) -> Claim | None:
        check_text("target", target, max_chars=1024)
        with self._tx() as conn:
            row = self._claim_row_before(conn, target)
            return None if row is None else _claim(row)

    def approval(self, approval_id: str) -> Approval:
        check_text("approval id", approval_id, max_chars=128)
        with self._tx() as conn:
            row = conn.execute(sa.select(approvals).where(approvals.c.approval_id == approval_id)).mappings().first()
        if row is None:
            raise UnknownIntent("approval", approval_id, "approval_exists", None)
        return _approval(row)

    def approvals(self, key: str) -> list[Approval]:
        check_text("key", key, max_chars=256)
        q = (
            sa.select(approvals)
            .where(approvals.c.key == key)
            .order_by(approvals.c.approved_at, approvals.c.approval_id)
        )
        with self._tx() as conn:
            return [_approval(r) for r in conn.execute(q).mappings()]

    def due_approvals(self, limit: int = 100) -> list[Approval]:
        check_limit(limit)
        a = approvals.c
        q = (
            sa.select(approvals)
            .where(a.state == self.approval_table.initial, a.expires_at <= self._now)
            .order_by(a.expires_at, a.approval_id)  # a total order, the model's
            .limit(limit)
        )
        with self._tx() as conn:
            return [_approval(r) for r in conn.execute(q).mappings()]

    def claim_history(self, target: str) -> list[ClaimEntry]:
        check_text("target", target, max_chars=1024)
        q = sa.select(claim_history).where(claim_history.c.target == target).order_by(claim_history.c.seq)
        with self._tx() as conn:
            return [
                ClaimEntry(
                    r["seq"],
                    r["machine"],
                    r["subject"],
                    r["event"],
                    r["actor"],
                    r["from_state"],
                    r["to_state"],
                    r["epoch"],
                    r["key"],
                    r["detail"] if not isinstance(r["detail"], str) else __import__("json").loads(r["detail"]),
                    r["recorded_at"],
                )
                for r in conn.execute(q).mappings()
            ]


def _approval(row: Mapping[str, Any] | RowMapping) -> Approval:
    return Approval(**{k: row[k] for k in Approval.__dataclass_fields__})


def _claim(row: Mapping[str, Any]) -> Claim:
    return Claim(**{k: row[k] for k in Claim.__dataclass_fields__})
