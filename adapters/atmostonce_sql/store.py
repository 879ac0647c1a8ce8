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
import re
from collections.abc import Iterator, Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine, RowMapping

from atmostonce.audit import (
    HISTORY_FIELDS,
    INTENT_BOUND_FIELDS,
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
    NoSynchronousStandby,
    Rejected,
    StoreError,
    UnknownIntent,
)
from atmostonce.identity import attempt_token, load_canonical
from atmostonce.records import (
    HISTORY_DETAIL,
    Attempt,
    Evidence,
    HistoryEntry,
    Intent,
    PolicyChange,
    Reconciliation,
    Refusal,
    SourceCapture,
    Submission,
    check_limit,
    check_text,
)
from atmostonce.store import Operations, policy_log_row, step_args, superseding_move
from atmostonce.table import Table
from atmostonce.table import table as default_table

from .claims import SqlClaims
from .guards import PARAMS, SQL_GUARDS, GuardRefs, text_window_expr, window_full
from .schema import (
    TEXT_WINDOW_SETTING,
    attempt_outcomes,
    attempts,
    contracts,
    credentials,
    failovers,
    history,
    intents,
    kill_switches,
    late_outcomes,
    meta,
    policy_changes,
    rate_limits,
    reconciliations,
    refusals,
    sequences,
    settings,
    signing_policies,
    source_versions,
    sources,
    text_claims,
)
from .sequences import resync_sequences

__all__ = ["HA_MODES", "SqlStore", "register_sqlite_functions"]

HA_MODES = ("sync", "async")
"""The HA modes a PostgreSQL store may be opened in (docs/design.md, "Failover and synchronous replication"):
``sync``: the cluster replicates synchronously (Patroni ``synchronous_mode``), every authorizing write raises its
own durability to ``synchronous_commit = on`` and is refused (``NoSynchronousStandby``) while no synchronous standby
streams; a failover (a new timeline) is recorded. ``async``: replication may lose acknowledged commits, so the first
connection to a new timeline declares it as a restore (``restore_fence``), fencing every lease and plan before it."""

# the server's current timeline: the first 8 hex digits of the WAL file name at the current write position
# (pg_control_checkpoint() shows the timeline only from the first checkpoint after a promotion on)
_TIMELINE_SQL = "SELECT ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int"
_SYNC_STANDBY_SQL = (
    "SELECT current_setting('synchronous_standby_names'), "
    "(SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming' AND sync_state IN ('sync', 'quorum'))"
)
_CHECKED = "atmostonce_timeline_checked"


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
        async_outcomes: bool = True,
        ha: str | None = None,
    ):
        self.engine = engine
        self.core = self  # the store is its own StoreCore: Operations composes every operation over it
        self.async_outcomes = bool(async_outcomes)
        """PostgreSQL: the table's outcome moves (``Table.outcome_events``) commit with
        ``synchronous_commit = off``; the authorization before the bytes always waits for the disk."""
        if ha is not None and (ha not in HA_MODES or engine.dialect.name != "postgresql"):
            raise ValueError(f"HA mode {ha!r}: use one of {', '.join(HA_MODES)}, on PostgreSQL only")
        self.ha = ha
        self.default_text_window_seconds = float(text_window_seconds)
        """The duplicate-text window while none is stored (``set_text_window``); the guard reads
        ``COALESCE(stored, this)`` in its conditional write."""
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
        self._cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._outcome_events = frozenset(self.table.outcome_events)
        # the before-byte writes: the events that record the recovery descriptor with the authorization
        self._authorizing = frozenset(e.name for e in self.table.events.values() if "write_descriptor" in e.effects)
        # in sync mode a dispatch is not begun while the authorization would be refused: a begun attempt that
        # cannot be authorized is abandoned by the sweeper and spends one of the intent's attempts
        self._opening = frozenset(e.name for e in self.table.events.values() if "open_attempt" in e.effects)

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
                    if self.ha is not None:
                        self._check_timeline(conn)
                    yield conn
                return
            with self.engine.connect() as conn:
                if self.ha is not None:
                    self._check_timeline(conn)
                with conn.begin():
                    yield conn
        except Rejected:
            raise
        except sa.exc.DBAPIError as exc:
            msg = str(exc.orig) if exc.orig is not None else str(exc)
            if self.dialect == "postgresql" and self._lost_connection(exc):
                # the server went away (a failover, a restart): every pooled connection is to the old server, so
                # all are dropped and the next operation connects afresh (libpq finds the primary again). The
                # move this was is an unknown outcome to the caller: it re-reads, and never repeats a send.
                self.engine.dispose()
                if self._autocommit is not self.engine and isinstance(self._autocommit, Engine):
                    self._autocommit.dispose()
            if "append-only" in msg:
                raise AppendOnlyViolation(msg) from exc
            raise StoreError(f"{type(exc.orig).__name__ if exc.orig else 'database error'}: {msg}") from exc

    # -- high availability (docs/design.md, "Failover and synchronous replication") ------------------------
    def _check_timeline(self, conn: Connection) -> None:
        """Once per new database connection, before its first use: is the server on a timeline this database has
        not seen (a promotion happened)? Then record the failover and, in ``async`` mode, fence it like a declared
        restore, in one transaction that the stored timeline row serializes (one connection fences, the others
        wait for it and find the timeline recorded)."""
        info = conn.connection.info
        if info.get(_CHECKED):
            return
        if conn is not None and self._autocommit is not self.engine and conn.engine is self._autocommit:
            with self.engine.connect() as other:  # an autocommit connection: the check runs in a transaction
                self._fence_new_timeline(other)
        else:
            self._fence_new_timeline(conn)
        info[_CHECKED] = True

    def _fence_new_timeline(self, conn: Connection) -> None:
        f = failovers.c
        with conn.begin():
            timeline = int(conn.exec_driver_sql(_TIMELINE_SQL).scalar_one())
            seen = conn.execute(sa.select(sa.func.max(f.timeline))).scalar_one()
            if seen is None or timeline > seen:
                # one connection at a time records (and fences) a new timeline: the others wait here for its
                # commit and then find the timeline recorded
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(hashtext('aom_failovers'))")
                seen = conn.execute(sa.select(sa.func.max(f.timeline))).scalar_one()
            if seen is not None and timeline <= seen:
                conn.connection.info[_CHECKED] = True
                return
            kind = "first_seen" if seen is None else "failover"
            epoch = fenced = None
            if kind == "failover" and self.ha == "async":
                # the promotion may have lost acknowledged writes: a restore nobody declared
                epoch, fenced = self._declare_restore_in(conn, "failover", f"failover to timeline {timeline}")
            conn.execute(
                sa.insert(failovers).values(
                    timeline=timeline,
                    kind=kind,
                    mode=self.ha,
                    restore_epoch=epoch,
                    fenced=fenced,
                    recorded_at=self._now,
                )
            )
        conn.connection.info[_CHECKED] = True

    def failovers(self) -> list[dict[str, Any]]:
        """The server timelines this database's HA-mode stores found, oldest first: ``timeline``, ``kind``
        (``first_seen``, then ``failover``), ``mode`` (of the store that found it), ``recorded_at`` (database
        time), and for an ``async`` fence the restore epoch it advanced to and how many intents it fenced."""
        f = failovers.c
        with self._tx() as conn:
            rows = conn.execute(
                sa.select(f.timeline, f.kind, f.mode, f.restore_epoch, f.fenced, f.recorded_at).order_by(f.seq)
            ).mappings()
            return [dict(r) for r in rows]

    def _durable_authorization(self, conn: Connection, ev, key: str) -> None:
        """In ``sync`` mode, inside the authorizing transaction (and the one that begins an attempt): its commit
        waits for the synchronous standby (``SET LOCAL synchronous_commit = on``, whatever the cluster's default),
        and it is refused while the primary has no synchronous standby streaming, since the commit would then be
        acknowledged by it alone."""
        conn.exec_driver_sql("SET LOCAL synchronous_commit = on")
        names, streaming = conn.exec_driver_sql(_SYNC_STANDBY_SQL).one()
        if not str(names or "").strip() or not streaming:
            raise NoSynchronousStandby(ev.name, key, str(names or ""), int(streaming or 0))

    def _lost_connection(self, exc: sa.exc.DBAPIError) -> bool:
        if exc.connection_invalidated:
            return True
        try:
            return bool(exc.orig is not None and self.engine.dialect.is_disconnect(exc.orig, None, None))  # type: ignore[arg-type]  # a DBAPI error
        except Exception:  # noqa: BLE001 - a dialect that cannot tell: keep the pool
            return False

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
    def _intent(row: Mapping[str, Any] | RowMapping) -> Intent:
        d = {k: row[k] for k in _INTENT_FIELDS}
        d["request"] = load_canonical(d["request"])  # canonical JSON text: the exact bytes that were digested
        d["descriptor"] = _json(d["descriptor"])
        d["requires_approval"] = bool(d["requires_approval"])  # SQLite's 0/1 when read without SQLAlchemy
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
        else:  # the same on_conflict_do_nothing API as PostgreSQL's
            from sqlalchemy.dialects.sqlite import insert  # type: ignore[assignment]
        c = intents.c
        values: dict[str, Any] = {name: sa.bindparam(f"p_{name}", type_=c[name].type) for name in self._SUBMITTED}
        values |= {
            "state": self.table.initial,
            "attempt_count": 0,
            "reconcile_count": 0,
            "resend_epoch": 0,
            "fence_epoch": 0,
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
            out: dict[str, Any] = {
                "one": sa.select(*new.c).add_cte(self._history_insert(creator, new, opens=False).cte("h"))
            }
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
    def _params(self, ev, key: str, args: Mapping[str, Any], conn: Connection | None) -> dict[str, Any]:
        """The move's statement parameters (``conn``: the open transaction, where SQLite draws the
        generation; ``None`` on PostgreSQL, whose statement draws it from its sequence)."""
        params: dict[str, Any] = {name: args.get(name) for name in PARAMS}
        params["fenced"] = args.get("fenced") is True
        params.update(
            key=key,
            lease_seconds=float(args.get("lease_seconds") or 0.0),
            descriptor=dict(args.get("descriptor") or {}),
            remote_id=args.get("remote_id"),
            actor=ev.actor if not args.get("operator") else f"operator:{args['operator']}",
            detail={k: args[k] for k in HISTORY_DETAIL if args.get(k) not in (None, {}, "")},
            text_window=self.default_text_window_seconds,
        )
        if "open_attempt" in ev.effects:
            params["new_token"] = attempt_token()
            if self.dialect != "postgresql":
                assert conn is not None, "SQLite draws the generation inside the move's transaction"
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
        x = GuardRefs(c.key, None, self.table, self.approval_table)  # an intent move: the row's own key
        where = [c.key == sa.bindparam("p_key"), c.state.in_([sa.literal(s, sa.Text) for s in ev.sources])]
        where += [SQL_GUARDS[g](c, self._now, x) for g in ev.guards if g not in self._disabled_guards]
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
            *[sa.case((SQL_GUARDS[g](c, self._now, x), 1), else_=0).label(f"g_{i}") for i, g in enumerate(checked)],
            c.requires_approval,
            sa.exists().where(rate_limits.c.account == c.account).label("rate_limited_account"),
        ).where(c.key == sa.bindparam("p_key"))
        out: dict[str, Any] = {"update": update, "diagnose": diagnose, "checked": checked}
        if self.dialect == "postgresql" and not coupled:
            upd = update.cte("u")
            appends = [stmt.cte(f"w{i}") for i, stmt in enumerate(self._appends(ev, upd))]
            out["one"] = sa.select(*upd.c).add_cte(*appends)
            # the same, failing (SQLSTATE AOM01, migration 0010) when no row moved: for moves pipelined in one
            # transaction, where the statements queued after a refused move and the COMMIT must not apply
            moved = sa.func.aom_moved(sa.select(sa.func.count()).select_from(upd).scalar_subquery(), ev.name)
            check = sa.select(moved.label("aom_moved")).subquery("chk")
            out["strict"] = sa.select(*upd.c).select_from(check.outerjoin(upd, sa.true())).add_cte(*appends)
        else:
            src = sa.select(intents).where(intents.c.key == sa.bindparam("p_key")).subquery("u")
            out["appends"] = self._appends(ev, src)
        self._cache[cache_key] = out
        return out

    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:
        ev = self.table.event(event)
        return self._refusing(ev, key, args, lambda: self._apply_statements(ev, key, args))

    def _apply_sequence(self, key: str, steps: list[tuple[str, Any]]) -> list[Intent]:
        """Several moves in one transaction (one commit): each its own conditional write, as
        :meth:`_apply` runs it; a refusal rolls back the moves before it and is raised. On PostgreSQL
        the moves are pipelined first (:meth:`_pipelined`); an intent whose move needs its coupled form
        (an account rate window, a claim) then takes the transaction below."""
        events = [event for event, _ in steps]
        durable = self.ha == "sync" and any(e in self._authorizing | self._opening for e in events)
        if self.dialect == "postgresql" and not durable:
            done = self._pipelined(key, steps)
            if done is not None:
                return done
        current: list[tuple[Any, Mapping[str, Any]]] = []

        def run() -> list[Intent]:
            out: list[Intent] = []
            with self._tx() as conn:
                self._commit_mode(conn, events)
                if durable:  # HA sync mode: the commit waits for the synchronous standby, or nothing moves
                    self._durable_authorization(conn, self.table.event(events[0]), key)
                for event, step in steps:
                    ev = self.table.event(event)
                    args = step_args(step, out[-1] if out else None)
                    current.append((ev, args))
                    out.append(self._apply_in(conn, ev, key, args))
            return out

        try:
            return run()
        except (Rejected, StoreError) as exc:
            if not current:
                raise
            ev, args = current[-1]
            err = exc
            return self._refusing(ev, key, args, lambda: self._reraise(err))

    def _lossable(self, events: list[str]) -> bool:
        """Whether a transaction of these moves may commit without waiting for the disk: on PostgreSQL,
        when every one is an outcome move (``Table.outcome_events``: its loss leaves the send in flight
        under a lease, and the lease's expiry makes it unknown) and ``async_outcomes`` is on. A later
        synchronous commit (the next authorization) makes every earlier one durable: the WAL is one
        sequence (docs/design.md#two-durable-points-per-send)."""
        return self.dialect == "postgresql" and self.async_outcomes and all(e in self._outcome_events for e in events)

    def _commit_mode(self, conn: Connection, events: list[str]) -> None:
        if self._lossable(events):
            conn.exec_driver_sql("SET LOCAL synchronous_commit = off")

    @staticmethod
    def _reraise(exc: BaseException) -> Any:
        raise exc

    REFUSED_SQLSTATE = "AOM01"
    """What ``aom_moved`` raises when a pipelined move moved no row (migration 0010)."""

    def _pipelined(self, key: str, steps: list[tuple[str, Any]]) -> list[Intent] | None:
        """PostgreSQL: BEGIN, each move's statement and COMMIT sent through psycopg's pipeline, on an
        autocommit connection. One round trip for moves whose arguments are known up front; a step
        whose arguments are computed from the previous move's row (a callable) waits for that row,
        one more round trip. Each move's statement fails when it moved no row, which aborts the
        transaction, so the COMMIT applies every move or none. Returns the moved rows; raises the
        refusal of the first move, diagnosed afterwards like a single move's; ``None`` (nothing was
        written) when a move needs its coupled form, or when a later move refused: the transaction
        path then runs the moves again and diagnoses the refusal where the earlier moves are visible."""
        import psycopg

        with self._tx(autocommit=True) as sconn:  # driver errors become StoreError there
            raw: Any = sconn.connection.dbapi_connection
            queued: list[tuple[Any, dict[str, Any], Any]] = []
            rows: list[Intent] = []
            try:
                with raw.pipeline():
                    raw.execute("BEGIN")
                    if self._lossable([event for event, _ in steps]):
                        raw.execute("SET LOCAL synchronous_commit = off")
                    for event, args in steps:
                        ev = self.table.event(event)
                        if callable(args):
                            rows += [self._fetch_moved(cur, stmts) for _, _, (cur, stmts) in queued[len(rows) :]]
                            args = args(rows[-1] if rows else None)
                        params = self._params(ev, key, args, None)
                        queued.append((ev, params, self._send_compiled(raw, self._statements(ev), "strict", params)))
                    raw.execute("COMMIT")
                rows += [self._fetch_moved(cur, stmts) for _, _, (cur, stmts) in queued[len(rows) :]]
                return rows
            except psycopg.Error as exc:
                with contextlib.suppress(psycopg.Error):
                    raw.execute("ROLLBACK")
                refused = getattr(exc, "sqlstate", None) == self.REFUSED_SQLSTATE
                refused_move = exc.diag.message_detail if refused else None
                at = next((i for i, (ev, _, _) in enumerate(queued) if ev.name == refused_move), None)
                if at is None:
                    if raw.broken or raw.closed:  # the connection is gone: the pool must not hand it out again
                        sconn.invalidate()
                    raise sa.exc.DBAPIError.instance("pipelined moves", None, exc, type(exc)) from exc
                if at > 0:
                    # a later move refused: what refused it can only be read inside the transaction the
                    # earlier moves were in, so the transaction path runs them again and names it
                    return None
                ev, params, _ = queued[0]
        with self._tx(autocommit=True) as conn:
            refusal = self._diagnose(conn, ev, key, params)
        if refusal is None:
            return None
        raise refusal

    def _send_compiled(self, raw: Any, stmts: dict[str, Any], name: str, params: Mapping[str, Any]) -> Any:
        """Queue a cached statement on the psycopg connection ``raw``; returns ``(cursor, stmts)``."""
        return self._raw_execute(raw, stmts, name, params), stmts

    def _fetch_moved(self, cur: Any, stmts: dict[str, Any]) -> Intent:
        row = cur.fetchone()
        names = stmts.get("strict.columns")
        if names is None:
            names = stmts["strict.columns"] = [d.name for d in cur.description]
        cur.close()
        return self._intent(dict(zip(names, row, strict=True)))

    def _apply_in(self, conn: Connection, ev, key: str, args: Mapping[str, Any]) -> Intent:
        """One move inside the open transaction ``conn``: the conditional write and its appends (on
        PostgreSQL one statement), or, for an intent whose move needs its claim or rate window, the
        coupled form; raises the diagnosed refusal when no row moved."""
        stmts = self._statements(ev)
        params = self._params(ev, key, args, conn)
        if self.dialect == "postgresql":
            row = self._execute_compiled(conn, stmts, "one", params)
        else:
            row = self._sqlite_run(conn, stmts, "update", params)
            if row is not None:
                for i in range(len(stmts["appends"])):
                    self._sqlite_run(conn, stmts, ("appends", i), params, fetch=False)
        if row is not None:
            return self._intent(row)
        refusal = self._diagnose(conn, ev, key, params)
        if refusal is not None:
            raise refusal
        return self._coupled_in(conn, ev, key, args, params)

    def _coupled_in(self, conn: Connection, ev, key: str, args: Mapping[str, Any], params: dict[str, Any]) -> Intent:
        """The coupled form of a move inside ``conn``'s transaction: the intent's row, then its claim's
        (and approval's) moves and its account's rate window, then the appends."""
        stmts = self._statements(ev, coupled=True)
        row = conn.execute(stmts["update"], params).mappings().first()
        if row is None:
            raise self._diagnose(conn, ev, key, params, coupled=True) or Rejected(ev.name, key, "lost_race", None)
        self._coupled_moves(conn, ev, row, args)
        if "take_rate_slot" in ev.effects:
            self._take_rate_slot(conn, ev, row)
        for stmt in stmts["appends"]:
            conn.execute(stmt, params)
        return self._intent(row)

    def _sqlite_run(
        self, conn: Connection, stmts: dict[str, Any], name: Any, params: Mapping[str, Any], fetch: bool = True
    ) -> dict[str, Any] | None:
        """SQLite: run a cached statement (``name``, or ``("appends", i)``) on the sqlite3 connection
        under ``conn``'s transaction, compiled once by SQLAlchemy (same SQL, same bind processing),
        without SQLAlchemy's per-call execution machinery. Returns the first row as a mapping (values as
        SQLite holds them; :meth:`_intent` reads them), or ``None``. Driver errors surface as ``DBAPIError``."""
        compiled = stmts.get(f"sqlite:{name!r}")
        if compiled is None:
            stmt = stmts[name] if isinstance(name, str) else stmts[name[0]][name[1]]
            c = stmt.compile(dialect=self.engine.dialect)
            processors = {k: v for k, v in c._bind_processors.items() if v is not None}
            compiled = stmts[f"sqlite:{name!r}"] = (c, c.string, tuple(c.positiontup or ()), processors)
        c, sql, order, processors = compiled
        values = c.construct_params(params, _check=False)
        for k, proc in processors.items():
            if k in values and values[k] is not None:
                values[k] = proc(values[k])
        try:
            raw: Any = conn.connection.dbapi_connection
            cur = raw.execute(sql, [values[k] for k in order])
        except Exception as exc:
            raise sa.exc.DBAPIError.instance(sql, values, exc, type(exc)) from exc
        try:
            if not fetch:
                return None
            row = cur.fetchone()
            return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))
        finally:
            cur.close()

    def _refusing(self, ev, key: str, args: Mapping[str, Any], run: Any) -> Any:
        """Run ``run()``; map what the database refused to the table's refusals (and record a claim's)."""
        try:
            return run()
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
        if self.ha == "sync" and ev.name in self._authorizing | self._opening:
            # the same one statement, in a transaction whose commit waits for the synchronous standby
            with self._tx() as conn:
                self._durable_authorization(conn, ev, key)
                params = self._params(ev, key, args, conn)
                row = self._execute_compiled(conn, stmts, "one", params)
                if row is not None:
                    return self._intent(row)
                refusal = self._diagnose(conn, ev, key, params)
                if refusal is not None:
                    raise refusal
            return self._apply_coupled(ev, key, args)
        if self.dialect == "postgresql" and self._lossable([ev.name]):
            # an outcome move: BEGIN, SET LOCAL synchronous_commit, the move, COMMIT in one round trip
            moved = self._pipelined(key, [(ev.name, args)])
            return moved[0] if moved is not None else self._apply_coupled(ev, key, args)
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
        with self._tx() as conn:  # a refusal rolls the transaction back
            return self._apply_in(conn, ev, key, args)

    def _apply_coupled(self, ev, key: str, args: Mapping[str, Any]) -> Intent:
        """The intent's move and its claim's (and approval's) in one transaction: all or nothing."""
        with self._tx() as conn:
            self._commit_mode(conn, [ev.name])
            if self.ha == "sync" and ev.name in self._authorizing | self._opening:
                self._durable_authorization(conn, ev, key)
            return self._coupled_in(conn, ev, key, args, self._params(ev, key, args, conn))

    def _take_rate_slot(self, conn: Connection, ev, row: Mapping[str, Any] | RowMapping) -> None:
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

    def _compiled(self, stmts: dict[str, Any], name: str) -> tuple[Any, str, dict[str, Any]]:
        """A cached statement compiled once: the compiled object, its SQL and its bind processors."""
        compiled = stmts.get(f"{name}.compiled")
        if compiled is None:
            c = stmts[name].compile(dialect=self.engine.dialect)
            processors = {k: v for k, v in c._bind_processors.items() if v is not None}
            compiled = stmts[f"{name}.compiled"] = (c, c.string, processors)
        return compiled

    def _native(self, stmts: dict[str, Any], name: str) -> tuple[str, tuple[str, ...]]:
        """The compiled statement in PostgreSQL's own ``$n`` placeholders, with the parameter names in
        order: psycopg's ``RawCursor`` sends it as it is, without parsing the query on every call (its
        parse cache skips statements over 4 kB, and the authorizing statement is longer)."""
        native = stmts.get(f"{name}.native")
        if native is None:
            _, sql, _ = self._compiled(stmts, name)
            order: dict[str, int] = {}

            def number(m: re.Match[str]) -> str:
                return f"${order.setdefault(m.group(1), len(order) + 1)}"

            text = re.sub(r"%\(([^)]+)\)s", number, sql).replace("%%", "%")
            native = stmts[f"{name}.native"] = (text, tuple(order))
        return native

    def _raw_execute(self, raw: Any, stmts: dict[str, Any], name: str, params: Mapping[str, Any]) -> Any:
        """Send a cached statement on the psycopg connection ``raw``; returns the open cursor."""
        import psycopg

        c, _, processors = self._compiled(stmts, name)
        sql, order = self._native(stmts, name)
        values = c.construct_params(params, _check=False)
        for k, proc in processors.items():
            if k in values and values[k] is not None:
                values[k] = proc(values[k])
        cur = psycopg.RawCursor(raw)
        cur.execute(sql, [values[k] for k in order], prepare=True)
        return cur

    def _execute_compiled(self, conn: Connection, stmts: dict[str, Any], name: str, params: Mapping[str, Any]):
        """Run a cached statement through the driver directly: compiled once by SQLAlchemy (same SQL,
        same bind processing), then sent by psycopg without SQLAlchemy's per-call execution machinery.
        Returns the first row as a mapping, or ``None``. Driver errors surface as ``DBAPIError``."""
        raw: Any = conn.connection.dbapi_connection
        try:
            cur = self._raw_execute(raw, stmts, name, params)
        except Exception as exc:
            if raw.broken or raw.closed:  # sent past SQLAlchemy: tell its pool the connection is gone
                conn.invalidate()
            raise sa.exc.DBAPIError.instance(self._compiled(stmts, name)[1], dict(params), exc, type(exc)) from exc
        try:
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
                    [
                        "attempt_token",
                        "key",
                        "number",
                        "generation",
                        "request_digest",
                        "opened_at",
                        "resend_epoch",
                        "fence_epoch",
                    ],
                    sa.select(
                        u.attempt_token,
                        u.key,
                        u.attempt_count,
                        u.generation,
                        u.request_digest,
                        self._now,
                        u.resend_epoch,
                        u.fence_epoch,
                    ),
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
                        self._now + text_window_expr(),
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
            elif reconciliation_step(self.table, ev.name)[0] == "open":  # type: ignore[index]  # rec: a step
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
        if eff == "bump_fence_epoch":
            return {"fence_epoch": c.fence_epoch + 1}
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
            h = history.c
            moves = conn.execute(
                sa.select(h.seq, h.event, h.attempt_token, h.generation).where(h.key == exc.key).order_by(h.seq)
            ).all()
            last = superseding_move(self.table, [tuple(m) for m in moves], presented)
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

    _EVIDENCE_ARGS = (
        "epoch",
        "outcome",
        "refused_event",
        "refused_by",
        "remote_id",
        "response_digest",
        "reason",
        "worker_time",
    )

    def _record_evidence(self, args: Mapping[str, Any]) -> Evidence:
        """One ``INSERT ... SELECT`` from the attempt the lease names: zero rows means no such attempt."""
        a = attempts.c
        types: dict[str, sa.types.TypeEngine[Any]] = {"epoch": sa.BigInteger(), "worker_time": sa.Float(53)}
        src = sa.select(
            a.key,
            a.attempt_token,
            a.generation,
            *[sa.bindparam(f"e_{n}", args[n], type_=types.get(n, sa.Text())) for n in self._EVIDENCE_ARGS],
            self._now,
        ).where(a.key == args["key"], a.attempt_token == args["attempt_token"], a.generation == args["generation"])
        cols = ["key", "attempt_token", "generation", *self._EVIDENCE_ARGS, "recorded_at"]
        with self._tx() as conn:
            row = (
                conn.execute(sa.insert(late_outcomes).from_select(cols, src).returning(*late_outcomes.c))
                .mappings()
                .first()
            )
        if row is None:
            raise UnknownIntent("record_late_outcome", args["key"], "attempt_exists", None)
        return _evidence(row)

    def evidence(self, key: str) -> list[Evidence]:
        check_text("key", key, max_chars=256)
        q = sa.select(late_outcomes).where(late_outcomes.c.key == key).order_by(late_outcomes.c.seq)
        with self._tx() as conn:
            return [_evidence(r) for r in conn.execute(q).mappings()]

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
        """The intent's (or, for ``claim:<target>``, the claim's) recorded refusals in sequence order. A claim
        refusal's ``seq`` is on the claim log's sequence (``claim_seq``, migration 0007), shared with the
        claim's moves."""
        r_ = refusals.c
        order = sa.func.coalesce(r_.claim_seq, r_.seq)
        q = sa.select(refusals, order.label("log_seq")).where(r_.key == key).order_by(order, r_.seq)
        with self._tx() as conn:
            return [
                Refusal(
                    r["log_seq"],
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
        "signing_policies": (signing_policies, "account", "required"),
    }

    def _write_policy(self, kind: str, name: str, value: Any, operator: str | None) -> None:
        if kind == "text_window_seconds":
            table, key_col, val_col, key = settings, "name", "value", TEXT_WINDOW_SETTING
        else:
            table, key_col, val_col = self._POLICY[kind]
            key = name
        with self._tx() as conn:
            conn.execute(sa.delete(table).where(table.c[key_col] == key))
            if value is not None and value is not False:
                conn.execute(sa.insert(table).values({key_col: key, val_col: value}))
            self._log_policy(conn, kind, name, value, operator)

    def _log_policy(self, conn: Connection, kind: str, name: str, value: Any, operator: str | None) -> None:
        """The policy log's row, in the caller's transaction, on the database clock."""
        log_kind, log_value = policy_log_row(kind, value)
        conn.execute(
            sa.insert(policy_changes).from_select(
                ["kind", "name", "value", "operator", "recorded_at"],
                sa.select(
                    sa.literal(log_kind, sa.Text),
                    sa.literal(name, sa.Text),
                    sa.literal(log_value, policy_changes.c.value.type),
                    sa.literal(operator, sa.Text),
                    self._now,
                ),
            )
        )

    def policy_changes(self, limit: int = 100) -> list[PolicyChange]:
        """The newest ``limit`` rows of the policy log, newest first."""
        n = check_limit(limit)
        q = sa.select(policy_changes).order_by(policy_changes.c.seq.desc()).limit(n)
        with self._tx() as conn:
            return [
                PolicyChange(int(r.seq), r.kind, r.name, r.value, r.operator, float(r.recorded_at))
                for r in conn.execute(q)
            ]

    @property
    def text_window_seconds(self) -> float:
        """The duplicate-text window the ``text_window_clear`` guard reads: the stored one, else the default."""
        with self._tx() as conn:
            return float(
                conn.execute(
                    sa.select(text_window_expr()), {"p_text_window": self.default_text_window_seconds}
                ).scalar_one()
            )

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

    def _declare_restore(self, who: str) -> tuple[int, int]:
        """The restore protocol in one transaction (docs/design.md, "Declaring a restore is atomic"):
        every sequence moved past the stored data, the restore epoch advanced, and every intent in a
        source state of ``restore_fence`` moved by it with its coupled claim move, history row,
        attempt outcome and reconciliation record. A failure anywhere rolls all of it back."""
        with self._tx() as conn:
            return self._declare_restore_in(conn, who, None)

    def _declare_restore_in(self, conn: Connection, who: str, reason: str | None) -> tuple[int, int]:
        """:meth:`_declare_restore`'s work inside the caller's transaction (also the ``async`` HA mode's fence of a
        failover, whose history rows say so in ``reason``)."""
        ev = self.table.event("restore_fence")
        stmts = self._statements(ev, coupled=True)
        fenced = 0
        resync_sequences(conn)
        epoch = int(
            conn.execute(
                sa.update(meta)
                .where(meta.c.name == "restore_epoch")
                .values(value=meta.c.value + 1)
                .returning(meta.c.value)
            ).scalar_one()
        )
        args = {"operator": who, "reason": f"restore epoch {epoch}" + (f": {reason}" if reason else "")}
        keys = conn.execute(
            sa.select(intents.c.key)
            .where(intents.c.state.in_(ev.sources))
            .order_by(intents.c.created_at, intents.c.key)
        ).scalars()
        for key in list(keys):
            params = self._params(ev, key, args, conn)
            row = conn.execute(stmts["update"], params).mappings().first()
            if row is None:  # a guard of the table refused this one: it stays as it is
                continue
            self._coupled_moves(conn, ev, row, args)
            for stmt in stmts["appends"]:
                conn.execute(stmt, params)
            fenced += 1
        return epoch, fenced

    def current_epoch(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(sa.select(meta.c.value).where(meta.c.name == "restore_epoch")).scalar_one())

    def _write_rate_limit(
        self, account: str, max_sends: int | None, window_seconds: float, operator: str | None
    ) -> None:
        r = rate_limits.c
        with self._tx() as conn:
            if max_sends is None:
                conn.execute(sa.delete(rate_limits).where(r.account == account))
                self._log_policy(conn, "rate_limits", account, None, operator)
                return
            value = {"max_sends": max_sends, "window_seconds": window_seconds}
            self._log_policy(conn, "rate_limits", account, value, operator)
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

    def policies(self) -> dict[str, Any]:
        """Every policy the gates read, in one snapshot (``Operations.policies`` describes the shape)."""
        with self._tx() as conn:
            ks = {r.scope: bool(r.engaged) for r in conn.execute(sa.select(kill_switches))}
            rl = {
                r.account: {
                    "max_sends": r.max_sends,
                    "window_seconds": r.window_seconds,
                    "window_start": r.window_start,
                    "used": r.used,
                }
                for r in conn.execute(sa.select(rate_limits))
            }
            cr = {r.account: r.version for r in conn.execute(sa.select(credentials))}
            ct = {r.platform: r.version for r in conn.execute(sa.select(contracts))}
            sg = {r.account: bool(r.required) for r in conn.execute(sa.select(signing_policies))}
            tw = float(
                conn.execute(
                    sa.select(text_window_expr()), {"p_text_window": self.default_text_window_seconds}
                ).scalar_one()
            )
        return {
            "kill_switches": dict(sorted(ks.items())),
            "rate_limits": dict(sorted(rl.items())),
            "credentials": dict(sorted(cr.items())),
            "contracts": dict(sorted(ct.items())),
            "signing": dict(sorted(sg.items())),
            "text_window_seconds": tw,
        }

    def has_account(self, account: str) -> bool:
        """Whether any intent of ``account`` is stored."""
        q = sa.select(sa.exists().where(intents.c.account == check_text("account", account)))
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
        stmts = self._cache.get(("<find>", frozenset()))
        if stmts is None:
            by_key = sa.select(intents, _store_epoch()).where(intents.c.key == sa.bindparam("p_key"))
            stmts = self._cache[("<find>", frozenset())] = {"find": by_key}
        if self.dialect == "postgresql":  # one statement, one round trip: no BEGIN/COMMIT around a read
            with self._tx(autocommit=True) as conn:
                row = self._execute_compiled(conn, stmts, "find", {"p_key": key})
        else:
            with self._tx() as conn:
                row = conn.execute(stmts["find"], {"p_key": key}).mappings().first()
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

    def oldest_updates(self, states: tuple[str, ...]) -> dict[str, float | None]:
        """For each of ``states``: the earliest ``updated_at`` (store clock) of an intent in it, ``None`` when
        none is (one aggregate; ``atmostonce.observe`` turns it into the age of the longest-waiting intent)."""
        out: dict[str, float | None] = dict.fromkeys(states)
        q = (
            sa.select(intents.c.state, sa.func.min(intents.c.updated_at))
            .where(intents.c.state.in_(states))
            .group_by(intents.c.state)
        )
        with self._tx() as conn:
            for state, t in conn.execute(q):
                out[state] = t
        return out

    def record_totals(self) -> dict[str, dict[str, int]]:
        """Counts from the append-only records (``atmostonce status``): attempt outcomes (``sends``),
        reconciliation results (``reconcile_lookups``) and recorded refusals by guard (``refusals``)."""
        pairs = (
            ("sends", attempt_outcomes.c.outcome),
            ("reconcile_lookups", reconciliations.c.result),
            ("refusals", refusals.c.guard),
        )
        out: dict[str, dict[str, int]] = {}
        with self._tx() as conn:
            for name, col in pairs:
                rows = conn.execute(sa.select(col, sa.func.count()).group_by(col).order_by(col))
                out[name] = {k: int(n) for k, n in rows}
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
            sa.select(
                intents.c.history_count,
                *[intents.c[f].label(f"intent_{f}") for f in INTENT_BOUND_FIELDS],
                *cols,
                detail.label("detail"),
                h.prev_hash,
                h.row_hash,
            )
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
            {f: rows[0][f"intent_{f}"] for f in INTENT_BOUND_FIELDS} if rows else None,
        )

    def audit_orphans(self) -> list[str]:
        """Keys with history rows but no intent row (an intent deleted under the store), sorted."""
        h = history.c
        q = sa.select(h.key).distinct().where(~sa.exists().where(intents.c.key == h.key)).order_by(h.key)
        with self._tx() as conn:
            return list(conn.execute(q).scalars())

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
                r["resend_epoch"],
                r["fence_epoch"],
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
        check_limit(limit)
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


def _evidence(r: Mapping[str, Any] | RowMapping) -> Evidence:
    return Evidence(**{k: r[k] for k in Evidence.__dataclass_fields__})


def _json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v
