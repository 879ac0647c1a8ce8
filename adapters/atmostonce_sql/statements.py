"""Statement building: the transition table to SQLAlchemy Core statements, per dialect. Pure: no engine,
no connection, no driver (``atmostonce_sql.execution`` runs what this builds; docs/sql.md shows it).

A move of event ``ev`` is one conditional write: ``UPDATE aom_intents SET <the effects' columns> WHERE
key = :p_key AND state IN (<the event's sources>) AND <the guards' fragments> RETURNING *``, and the rows
it appends (the effects' rows, its history row, its reconciliation record) as ``INSERT ... SELECT`` from the
moved row. On PostgreSQL all of it is one statement (data-modifying CTEs); on SQLite the appends follow the
``UPDATE`` in its transaction. ``diagnose`` evaluates each guard after a zero-row write to name the one
that refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.sql import visitors

from atmostonce.audit import HISTORY_FIELDS, reconciliation_step
from atmostonce.names import EFFECT
from atmostonce.table import Table

from .effects import SQL_EFFECTS, claims_text, text_claim_lock
from .guards import PARAMS, SQL_GUARDS, GuardRefs
from .schema import history, intents, meta, rate_limits, reconciliations, sequences

__all__ = ["SUBMITTED", "Statements", "db_now", "render", "store_epoch"]

SUBMITTED = (
    "key",
    "account",
    "action_kind",
    "target",
    "request",
    "request_digest",
    "max_attempts",
    "max_reconciles",
    "normalizer_version",
    "text_hash",
    "source_id",
    "source_version",
    "requires_approval",
)
"""The columns a submission fills (``:p_<column>`` in the creating statement)."""

HISTORY_COLUMNS = tuple(f for f in HISTORY_FIELDS if f != "seq")  # the store assigns seq


def db_now(dialect: str) -> sa.ColumnElement[Any]:
    """The database clock in float seconds since the epoch."""
    if dialect == "postgresql":
        return sa.literal_column("extract(epoch from clock_timestamp())::double precision", sa.Float(53))
    return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float(53))


def store_epoch() -> sa.Label[Any]:
    """The database's restore epoch, read in the same statement as the intent row (``Intent.store_epoch``:
    a plan made from the snapshot carries it, so a restore voids every plan made before it)."""
    return sa.select(meta.c.value).where(meta.c.name == "restore_epoch").scalar_subquery().label("store_epoch")


BATCH_COLUMNS: dict[str, Any] = {**PARAMS, "remote_id": sa.Text()}
"""What a batched move reads per row from its batch: every guard parameter, and the object id a reconciler's
found lookup sets (each row its own)."""


class Statements:
    """The statements of ``table``'s events on ``dialect`` (``postgresql`` or ``sqlite``); ``now`` is the
    clock expression the statements judge leases and stamp rows by (default: the database clock)."""

    def __init__(
        self, table: Table, dialect: str, now: sa.ColumnElement[Any] | None = None, approval_table: Any = None
    ):
        if approval_table is None:
            from atmostonce.table import machine

            approval_table = machine("approval")
        self.approval_table = approval_table
        self.table = table
        self.dialect = dialect
        self.now = db_now(dialect) if now is None else now

    # -- creation -------------------------------------------------------------------------
    def creation(self) -> dict[str, Any]:
        """The creating event: ``one`` (PostgreSQL: insert and history row in one statement) or ``insert`` and
        ``history`` (SQLite);
        ``existing``, the stored intent when the key was taken; ``creator``."""
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:  # the same on_conflict_do_nothing API as PostgreSQL's
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        c = intents.c
        ins = (
            insert(intents)
            .values(**self._created_values())
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(*intents.c, store_epoch())
        )
        creator = next(e for e in self.table.events.values() if e.creates)
        existing = sa.select(intents, store_epoch()).where(c.key == sa.bindparam("p_key"))
        if self.dialect == "postgresql":  # insert and history in one statement, one round trip
            new = ins.cte("u")
            history = self.history_insert(creator, new, opens=False).cte("h")
            out: dict[str, Any] = {"one": sa.select(*new.c).add_cte(history)}
        else:
            src = sa.select(intents).where(c.key == sa.bindparam("p_key")).subquery("u")
            out = {"insert": ins, "history": self.history_insert(creator, src, opens=False)}
        return out | {"existing": existing, "creator": creator}

    def _created_values(self) -> dict[str, Any]:
        """The columns the creating event sets: each submitted one from ``:p_<column>``, the initial state, the
        counters at zero (one history row), both times from the clock; the rest are the columns' defaults."""
        c = intents.c
        values: dict[str, Any] = {name: sa.bindparam(f"p_{name}", type_=c[name].type) for name in SUBMITTED}
        return values | {
            "state": self.table.initial,
            "attempt_count": 0,
            "reconcile_count": 0,
            "resend_epoch": 0,
            "fence_epoch": 0,
            "history_count": 1,
            "created_at": self.now,
            "updated_at": self.now,
        }

    def find(self) -> sa.Select[Any]:
        """The intent by ``:p_key``, with the store's restore epoch."""
        return sa.select(intents, store_epoch()).where(intents.c.key == sa.bindparam("p_key"))

    def next_generation(self) -> sa.Update:
        """SQLite's stand-in for a SEQUENCE, bumped inside the (write-serialized) transaction."""
        return (
            sa.update(sequences)
            .where(sequences.c.name == "generation")
            .values(value=sequences.c.value + 1)
            .returning(sequences.c.value)
        )

    # -- moves ----------------------------------------------------------------------------
    def _gate(
        self, ev: Any, key: Any, off: frozenset[str], coupled: bool, per_row: Any = None
    ) -> tuple[list[Any], dict[str, Any]]:
        """The conditional write of ``ev`` on the row whose key is ``key``: its WHERE (source states, the guard
        fragments not in ``off``, and, in the fast form, no approval requirement and each effect's fast-path
        condition) and its SET (the effects' values). ``per_row`` rewrites each fragment and value (a batch
        reads what a move presents from its row of the batch)."""
        c = intents.c
        x = GuardRefs(c.key, None, self.table, self.approval_table)  # an intent move: the row's own key

        def own(expr: Any) -> Any:
            return expr if per_row is None else per_row(expr)

        where = [c.key == key, c.state.in_([sa.literal(s, sa.Text) for s in ev.sources])]
        where += [own(SQL_GUARDS[g](c, self.now, x)) for g in ev.guards if g not in off]
        if ev.couples and not coupled:
            where.append(c.requires_approval.is_(sa.false()))
        if not coupled:
            where += [w for w in (SQL_EFFECTS[e].fast_path(c) for e in ev.effects) if w is not None]
        values: dict[str, Any] = {
            "state": ev.target,
            "prev_state": c.state,
            "prev_attempt_token": c.attempt_token,
            "updated_at": self.now,
            "history_count": c.history_count + 1,
        }
        for eff in ev.effects:
            values.update({k: own(v) for k, v in SQL_EFFECTS[eff].values(c, self.now, self.dialect).items()})
        return where, values

    def move(self, ev: Any, disabled: Iterable[str] = (), coupled: bool = False) -> dict[str, Any]:
        """The statements of ``ev`` with the guards in ``disabled`` left out: the gate (``update``), the
        appends, the diagnosis (``diagnose``, and ``checked``, the guards it evaluates in order), and on
        PostgreSQL all of it as one statement (``one``) and the same failing when no row moved
        (``strict``, for pipelined moves). An event that couples a claim move has two forms: the fast
        one moves only intents without an approval requirement (and, for an effect with a window row,
        only accounts without one); ``coupled`` is the one run inside the transaction that also moves
        the claim and the window."""
        off = frozenset(disabled)
        c = intents.c
        where, values = self._gate(ev, sa.bindparam("p_key"), off, coupled)
        x = GuardRefs(c.key, None, self.table, self.approval_table)  # the diagnosis reads the same fragments
        update = sa.update(intents).where(*where).values(**values).returning(*intents.c, store_epoch())
        checked = [g for g in ev.guards if g not in off]  # what this statement evaluates
        diagnose = sa.select(
            c.state,
            *[sa.case((SQL_GUARDS[g](c, self.now, x), 1), else_=0).label(f"g_{i}") for i, g in enumerate(checked)],
            c.requires_approval,
            sa.exists().where(rate_limits.c.account == c.account).label("rate_limited_account"),
        ).where(c.key == sa.bindparam("p_key"))
        out: dict[str, Any] = {"update": update, "diagnose": diagnose, "checked": checked}
        if self.dialect == "postgresql" and not coupled:
            upd = update.cte("u")
            appends = [stmt.cte(f"w{i}") for i, stmt in enumerate(self.appends(ev, upd))]
            out["one"] = sa.select(*upd.c).add_cte(*appends)
            # the same, failing (SQLSTATE AOM01, migration 0010) when no row moved: for moves pipelined in one
            # transaction, where the statements queued after a refused move and the COMMIT must not apply
            moved = sa.func.aom_moved(sa.select(sa.func.count()).select_from(upd).scalar_subquery(), ev.name)
            check = sa.select(moved.label("aom_moved")).subquery("chk")
            out["strict"] = sa.select(*upd.c).select_from(check.outerjoin(upd, sa.true())).add_cte(*appends)
        else:
            src = sa.select(intents).where(intents.c.key == sa.bindparam("p_key")).subquery("u")
            out["appends"] = self.appends(ev, src)
        return out

    def batch(self, columns: Sequence[str]) -> Any:
        """The batch a batched move reads (``b``): one row per intent from the JSON array ``:p_batch``, each
        object an intent's ``key`` and what its move presents (``columns``, names of
        :data:`~atmostonce_sql.guards.PARAMS`). PostgreSQL: ``jsonb_to_recordset``; SQLite: ``json_each``."""
        types: dict[str, Any] = {"key": sa.Text(), **{n: BATCH_COLUMNS[n] for n in columns}}
        names = ("key", *columns)
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import JSONB

            fn = sa.func.jsonb_to_recordset(sa.bindparam("p_batch", type_=JSONB))
            return fn.table_valued(*[sa.column(n, types[n]) for n in names]).render_derived(name="b", with_types=True)
        each = sa.func.json_each(sa.bindparam("p_batch", type_=sa.JSON)).table_valued("value").alias("j")
        return sa.select(
            *[sa.func.json_extract(each.c.value, sa.literal(f"$.{n}"), type_=types[n]).label(n) for n in names]
        ).subquery("b")

    def batch_move(self, ev: Any, columns: Sequence[str], disabled: Iterable[str] = ()) -> dict[str, Any]:
        """``ev`` for a batch of intents in one conditional write (docs/design.md#the-sweeper-moves-a-batch-per-statement):
        ``update``, the fast form of :meth:`move`'s gate joined to the batch :meth:`batch` by key, ``UPDATE
        aom_intents SET <the same columns> FROM <the batch> AS b WHERE key = b.key AND state IN (<the event's
        sources>) AND <the same guard fragments, each value a move presents read from its row of the batch,
        b.<name>, instead of :p_<name>> RETURNING *``. A row of the batch the statement does not return was
        refused, or needs its coupled form: :meth:`move`'s ``diagnose`` names which, per row. ``appends``: the
        rows each moved row writes, :meth:`move`'s appends from the moved row ``:p_key``, none returning a row,
        so each is sent once for every moved row (``executemany``)."""
        off = frozenset(disabled)
        b = self.batch(columns)
        swap = {"p_key": b.c.key, **{f"p_{n}": b.c[n] for n in columns}}

        def replace(element: Any, **kw: Any) -> Any:
            return swap.get(element.key) if isinstance(element, sa.BindParameter) else None

        def per_row(expr: Any) -> Any:
            """``expr`` with each presented value's parameter replaced by the batch row's column."""
            if not isinstance(expr, sa.ColumnElement):
                return expr  # a constant (an effect's NULL)
            return visitors.replacement_traverse(expr, {}, replace)

        where, values = self._gate(ev, b.c.key, off, False, per_row)
        update = sa.update(intents).where(*where).values(**values).returning(*intents.c, store_epoch())
        src = sa.select(intents).where(intents.c.key == sa.bindparam("p_key")).subquery("u")
        return {"update": update, "appends": self.appends(ev, src, returning=False), "columns": tuple(columns)}

    def fused(
        self,
        first: Any,
        second: Any,
        lease_from_first: bool,
        lossable: bool,
        disabled: Iterable[str] = (),
        creating: bool = False,
    ) -> dict[str, Any]:
        """PostgreSQL: the moves ``first`` then ``second`` of one intent as one statement, one round trip and one
        commit in autocommit (docs/design.md#two-durable-points-per-send). Each keeps its own gate: ``s`` is the
        row as ``first`` leaves it (``first``'s WHERE on the stored row, its SET as the row's new columns), locked
        ``FOR UPDATE NOWAIT``: the statement never waits for another transaction's lock on the row, so every
        guard that reads another table (a kill switch, a credential, a source) reads a snapshot taken no
        earlier than the statement began; a locked row fails the statement with SQLSTATE 55P03 and the store
        runs the moves one by one in a transaction, whose later statements take fresh snapshots. The
        ``UPDATE`` writes ``second``'s SET over that row where ``second``'s WHERE holds on it (every column the fragments and values read is ``s``'s, every value ``second`` presents is named
        ``:p2_<name>``); each move appends its own rows and history row (``first``'s from ``s``, only when the
        ``UPDATE`` moved; ``second``'s after ``first``'s, so the history sequence and chain keep the moves'
        order). ``lease_from_first``: ``second`` is held to the lease ``first`` opened, read from ``s`` as
        :func:`atmostonce.store.lease_of` reads it from the begun row. ``lossable``: the commit does not wait for
        the disk (``set_config('synchronous_commit', 'off', true)``, the statement's own transaction).

        ``one`` returns two rows, ``step`` 0 (the row after ``first``) and 1 (after ``second``), or none when
        either gate refused, or when a move claims the intent's text and another transaction holds the
        account's text lock (:func:`~atmostonce_sql.effects.text_claim_lock`): nothing was written, and running
        the moves one by one names the refusing guard (or waits for the lock first).
        Both moves in their fast form only (an approval-gated intent, an account with a rate window: no row).

        ``creating``: the intent is new, and the statement creates it too, still one statement: ``v`` is the row
        the creating event would insert (:meth:`creation`'s values, each caller value named ``:p0_<name>``), both
        gates are read on it, and the row as ``second`` leaves it is inserted (``INSERT ... ON CONFLICT (key) DO
        NOTHING``) with the three history rows in order (the creation's, ``first``'s, ``second``'s), as the
        creating statement and the two moves write them one after the other. ``one`` then returns three rows,
        ``step`` -1 (the row as created) first, or none when the key is taken or either gate refused: nothing
        was written, and the store creates the intent and moves it the usual way, which names the refusal."""
        assert self.dialect == "postgresql", "SQLite runs the moves one by one in one write transaction"
        for ev in (first, second):
            assert reconciliation_step(self.table, ev.name) is None or ev is second, ev.name
        off = frozenset(disabled)
        c = intents.c
        where1, values1 = self._gate(first, sa.bindparam("p_key"), off, False)
        if claims_text(first) or claims_text(second):
            # the account's text lock, never waited for: held by another claimant, the statement moves nothing
            # and the store runs the moves in a transaction that waits for it before their guards are read
            where1.append(sa.or_(c.text_hash.is_(None), text_claim_lock(c.account, c.text_hash, wait=False)))

        def as_column(name: str, col: Any, values: Mapping[str, Any]) -> Any:
            v = values.get(name, col)
            if not isinstance(v, sa.ColumnElement):
                v = sa.cast(sa.null(), col.type) if v is None else sa.literal(v, col.type)
            return v.label(name)

        s: Any
        v: Any
        if creating:
            # the row the creating event would insert, its caller values renamed :p0_<name>; first's gate and SET
            # read it where they would read the stored row
            created = _renamed(self._created_values(), "p0_")
            created = {name: created.get(name) for name in c.keys()}  # a column it does not set: NULL, its default
            v = sa.select(*[as_column(n, col, created) for n, col in c.items()]).cte("v")
            on_v: dict[Any, Any] = {col: v.c[name] for name, col in c.items()}

            def on_row(element: Any, **kw: Any) -> Any:
                return on_v.get(element)

            def reads_v(expr: Any) -> Any:
                return visitors.replacement_traverse(expr, {}, on_row)

            where1 = [reads_v(w) for w in where1]
            values1 = {k: reads_v(x) if isinstance(x, sa.ClauseElement) else x for k, x in values1.items()}
            first_row = {name: values1.get(name, v.c[name]) for name in c.keys()}
            # never wait inside the statement, as the moves' NOWAIT row lock never does: the guards were read in
            # its snapshot, and a wait (an uncommitted insert of the same key, a claim on the same text) could
            # end in a commit made on reads older than a kill switch set meanwhile. Any wait fails the statement
            # (SQLSTATE 55P03) and the store creates and moves the intent the usual way
            nowait = sa.select(sa.func.set_config("lock_timeout", "1", True).label("lt")).cte("nowait")
            where1.append(sa.select(nowait.c.lt).scalar_subquery().is_not(None))
            s = sa.select(*[as_column(n, col, first_row) for n, col in c.items()], store_epoch()).where(*where1)
            s = s.cte("s")
        else:
            s = (
                sa.select(*[as_column(name, col, values1) for name, col in c.items()], store_epoch())
                .where(*where1)
                .with_for_update(of=intents, nowait=True)
                .cte("s")
            )
        lease: dict[str, Any] = {
            "p_attempt_token": s.c.attempt_token,
            "p_generation": s.c.generation,
            "p_epoch": sa.func.coalesce(s.c.epoch, 0),
        }
        # second's appends read the moved row (m2 below); the lease it presented is s's, as one-row subqueries
        lease_in_appends = {k: sa.select(v).scalar_subquery() for k, v in lease.items()}

        def second_reads_s(element: Any, lease: Mapping[str, Any]) -> Any:
            if isinstance(element, sa.Column) and element.table is intents:
                return s.c[element.name]
            if isinstance(element, sa.BindParameter) and element.key.startswith("p_"):
                if lease_from_first and element.key in lease:
                    return lease[element.key]
                return sa.bindparam(f"p2_{element.key[2:]}", type_=element.type, required=element.required)
            return None

        def adapt(expr: Any, stop: Sequence[Any] = ()) -> Any:
            if not isinstance(expr, sa.ClauseElement):
                return expr
            presented = lease_in_appends if stop else lease
            return visitors.replacement_traverse(
                expr, {"stop_on": list(stop)}, lambda element, **kw: second_reads_s(element, presented)
            )

        where2, values2 = self._gate(second, c.key, off, False)  # where2[0], the key, is the join to s
        ctes: list[Any] = []  # first's effects' rows, then its history row, as a single move writes them
        steps: list[Any] = []
        h0: Any = None
        if creating:
            from sqlalchemy.dialects.postgresql import insert

            row = {name: s.c[name] for name in c.keys()} | {k: adapt(x) for k, x in values2.items()}
            u = (
                insert(intents)
                .from_select(
                    list(c.keys()),
                    sa.select(*[as_column(n, col, row) for n, col in c.items()]).where(*map(adapt, where2[1:])),
                )
                .on_conflict_do_nothing(index_elements=["key"])
                .returning(*intents.c, store_epoch())
                .cte("u")
            )
            creator = next(e for e in self.table.events.values() if e.creates)
            m0 = sa.select(*v.c, store_epoch()).where(sa.select(u.c.key).exists()).cte("m0")  # the row as created
            # a new intent's chain starts here: no row before it (the key's rows need its intent row)
            h0 = self.history_insert(creator, m0, opens=False, after=sa.cast(sa.null(), sa.Text))
            h0 = _renamed(h0, "p0_", stop=[m0]).cte("h0")
            ctes.append(h0)
            m1 = sa.select(*s.c).where(sa.select(h0.c.seq).exists()).cte("m1")  # first's row, after the creation's
            steps.append(sa.select(sa.literal(-1).label("step"), *m0.c))
        else:
            values = {name: s.c[name] for name in values1} | {k: adapt(x) for k, x in values2.items()}
            u = (
                sa.update(intents)
                .where(c.key == s.c.key, *[adapt(w) for w in where2[1:]])
                .values(**values)
                .returning(*intents.c, store_epoch())
                .cte("u")
            )
            m1 = sa.select(*s.c).where(sa.select(u.c.key).exists()).cte("m1")  # first's row, once the UPDATE moved
        for eff in first.effects:
            write = SQL_EFFECTS[eff].appends
            if write is not None:
                ctes += [stmt.cte(f"a{len(ctes)}") for stmt in write(first.name, m1.c, self.now)]
        # first's row follows the creation's, written just before by this statement; on a stored intent the
        # trigger reads the chain's head, after this statement's row lock (migration 0002)
        after_h0 = None if h0 is None else sa.select(h0.c.row_hash).scalar_subquery()
        h1 = self.history_insert(first, m1, EFFECT.open_attempt in first.effects, after=after_h0).cte("h1")
        ctes.append(h1)
        # second's rows read the moved row once first's history row is in: its seq and chain come after
        m2 = sa.select(*u.c).where(sa.select(h1.c.seq).exists()).cte("m2")
        # second's history row follows first's, which this statement wrote under the same row lock
        after_h1 = sa.select(h1.c.row_hash).scalar_subquery()
        for i, stmt in enumerate(self.appends(second, m2, prefix="b", after=after_h1)):
            ctes.append(adapt(stmt, stop=[m2, h1]).cte(f"b{i}"))
        steps += [sa.select(sa.literal(0).label("step"), *m1.c), sa.select(sa.literal(1).label("step"), *u.c)]
        if lossable:
            cfg = sa.select(sa.func.set_config("synchronous_commit", "off", True).label("sc")).cte("cfg")
            steps[-1] = steps[-1].where(sa.select(cfg.c.sc).scalar_subquery().is_not(None))
        one = sa.union_all(*steps).add_cte(*ctes)
        return {"one": sa.select(*one.subquery("r").c).order_by(sa.literal_column("step"))}

    def appends(
        self, ev: Any, src: Any, returning: bool = True, prefix: str = "", after: Any = None
    ) -> list[sa.Insert | sa.Update]:
        """The rows an accepted move writes, as ``INSERT ... SELECT`` from the moved row ``src``: each
        effect's (``atmostonce_sql.effects``), in the table's order, then the history row and the
        reconciliation record. ``returning=False``: no statement of the list returns a row (PostgreSQL's
        history row returns its ``seq`` otherwise), so each may be sent once for many rows (``executemany``).
        ``prefix`` names the history row's CTE (``<prefix>h``) where two moves share one statement; ``after``
        is its predecessor's hash where the statement knows it (:meth:`history_insert`)."""
        out: list[sa.Insert | sa.Update] = []
        for eff in ev.effects:
            write = SQL_EFFECTS[eff].appends
            if write is not None:
                out += write(ev.name, src.c, self.now)
        opens = EFFECT.open_attempt in ev.effects
        hist = self.history_insert(ev, src, opens, after=after)
        if self.dialect == "postgresql":  # the record of an unknown send joins its history row's seq
            h = hist.cte(f"{prefix}h")
            rec = self.reconciliation_insert(ev, src, sa.select(h.c.seq).scalar_subquery())
            top = hist if returning else self.history_insert(ev, src, opens, returning=False, after=after)
            if rec is None:
                out.append(top)
            elif reconciliation_step(self.table, ev.name)[0] == "open":  # type: ignore[index]  # rec: a step
                out.append(rec)  # it reads the history CTE's seq, which brings that insert in (once)
            else:
                out += [top, rec]
        else:
            h_ = history.c
            rec = self.reconciliation_insert(
                ev, src, sa.select(sa.func.max(h_.seq)).where(h_.key == src.c.key).scalar_subquery()
            )
            out += [hist] if rec is None else [hist, rec]  # in this order, in one write transaction
        return out

    def reconciliation_insert(self, ev: Any, src: Any, send_seq: Any) -> sa.Insert | None:
        """The reconciliation record of a move (``atmostonce.audit.reconciliation_step``), or ``None``.

        A lookup or resolution joins the intent's newest record. That record was committed before
        this statement's snapshot: the state the move requires (``indeterminate``, ``parked``) was
        set by the move that wrote it or a later one, and any move that changed the state since would
        make this one's conditional write refuse after its lock wait."""
        step = reconciliation_step(self.table, ev.name)
        if step is None:
            return None
        kind, result = step
        u, rc = src.c, reconciliations.c
        cols = ["key", "send_seq", "event", "result", "remote_id", "recorded_at"]
        what = (sa.literal(ev.name, sa.Text), sa.literal(result, sa.Text))
        if kind == "open":
            return sa.insert(reconciliations).from_select(
                cols,
                sa.select(u.key, send_seq, *what, u.remote_id, u.updated_at),  # the move's clock reading
            )
        newest = (
            sa.select(rc.send_seq).where(rc.key == u.key, rc.send_seq.is_not(None)).order_by(rc.seq.desc()).limit(1)
        )
        q = sa.select(u.key, newest.scalar_subquery(), *what, sa.bindparam("p_remote_id", type_=sa.Text), u.updated_at)
        if kind == "settle":  # only a send still unknown is settled by a person's resolution
            q = q.where(newest.with_only_columns(rc.result).scalar_subquery() == sa.literal("unknown", sa.Text))
        return sa.insert(reconciliations).from_select(cols, q)

    def history_insert(self, ev: Any, src: Any, opens: bool, returning: bool = True, after: Any = None) -> sa.Insert:
        """The history row of a move. PostgreSQL's trigger (migration 0002) chains it (and the statement
        returns its ``seq`` and ``row_hash``, unless ``returning=False``); on SQLite the statement assigns the
        sequence itself and chains the row through ``aom_chain_hash`` (the writer lock is held, so the newest
        row read here is the chain's head).

        ``after`` (PostgreSQL): the row's predecessor, known to the statement: the ``row_hash`` of the history
        row it wrote just before, under the same row lock, or SQL ``NULL`` when the statement creates the
        intent. It is given as ``prev_hash`` with ``row_hash`` ``''``, and the trigger computes the hash without
        reading the chain (migration 0016)."""
        u = src.c
        if opens or ev.creates:
            token, gen = u.attempt_token, u.generation
        else:
            token = u.prev_attempt_token
            gen = sa.func.coalesce(sa.bindparam("p_generation", type_=sa.BigInteger), u.generation)
        values: tuple[Any, ...] = (
            u.key,
            sa.literal(ev.name, sa.Text),
            sa.bindparam("p_actor", type_=sa.Text),
            sa.null() if ev.creates else u.prev_state,
            u.state,
            token,
            gen,
            sa.bindparam("p_detail", type_=history.c.detail.type),
            u.updated_at,  # the move's own clock reading, taken once by its conditional write
        )
        names = list(HISTORY_COLUMNS)
        if self.dialect == "postgresql":
            if after is not None:
                names += ["prev_hash", "row_hash"]
                values += (after, sa.literal("", sa.Text))
            ins = sa.insert(history).from_select(names, sa.select(*values))
            return ins.returning(history.c.seq, history.c.row_hash) if returning else ins
        h = history.c
        next_seq = sa.literal_column(
            "max(coalesce((SELECT seq FROM sqlite_sequence WHERE name = 'aom_history'), 0), "
            "coalesce((SELECT max(seq) FROM aom_history), 0)) + 1",
            sa.Integer,
        )
        prev = sa.select(h.row_hash).where(h.key == u.key).order_by(h.seq.desc()).limit(1).scalar_subquery()
        v = sa.select(
            next_seq.label("seq"), *[x.label(n) for n, x in zip(names, values, strict=True)], prev.label("prev_hash")
        ).subquery("v")
        row_hash = sa.func.aom_chain_hash(v.c.prev_hash, *[v.c[f] for f in HISTORY_FIELDS], type_=sa.Text)
        return sa.insert(history).from_select(
            ["seq", *names, "prev_hash", "row_hash"],
            sa.select(v.c.seq, *[v.c[n] for n in names], v.c.prev_hash, row_hash),
        )


def _renamed(element: Any, prefix: str, stop: Sequence[Any] = ()) -> Any:
    """``element`` (a statement, an expression, or a mapping of them) with each caller parameter ``:p_<name>``
    renamed ``:<prefix><name>``: the creating event's, where one statement also carries the moves' own. What
    it reads through ``stop`` (a CTE of the statement) is left as it is."""
    if isinstance(element, Mapping):
        return {k: _renamed(v, prefix, stop) for k, v in element.items()}
    if not isinstance(element, sa.ClauseElement):
        return element
    target: Any = element

    def rename(e: Any, **kw: Any) -> Any:
        if isinstance(e, sa.BindParameter) and e.key.startswith("p_"):
            return sa.bindparam(f"{prefix}{e.key[2:]}", type_=e.type, required=e.required)
        return None

    replace: Any = rename
    return visitors.replacement_traverse(target, {"stop_on": list(stop)}, replace)


# -- reading the statements (docs/sql.md, docs/guards.md) --------------------------------------------------
def _dialect(name: str) -> Any:
    """The dialect the store compiles with, with named placeholders (``:p_key``) for a reader."""
    if name == "postgresql":
        from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg

        return PGDialect_psycopg(paramstyle="named")
    from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

    return SQLiteDialect_pysqlite(paramstyle="named")


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


_KEYWORDS = ("WITH", "SET", "WHERE", "RETURNING", "SELECT", "FROM", "VALUES")
_WIDTH = 100


def _layout(sql: str) -> str:
    """Readable lines: each clause (``SET``, ``WHERE``, ``FROM``, ``RETURNING``, ``SELECT``) on its own line
    and indented by parenthesis depth, one ``SET`` item, ``WHERE`` condition and ``WITH`` query per line,
    ``SELECT`` and ``RETURNING`` lists filled to a width. The text is otherwise SQLAlchemy's, unchanged."""
    out: list[str] = []
    depth, quoted, i = 0, False, 0
    clause: dict[int, str] = {}
    flat = " ".join(line.strip() for line in sql.splitlines())

    def column() -> int:
        text = "".join(out)
        return len(text) - (text.rfind("\n") + 1)

    while i < len(flat):
        ch = flat[i]
        if ch == "'":
            quoted = not quoted
        elif not quoted:
            if ch == "(":
                depth += 1
            elif ch == ")":
                clause.pop(depth, None)
                depth -= 1
            else:
                word = next(
                    (k for k in _KEYWORDS if flat.startswith(k + " ", i) and (i == 0 or flat[i - 1] in " (")), None
                )
                if word == "FROM" and flat.endswith("DISTINCT ", 0, i):
                    word = None  # IS DISTINCT FROM
                if word is not None:
                    if word != "WITH" and out and out[-1] == " ":
                        out[-1] = "\n" + "  " * depth
                    clause[depth] = word
                elif ch == "," and flat.startswith(", ", i):
                    kind = clause.get(depth)
                    if kind in ("SET", "WITH") or (kind in ("SELECT", "RETURNING") and column() > _WIDTH):
                        out.append(",\n" + "  " * (depth + 1))
                        i += 2
                        continue
                elif clause.get(depth) == "WHERE" and flat.startswith(" AND ", i):
                    out.append("\n" + "  " * (depth + 1) + "AND ")
                    i += 5
                    continue
        out.append(ch)
        i += 1
    return "".join(out).strip()


def render(stmt: Any, dialect: str) -> str:
    """``stmt`` as SQL text of ``dialect`` (``postgresql`` or ``sqlite``), as the store compiles it: the
    table's constants (states, event names, settings) written as literals, what a caller presents as its
    named parameter (``:p_<name>``; ``:p2_<name>`` for the second move of :meth:`Statements.fused`). The store sends the same text with the driver's placeholders
    (PostgreSQL: ``$1``, ``$2``, ... in order of first appearance)."""
    c = stmt.compile(dialect=_dialect(dialect), compile_kwargs={"render_postcompile": True})
    constants = {k: v for k, v in c.params.items() if not k.startswith(("p_", "p0_", "p2_"))}

    def sub(m: Any) -> str:
        name = m.group(1)
        if name not in constants:
            return str(m.group(0))
        return "NULL" if constants[name] is None else _literal(constants[name])

    return _layout(re.sub(r"(?<![:\w]):(\w+)", sub, c.string))
