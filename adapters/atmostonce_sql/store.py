"""SQL store on SQLAlchemy 2 Core: PostgreSQL (psycopg 3, pooled) and SQLite (stdlib).

Every transition is one short transaction around one conditional write:
``UPDATE aom_intents SET ... WHERE key = :key AND state IN (<sources from the
table>) AND <guard fragments from the table> RETURNING *``. Zero rows means
refused: a follow-up ``SELECT`` evaluates each guard fragment to name the one
that refused, and nothing is written. On success the append-only rows
(attempt, attempt outcome, history, reconciliation) are inserted in the same
transaction. Lease deadlines are computed and judged by the database clock.

Errors: :class:`~atmostonce.errors.Rejected` subclasses for refused moves,
:class:`~atmostonce.errors.IntakeError` for bad input,
:class:`~atmostonce.errors.StoreError` (and ``AppendOnlyViolation``) for
driver errors, which are mapped, never leaked.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from atmostonce.audit import (
    HISTORY_FIELDS,
    AuditChain,
    AuditRow,
    field_texts,
    history_hash,
    reconciliation_step,
)
from atmostonce.claims import claim_refusal_recorded
from atmostonce.errors import (
    AppendOnlyViolation,
    GuardRefused,
    IllegalMove,
    Rejected,
    StoreError,
    UnknownIntent,
)
from atmostonce.identity import attempt_token, load_canonical
from atmostonce.records import (
    HISTORY_DETAIL,
    Attempt,
    HistoryEntry,
    Intent,
    Reconciliation,
    Refusal,
    SourceCapture,
    Submission,
    check_limit,
    check_text,
)
from atmostonce.store import Operations
from atmostonce.table import Table
from atmostonce.table import table as default_table

from .claims import SqlClaims
from .guards import PARAMS, SQL_GUARDS, window_full
from .schema import (
    attempt_outcomes,
    attempts,
    contracts,
    credentials,
    history,
    intents,
    kill_switches,
    meta,
    rate_limits,
    reconciliations,
    refusals,
    sequences,
    source_versions,
    sources,
    text_claims,
)

__all__ = ["SqlStore", "register_sqlite_functions"]


def register_sqlite_functions(dbapi_conn: Any) -> None:
    """Give a SQLite connection the audit chain's hash (``aom_chain_hash``), defined in Python once."""
    dbapi_conn.create_function("aom_chain_hash", 11, history_hash, deterministic=True)


_INTENT_FIELDS = tuple(Intent.__dataclass_fields__)


def _store_epoch() -> sa.Label:
    """The database's restore epoch, read in the same statement as the intent row (``Intent.store_epoch``:
    a plan made from the snapshot carries it, so a restore voids every plan made before it)."""
    return sa.select(meta.c.value).where(meta.c.name == "restore_epoch").scalar_subquery().label("store_epoch")


def db_now(dialect: str) -> sa.ColumnElement:
    """The database clock in float seconds since the epoch."""
    if dialect == "postgresql":
        return sa.literal_column("extract(epoch from clock_timestamp())::double precision", sa.Float(53))
    return sa.literal_column("((julianday('now') - 2440587.5) * 86400.0)", sa.Float(53))


class SqlStore(SqlClaims, Operations):
    """A store on an SQLAlchemy engine (``postgresql`` or ``sqlite`` dialect).

    Build one with :func:`atmostonce_sql.open_store`. Thread-safe: each
    operation checks a connection out of the engine's pool.
    """

    def __init__(
        self,
        engine: Engine,
        table: Table | None = None,
        *,
        max_payload_bytes: int | None = None,
        text_window_seconds: float = 86_400.0,
    ):
        self.engine = engine
        self.text_window_seconds = float(text_window_seconds)
        self.dialect = engine.dialect.name
        if self.dialect not in ("postgresql", "sqlite"):
            raise StoreError(f"unsupported dialect {self.dialect!r}")
        self.table = table or default_table()
        if max_payload_bytes is not None:
            self.max_payload_bytes = max_payload_bytes
        self._now = db_now(self.dialect)
        if self.dialect == "sqlite":  # engines made elsewhere than make_engine get the audit function too
            sa.event.listen(engine, "connect", lambda dbapi_conn, _record: register_sqlite_functions(dbapi_conn))
        if self.dialect == "postgresql":  # a pool of connections that stay in autocommit: no toggling per checkout
            size = engine.pool.size() if hasattr(engine.pool, "size") else 5
            self._autocommit = sa.create_engine(
                engine.url, isolation_level="AUTOCOMMIT", pool_size=size, max_overflow=size
            )
        else:
            self._autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")
        self._disabled_guards: frozenset[str] = frozenset()
        self._cache: dict[tuple[str, frozenset[str]], dict[str, Any]] = {}

    def close(self) -> None:
        self.engine.dispose()
        if self._autocommit is not self.engine and isinstance(self._autocommit, Engine):
            self._autocommit.dispose()

    # -- plumbing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def _tx(self, autocommit: bool = False) -> Iterator[Connection]:
        """A transaction (or, with ``autocommit``, a connection for one self-contained statement);
        driver errors are mapped to :class:`StoreError`."""
        try:
            if autocommit:
                with self._autocommit.connect() as conn:
                    yield conn
                return
            with self.engine.begin() as conn:
                yield conn
        except Rejected:
            raise
        except sa.exc.DBAPIError as exc:
            msg = str(exc.orig) if exc.orig is not None else str(exc)
            if "append-only" in msg:
                raise AppendOnlyViolation(msg) from exc
            raise StoreError(f"{type(exc.orig).__name__ if exc.orig else 'database error'}: {msg}") from exc

    def now(self) -> float:
        with self._tx() as conn:
            return float(conn.execute(sa.select(self._now)).scalar_one())

    def _next_generation(self, conn: Connection) -> int:
        """SQLite's stand-in for a SEQUENCE, bumped inside the (write-serialized) transaction."""
        return conn.execute(
            sa.update(sequences)
            .where(sequences.c.name == "generation")
            .values(value=sequences.c.value + 1)
            .returning(sequences.c.value)
        ).scalar_one()

    @staticmethod
    def _intent(row: Mapping[str, Any]) -> Intent:
        d = {k: row[k] for k in _INTENT_FIELDS}
        d["request"] = load_canonical(d["request"])  # canonical JSON text: the exact bytes that were digested
        d["descriptor"] = _json(d["descriptor"])
        return Intent(**d)

    # -- primitives -----------------------------------------------------------------------
    _SUBMITTED = (
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

    def _creation_statements(self) -> dict[str, Any]:
        hit = self._cache.get(("<create>", frozenset()))
        if hit is not None:
            return hit
        if self.dialect == "postgresql":
            from sqlalchemy.dialects.postgresql import insert
        else:
            from sqlalchemy.dialects.sqlite import insert
        c = intents.c
        values: dict[str, Any] = {name: sa.bindparam(f"p_{name}", type_=c[name].type) for name in self._SUBMITTED}
        values |= {
            "state": self.table.initial,
            "attempt_count": 0,
            "reconcile_count": 0,
            "resend_epoch": 0,
            "history_count": 1,
            "created_at": self._now,
            "updated_at": self._now,
        }
        ins = (
            insert(intents)
            .values(**values)
            .on_conflict_do_nothing(index_elements=["key"])
            .returning(*intents.c, _store_epoch())
        )
        creator = next(e for e in self.table.events.values() if e.creates)
        existing = sa.select(intents, _store_epoch()).where(c.key == sa.bindparam("p_key"))
        if self.dialect == "postgresql":  # insert and history in one statement, one round trip
            new = ins.cte("u")
            out = {"one": sa.select(*new.c).add_cte(self._history_insert(creator, new, opens=False).cte("h"))}
        else:
            src = sa.select(intents).where(c.key == sa.bindparam("p_key")).subquery("u")
            out = {"insert": ins, "history": self._history_insert(creator, src, opens=False)}
        out |= {"existing": existing, "creator": creator}
        self._cache[("<create>", frozenset())] = out
        return out

    def _create(self, sub: Submission) -> tuple[Intent, bool]:
        if sub.earlier_keys:  # the same delivery keyed by an older normalizer: found, never duplicated
            with self._tx() as conn:
                row = (
                    conn.execute(sa.select(intents, _store_epoch()).where(intents.c.key.in_(sub.earlier_keys)))
                    .mappings()
                    .first()
                )
            if row is not None:
                return self._intent(row), False
        stmts = self._creation_statements()
        params = {f"p_{name}": getattr(sub, name) for name in self._SUBMITTED if name != "request"}
        params |= {
            "p_request": sub.request_json,
            "p_actor": stmts["creator"].actor,
            "p_detail": {},
            "p_generation": None,
        }
        if self.dialect == "postgresql":
            with self._tx(autocommit=True) as conn:
                row = self._execute_compiled(conn, stmts, "one", params)
                if row is None:
                    return self._intent(conn.execute(stmts["existing"], params).mappings().one()), False
                return self._intent(row), True
        with self._tx() as conn:
            row = conn.execute(stmts["insert"], params).mappings().first()
            if row is None:
                return self._intent(conn.execute(stmts["existing"], params).mappings().one()), False
            conn.execute(stmts["history"], params)
            return self._intent(row), True

    # -- statements: built once per event (and set of disabled guards), executed with parameters --
    def _params(self, ev, key: str, args: Mapping[str, Any], conn: Connection) -> dict[str, Any]:
        params: dict[str, Any] = {name: args.get(name) for name in PARAMS}
        params["fenced"] = args.get("fenced") is True
        params.update(
            key=key,
            lease_seconds=float(args.get("lease_seconds") or 0.0),
            descriptor=dict(args.get("descriptor") or {}),
            remote_id=args.get("remote_id"),
            actor=ev.actor if not args.get("operator") else f"operator:{args['operator']}",
            detail={k: args[k] for k in HISTORY_DETAIL if args.get(k) not in (None, {}, "")},
            text_window=self.text_window_seconds,
        )
        if "open_attempt" in ev.effects:
            params["new_token"] = attempt_token()
            if self.dialect != "postgresql":
                params["new_generation"] = self._next_generation(conn)
        return {f"p_{k}": v for k, v in params.items()}

    def _statements(self, ev, coupled: bool = False) -> dict[str, Any]:
        """Cached statements for ``ev``: the gate (``update``), the appends, the diagnosis, and on
        PostgreSQL all of it as one statement (``one``). An event that couples a claim move has two
        forms: the fast one moves only intents without an approval requirement; ``coupled`` is the
        one run inside the transaction that also moves the claim (see :meth:`_coupled_moves`)."""
        cache_key = (ev.name, self._disabled_guards, coupled)
        hit = self._cache.get(cache_key)
        if hit is not None:
            return hit
        c = intents.c
        where = [c.key == sa.bindparam("p_key"), c.state.in_([sa.literal(s, sa.Text) for s in ev.sources])]
        where += [SQL_GUARDS[g](c, self._now) for g in ev.guards if g not in self._disabled_guards]
        if ev.couples and not coupled:
            where.append(c.requires_approval.is_(sa.false()))
        takes_slot = "take_rate_slot" in ev.effects
        if takes_slot and not coupled:  # an account with a rate limit moves its window row in the same transaction
            where.append(~sa.exists().where(rate_limits.c.account == c.account))
        values: dict[str, Any] = {
            "state": ev.target,
            "prev_state": c.state,
            "prev_attempt_token": c.attempt_token,
            "updated_at": self._now,
            "history_count": c.history_count + 1,
        }
        for eff in ev.effects:
            values.update(self._effect_values(eff))
        update = sa.update(intents).where(*where).values(**values).returning(*intents.c, _store_epoch())
        checked = [g for g in ev.guards if g not in self._disabled_guards]  # what this statement evaluates
        diagnose = sa.select(
            c.state,
            *[sa.case((SQL_GUARDS[g](c, self._now), 1), else_=0).label(f"g_{i}") for i, g in enumerate(checked)],
            c.requires_approval,
            sa.exists().where(rate_limits.c.account == c.account).label("rate_limited_account"),
        ).where(c.key == sa.bindparam("p_key"))
        out: dict[str, Any] = {"update": update, "diagnose": diagnose, "checked": checked}
        if self.dialect == "postgresql" and not coupled:
            upd = update.cte("u")
            appends = [stmt.cte(f"w{i}") for i, stmt in enumerate(self._appends(ev, upd))]
            out["one"] = sa.select(*upd.c).add_cte(*appends)
        else:
            src = sa.select(intents).where(intents.c.key == sa.bindparam("p_key")).subquery("u")
            out["appends"] = self._appends(ev, src)
        self._cache[cache_key] = out
        return out

    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:
        ev = self.table.event(event)
        try:
            return self._apply_statements(ev, key, args)
        except Rejected as exc:
            presented = getattr(exc, "presented", args)
            if exc.event in self.claim_table.events and claim_refusal_recorded(exc, presented):
                self._record_claim_refusal(exc.key, exc, presented)
            raise
        except StoreError as exc:
            # a concurrent claim of the same text won: the exclusion constraint refused this one, or
            # PostgreSQL broke a wait cycle between two conflicting claims (the victim wrote nothing)
            if "aom_text_claims_window" in str(exc) or ("Deadlock" in str(exc) and '"aom_text_claims"' in str(exc)):
                raise GuardRefused(
                    ev.name, key, "text_window_clear", None, "refused by the database exclusion"
                ) from exc
            raise

    def _apply_statements(self, ev, key: str, args: Mapping[str, Any]) -> Intent:
        stmts = self._statements(ev)
        if self.dialect == "postgresql":
            # the conditional UPDATE and every append in one statement (data-modifying CTEs), sent in
            # autocommit mode: one round trip per accepted transition
            with self._tx(autocommit=True) as conn:
                params = self._params(ev, key, args, conn)
                row = self._execute_compiled(conn, stmts, "one", params)
                if row is not None:
                    return self._intent(row)
                refusal = self._diagnose(conn, ev, key, params)
                if refusal is not None:
                    raise refusal
            return self._apply_coupled(ev, key, args)  # an approval-gated intent: with its claim
        with self._tx() as conn:
            params = self._params(ev, key, args, conn)
            row = conn.execute(stmts["update"], params).mappings().first()
            if row is None:
                refusal = self._diagnose(conn, ev, key, params)
                if refusal is not None:
                    raise refusal  # the transaction rolls back
            else:
                for stmt in stmts["appends"]:
                    conn.execute(stmt, params)
                return self._intent(row)
        return self._apply_coupled(ev, key, args)

    def _apply_coupled(self, ev, key: str, args: Mapping[str, Any]) -> Intent:
        """The intent's move and its claim's (and approval's) in one transaction: all or nothing."""
        stmts = self._statements(ev, coupled=True)
        with self._tx() as conn:
            params = self._params(ev, key, args, conn)
            row = conn.execute(stmts["update"], params).mappings().first()
            if row is None:
                raise self._diagnose(conn, ev, key, params, coupled=True) or Rejected(ev.name, key, "lost_race", None)
            self._coupled_moves(conn, ev, row, args)
            if "take_rate_slot" in ev.effects:
                self._take_rate_slot(conn, ev, row)
            for stmt in stmts["appends"]:
                conn.execute(stmt, params)
            return self._intent(row)

    def _take_rate_slot(self, conn: Connection, ev, row: Mapping[str, Any]) -> None:
        """The account's window row, by compare-and-set: a passed window restarts at one, a running one
        counts one more while it has room (``rate_limit_clear``); the row lock serializes concurrent sends."""
        r = rate_limits.c
        if conn.execute(sa.select(r.account).where(r.account == row["account"])).first() is None:
            return
        restart = sa.or_(r.window_start.is_(None), r.window_start + r.window_seconds <= self._now)
        where = [r.account == row["account"]]
        if "rate_limit_clear" not in self._disabled_guards:
            where.append(sa.not_(window_full(r, self._now)))
        moved = conn.execute(
            sa.update(rate_limits)
            .where(*where)
            .values(
                window_start=sa.case((restart, self._now), else_=r.window_start),
                used=sa.case((restart, 1), else_=r.used + 1),
            )
            .returning(r.account)
        ).first()
        if moved is None:
            raise GuardRefused(ev.name, row["key"], "rate_limit_clear", row["prev_state"])

    def _execute_compiled(self, conn: Connection, stmts: dict[str, Any], name: str, params: Mapping[str, Any]):
        """Run a cached statement through the driver directly: compiled once by SQLAlchemy (same SQL,
        same bind processing), then sent by psycopg without SQLAlchemy's per-call execution machinery.
        Returns the first row as a mapping, or ``None``. Driver errors surface as ``DBAPIError``."""
        compiled = stmts.get(f"{name}.compiled")
        if compiled is None:
            c = stmts[name].compile(dialect=self.engine.dialect)
            processors = {k: v for k, v in c._bind_processors.items() if v is not None}
            compiled = (c, c.string, processors)
            stmts[f"{name}.compiled"] = compiled
        c, sql, processors = compiled
        values = c.construct_params(params, _check=False)
        for k, proc in processors.items():
            if k in values and values[k] is not None:
                values[k] = proc(values[k])
        cur = conn.connection.dbapi_connection.cursor()
        try:
            try:
                cur.execute(sql, values, prepare=True)
            except Exception as exc:
                raise sa.exc.DBAPIError.instance(sql, values, exc, type(exc)) from exc
            row = cur.fetchone()
            if row is None:
                return None
            names = stmts.get(f"{name}.columns")
            if names is None:  # the RETURNING list is fixed per statement
                names = stmts[f"{name}.columns"] = [d.name for d in cur.description]
            return dict(zip(names, row, strict=True))
        finally:
            cur.close()

    def _appends(self, ev, src) -> list[sa.Insert | sa.Update]:
        """The append-only rows an accepted move writes, as ``INSERT ... SELECT`` from the moved row ``src``."""
        u = src.c
        out: list[sa.Insert | sa.Update] = []
        opens = "open_attempt" in ev.effects
        if opens:
            out.append(
                sa.insert(attempts).from_select(
                    ["attempt_token", "key", "number", "generation", "request_digest", "opened_at"],
                    sa.select(u.attempt_token, u.key, u.attempt_count, u.generation, u.request_digest, self._now),
                )
            )
        if "close_attempt" in ev.effects or "fence_restore" in ev.effects:
            out.append(
                sa.insert(attempt_outcomes).from_select(
                    ["attempt_token", "outcome", "recorded_at"],
                    sa.select(u.prev_attempt_token, sa.literal(ev.name, sa.Text), self._now).where(
                        u.prev_attempt_token.is_not(None)
                    ),
                )
            )
        if "claim_text_slot" in ev.effects:
            out.append(
                sa.insert(text_claims).from_select(
                    ["key", "account", "text_hash", "start_at", "end_at", "released"],
                    sa.select(
                        u.key,
                        u.account,
                        u.text_hash,
                        self._now,
                        self._now + sa.bindparam("p_text_window", type_=sa.Float(53)),
                        sa.false(),
                    ).where(u.text_hash.is_not(None)),
                )
            )
        if "release_text_slot" in ev.effects:
            out.append(
                sa.update(text_claims)
                .where(text_claims.c.key == sa.select(u.key).scalar_subquery(), sa.not_(text_claims.c.released))
                .values(released=True)
            )
        hist = self._history_insert(ev, src, opens)
        if self.dialect == "postgresql":  # the record of an unknown send joins its history row's seq
            h = hist.cte("h")
            rec = self._reconciliation_insert(ev, src, sa.select(h.c.seq).scalar_subquery())
            if rec is None:
                out.append(hist)
            elif reconciliation_step(self.table, ev.name)[0] == "open":
                out.append(rec)  # it reads the history CTE's seq, which brings that insert in (once)
            else:
                out += [hist, rec]
        else:
            h_ = history.c
            rec = self._reconciliation_insert(
                ev, src, sa.select(sa.func.max(h_.seq)).where(h_.key == src.c.key).scalar_subquery()
            )
            out += [hist] if rec is None else [hist, rec]  # in this order, in one write transaction
        return out

    def _reconciliation_insert(self, ev, src, send_seq) -> sa.Insert | None:
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
                cols, sa.select(u.key, send_seq, *what, u.remote_id, self._now)
            )
        newest = (
            sa.select(rc.send_seq).where(rc.key == u.key, rc.send_seq.is_not(None)).order_by(rc.seq.desc()).limit(1)
        )
        q = sa.select(u.key, newest.scalar_subquery(), *what, sa.bindparam("p_remote_id", type_=sa.Text), self._now)
        if kind == "settle":  # only a send still unknown is settled by a person's resolution
            q = q.where(newest.with_only_columns(rc.result).scalar_subquery() == sa.literal("unknown", sa.Text))
        return sa.insert(reconciliations).from_select(cols, q)

    _HISTORY_COLUMNS = (
        "key",
        "event",
        "actor",
        "from_state",
        "to_state",
        "attempt_token",
        "generation",
        "detail",
        "recorded_at",
    )

    def _history_insert(self, ev, src, opens: bool) -> sa.Insert:
        """The history row of a move. PostgreSQL's trigger (migration 0002) chains it; on SQLite the
        statement assigns the sequence itself and chains the row through ``aom_chain_hash`` (the
        writer lock is held, so the newest row read here is the chain's head)."""
        u = src.c
        if opens or ev.creates:
            token, gen = u.attempt_token, u.generation
        else:
            token = u.prev_attempt_token
            gen = sa.func.coalesce(sa.bindparam("p_generation", type_=sa.BigInteger), u.generation)
        values = (
            u.key,
            sa.literal(ev.name, sa.Text),
            sa.bindparam("p_actor", type_=sa.Text),
            sa.null() if ev.creates else u.prev_state,
            u.state,
            token,
            gen,
            sa.bindparam("p_detail", type_=history.c.detail.type),
            self._now,
        )
        names = list(self._HISTORY_COLUMNS)
        if self.dialect == "postgresql":
            return sa.insert(history).from_select(names, sa.select(*values)).returning(history.c.seq)
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

    def _effect_values(self, eff: str) -> dict[str, Any]:
        c = intents.c
        if eff == "open_attempt":
            generation = (
                sa.func.nextval("aom_generation")
                if self.dialect == "postgresql"
                else sa.bindparam("p_new_generation", type_=sa.BigInteger)
            )
            return {
                "attempt_count": c.attempt_count + 1,
                "attempt_token": sa.bindparam("p_new_token", type_=sa.Text),
                "generation": generation,
                "lease_expires_at": self._now + sa.bindparam("p_lease_seconds", type_=sa.Float(53)),
                "remote_id": None,
                "epoch": sa.select(meta.c.value).where(meta.c.name == "restore_epoch").scalar_subquery(),
            }
        if eff == "extend_lease":
            return {"lease_expires_at": self._now + sa.bindparam("p_lease_seconds", type_=sa.Float(53))}
        if eff == "write_descriptor":
            return {"descriptor": sa.bindparam("p_descriptor", type_=intents.c.descriptor.type)}
        if eff == "set_remote_id":
            return {"remote_id": sa.bindparam("p_remote_id", type_=sa.Text)}
        if eff in ("close_attempt", "fence_restore"):
            return {"attempt_token": None, "lease_expires_at": None}
        if eff in ("claim_text_slot", "release_text_slot"):
            return {}  # rows of aom_text_claims, written beside the move (see _appends)
        if eff == "take_rate_slot":
            return {}  # the account's window row, by compare-and-set in the move's transaction (_take_rate_slot)
        if eff == "count_reconcile":
            return {"reconcile_count": c.reconcile_count + 1}
        if eff == "bump_resend_epoch":
            return {"resend_epoch": c.resend_epoch + 1, "remote_id": None}
        if eff == "grant_attempt":
            return {
                "max_attempts": sa.case((c.max_attempts > c.attempt_count, c.max_attempts), else_=c.attempt_count + 1)
            }
        raise StoreError(f"effect {eff!r} has no SQL implementation")

    def _diagnose(
        self, conn: Connection, ev, key: str, params: Mapping[str, Any], coupled: bool = False
    ) -> Rejected | None:
        """Name what refused a zero-row write; ``None`` when the intent needs its coupled claim move."""
        row = conn.execute(self._statements(ev)["diagnose"], params).first()
        if row is None:
            return UnknownIntent(ev.name, key, "intent_exists", None)
        if row[0] not in ev.sources:
            return IllegalMove(ev.name, key, "source_state", row[0])
        for i, g in enumerate(self._statements(ev)["checked"]):
            if not row[i + 1]:
                return GuardRefused(ev.name, key, g, row[0])
        if not coupled and ((ev.couples and row[-2]) or ("take_rate_slot" in ev.effects and row[-1])):
            return None  # the move needs its transaction: the claim, or the account's rate window
        return Rejected(ev.name, key, "lost_race", row[0], "the row changed between the write and the diagnosis")

    def _record_refusal(self, exc: GuardRefused, presented: Mapping[str, Any]) -> None:
        c = intents.c
        with self._tx() as conn:
            row = conn.execute(sa.select(intents).where(c.key == exc.key)).mappings().first()
            if row is None:
                return
            epoch = conn.execute(sa.select(meta.c.value).where(meta.c.name == "restore_epoch")).scalar_one()
            last = conn.execute(sa.select(sa.func.max(history.c.seq)).where(history.c.key == exc.key)).scalar_one()
            current = {
                "state": row["state"],
                "attempt_token": row["attempt_token"],
                "generation": row["generation"],
                "epoch": epoch,
                "reconcile_count": row["reconcile_count"],
            }
            conn.execute(
                sa.insert(refusals).values(
                    key=exc.key,
                    event=exc.event,
                    guard=exc.guard,
                    presented=dict(presented),
                    current=current,
                    superseded_by_seq=last,
                    recorded_at=self._now,
                )
            )

    def _store_capture(self, source_id: str, version: str, raw_hash: str | None) -> SourceCapture:
        from atmostonce import identity

        with self._tx() as conn:
            head = conn.execute(
                sa.select(sources.c.head_version).where(sources.c.source_id == source_id)
            ).scalar_one_or_none()
            if head == version:
                return SourceCapture(source_id, version, False, None, raw_hash)
            known = conn.execute(
                sa.select(source_versions.c.version).where(source_versions.c.version == version)
            ).scalar_one_or_none()
            if known is None:
                conn.execute(
                    sa.insert(source_versions).values(
                        version=version,
                        source_id=source_id,
                        supersedes=head,
                        raw_hash=raw_hash,
                        normalizer_version=identity.NORMALIZER_VERSION,
                        captured_at=self._now,
                    )
                )
            if head is None:
                conn.execute(sa.insert(sources).values(source_id=source_id, head_version=version, updated_at=self._now))
            else:
                conn.execute(
                    sa.update(sources)
                    .where(sources.c.source_id == source_id, sources.c.head_version == head)
                    .values(head_version=version, updated_at=self._now)
                )
            return SourceCapture(source_id, version, known is None, head, raw_hash)

    def source_head(self, source_id: str) -> str | None:
        with self._tx() as conn:
            return conn.execute(
                sa.select(sources.c.head_version).where(sources.c.source_id == source_id)
            ).scalar_one_or_none()

    def refusals(self, key: str) -> list[Refusal]:
        q = sa.select(refusals).where(refusals.c.key == key).order_by(refusals.c.seq)
        with self._tx() as conn:
            return [
                Refusal(
                    r["seq"],
                    r["key"],
                    r["event"],
                    r["guard"],
                    _json(r["presented"]),
                    _json(r["current"]),
                    r["superseded_by_seq"],
                    r["recorded_at"],
                )
                for r in conn.execute(q).mappings()
            ]

    # -- policy layer and restores --------------------------------------------------------
    _POLICY = {
        "kill_switches": (kill_switches, "scope", "engaged"),
        "credentials": (credentials, "account", "version"),
        "contracts": (contracts, "platform", "version"),
    }

    def _write_policy(self, kind: str, name: str, value: Any) -> None:
        table, key_col, val_col = self._POLICY[kind]
        with self._tx() as conn:
            conn.execute(sa.delete(table).where(table.c[key_col] == name))
            if value is not None and value is not False:
                conn.execute(sa.insert(table).values({key_col: name, val_col: value}))

    def _bump_epoch(self) -> int:
        with self._tx() as conn:
            return int(
                conn.execute(
                    sa.update(meta)
                    .where(meta.c.name == "restore_epoch")
                    .values(value=meta.c.value + 1)
                    .returning(meta.c.value)
                ).scalar_one()
            )

    def current_epoch(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(sa.select(meta.c.value).where(meta.c.name == "restore_epoch")).scalar_one())

    def _write_rate_limit(self, account: str, max_sends: int | None, window_seconds: float) -> None:
        r = rate_limits.c
        with self._tx() as conn:
            if max_sends is None:
                conn.execute(sa.delete(rate_limits).where(r.account == account))
                return
            changed = conn.execute(
                sa.update(rate_limits)
                .where(r.account == account)
                .values(max_sends=max_sends, window_seconds=window_seconds)
                .returning(r.account)
            ).first()
            if changed is None:
                conn.execute(
                    sa.insert(rate_limits).values(
                        account=account, max_sends=max_sends, window_seconds=window_seconds, used=0
                    )
                )

    def rate_limited(self, account: str) -> bool:
        r = rate_limits.c
        q = sa.select(sa.exists().where(r.account == account, window_full(r, self._now)))
        with self._tx() as conn:
            return bool(conn.execute(q).scalar_one())

    def kill_switch_engaged(self, account: str) -> bool:
        k = kill_switches.c
        q = sa.select(sa.exists().where(k.engaged, sa.or_(k.scope == "global", k.scope == f"account:{account}")))
        with self._tx() as conn:
            return bool(conn.execute(q).scalar_one())

    # -- reads ----------------------------------------------------------------------------
    def find(self, key: str) -> Intent | None:
        check_text("key", key, max_chars=256)
        with self._tx() as conn:
            row = conn.execute(sa.select(intents, _store_epoch()).where(intents.c.key == key)).mappings().first()
            return None if row is None else self._intent(row)

    def get(self, key: str) -> Intent:
        it = self.find(key)
        if it is None:
            raise UnknownIntent("get", key, "intent_exists", None)
        return it

    def list_intents(self, state: str | None = None, limit: int = 1000) -> list[Intent]:
        check_limit(limit)
        q = sa.select(intents, _store_epoch()).order_by(intents.c.created_at, intents.c.key).limit(limit)
        if state is not None:
            q = q.where(intents.c.state == state)
        with self._tx() as conn:
            return [self._intent(r) for r in conn.execute(q).mappings()]

    def count_by_state(self) -> dict[str, int]:
        out = dict.fromkeys(self.table.states, 0)
        with self._tx() as conn:
            for state, n in conn.execute(sa.select(intents.c.state, sa.func.count()).group_by(intents.c.state)):
                out[state] = n
        return out

    def history(self, key: str) -> list[HistoryEntry]:
        q = sa.select(history).where(history.c.key == key).order_by(history.c.seq)
        with self._tx() as conn:
            return [
                HistoryEntry(
                    r["seq"],
                    r["key"],
                    r["event"],
                    r["actor"],
                    r["from_state"],
                    r["to_state"],
                    r["attempt_token"],
                    r["generation"],
                    _json(r["detail"]),
                    r["recorded_at"],
                )
                for r in conn.execute(q).mappings()
            ]

    def audit_keys(self) -> list[str]:
        """Every intent's key, oldest first (what ``audit verify`` walks)."""
        with self._tx() as conn:
            return list(conn.execute(sa.select(intents.c.key).order_by(intents.c.created_at, intents.c.key)).scalars())

    def audit_chain(self, key: str) -> AuditChain:
        """The intent's history rows as the chain hashed them: ``detail`` as this dialect's own JSON text
        (``jsonb::text`` on PostgreSQL, the stored text on SQLite), times as the stored doubles."""
        h = history.c
        detail = sa.cast(h.detail, sa.Text) if self.dialect == "postgresql" else sa.type_coerce(h.detail, sa.Text)
        cols = [h[f] for f in HISTORY_FIELDS if f != "detail"]
        # one statement, so the intent's count and its rows come from one snapshot on a live database
        q = (
            sa.select(intents.c.history_count, *cols, detail.label("detail"), h.prev_hash, h.row_hash)
            .select_from(intents.outerjoin(history, h.key == intents.c.key))
            .where(intents.c.key == key)
            .order_by(h.seq)
        )
        with self._tx() as conn:
            rows = conn.execute(q).mappings().all()
        return AuditChain(
            key,
            tuple(
                AuditRow(r["seq"], field_texts(*(r[f] for f in HISTORY_FIELDS)), r["prev_hash"], r["row_hash"])
                for r in rows
                if r["seq"] is not None
            ),
            rows[0]["history_count"] if rows else None,
        )

    def attempts(self, key: str) -> list[Attempt]:
        with self._tx() as conn:
            rows = (
                conn.execute(sa.select(attempts).where(attempts.c.key == key).order_by(attempts.c.number))
                .mappings()
                .all()
            )
            outs: dict[str, list[str]] = {}
            q = (
                sa.select(attempt_outcomes.c.attempt_token, attempt_outcomes.c.outcome)
                .join(attempts, attempts.c.attempt_token == attempt_outcomes.c.attempt_token)
                .where(attempts.c.key == key)
                .order_by(attempt_outcomes.c.seq)
            )
            for tok, outcome in conn.execute(q):
                outs.setdefault(tok, []).append(outcome)
        return [
            Attempt(
                r["attempt_token"],
                r["key"],
                r["number"],
                r["generation"],
                r["opened_at"],
                tuple(outs.get(r["attempt_token"], ())),
            )
            for r in rows
        ]

    def reconciliations(self, key: str) -> list[Reconciliation]:
        q = sa.select(reconciliations).where(reconciliations.c.key == key).order_by(reconciliations.c.seq)
        with self._tx() as conn:
            return [
                Reconciliation(
                    r["seq"], r["key"], r["result"], r["remote_id"], r["recorded_at"], r["send_seq"], r["event"]
                )
                for r in conn.execute(q).mappings()
            ]

    def due_leases(self, limit: int = 100) -> list[Intent]:
        """Intents whose lease expired by the database clock (uses the partial index ``aom_intents_lease_due``)."""
        q = (
            sa.select(intents, _store_epoch())
            .where(intents.c.lease_expires_at.is_not(None), intents.c.lease_expires_at <= self._now)
            .order_by(intents.c.lease_expires_at)
            .limit(limit)
        )
        with self._tx() as conn:
            return [self._intent(r) for r in conn.execute(q).mappings()]

    def claimable(self, limit: int = 100) -> list[str]:
        """Keys of intents in the initial state with no open attempt whose source (if any) is still the
        head: the freshness fence runs before any expensive work (candidates for ``begin``)."""
        head = sa.select(sources.c.head_version).where(sources.c.source_id == intents.c.source_id).scalar_subquery()
        q = (
            sa.select(intents.c.key)
            .where(
                intents.c.state == self.table.initial,
                intents.c.attempt_token.is_(None),
                sa.or_(intents.c.source_version.is_(None), intents.c.source_version == head),
            )
            .order_by(intents.c.created_at)
            .limit(limit)
        )
        with self._tx() as conn:
            return list(conn.execute(q).scalars())

    def total_attempts(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one())


def _json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v
