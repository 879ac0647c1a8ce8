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
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
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
    lookup_events,
)
from atmostonce.claims import claim_refusal_recorded
from atmostonce.errors import (
    INTENT_EXISTS,
    LOST_RACE,
    SOURCE_STATE,
    GuardRefused,
    IllegalMove,
    IntakeError,
    NoSynchronousStandby,
    Rejected,
    StoreError,
    UnknownIntent,
)
from atmostonce.identity import attempt_token, load_canonical
from atmostonce.names import EFFECT, EVENT, GUARD
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
from atmostonce.store import Operations, UnderNewLease, policy_log_row, step_args, superseding_move
from atmostonce.table import Table
from atmostonce.table import table as default_table

from .claims import SqlClaims
from .effects import SQL_EFFECTS, claims_text, rate_window_move, text_claim_lock
from .execution import (
    REFUSED_SQLSTATE,
    TEXT_WINDOW_CONSTRAINT,
    ConstraintRefused,
    Deadlock,
    Executor,
    LockNotAvailable,
    MoveRefused,
)
from .guards import PARAMS, SQL_GUARDS, GuardRefs, text_window_expr, window_full
from .schema import (
    TEXT_WINDOW_SETTING,
    approvals,
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
    settings,
    signing_policies,
    source_versions,
    sources,
)
from .sequences import resync_sequences
from .statements import BATCH_COLUMNS, SUBMITTED, Statements, db_now, store_epoch

__all__ = ["HA_MODES", "SqlStore", "db_now", "register_sqlite_functions"]

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
_MOVE_VALUES = ("key", "lease_seconds", "descriptor", "remote_id", "actor", "detail", "new_token", "new_generation")
"""What a move's statement reads besides the guards' :data:`PARAMS` (:meth:`SqlStore._params`)."""
_PREFIXED: dict[str, dict[str, str]] = {}
"""Each parameter's name under a prefix (``p_``; ``p2_``, a fused statement's second move)."""


def _prefixed(prefix: str) -> dict[str, str]:
    names = _PREFIXED.get(prefix)
    if names is None:
        names = _PREFIXED[prefix] = {n: prefix + n for n in (*PARAMS, *_MOVE_VALUES)}
    return names


assert not hasattr(Intent, "__post_init__") and not hasattr(Intent, "__slots__"), "SqlStore._intent fills __dict__"


class _Undo(Exception):
    """Rolls a transaction back where nothing it wrote is to stay (the caller then takes the usual path)."""


class SqlStore(SqlClaims, Operations):
    """A store on an SQLAlchemy engine (``postgresql`` or ``sqlite`` dialect).

    Build one with :func:`atmostonce_sql.open_store`. Thread-safe: each
    operation checks a connection out of the engine's pool.
    """

    _executor_class: type[Executor] = Executor
    """The driver layer (``atmostonce_sql.aio`` gives the async stores their own)."""

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
        """The table's outcome moves (``Table.outcome_events``) commit without waiting for the disk (PostgreSQL:
        ``synchronous_commit = off``; SQLite: ``synchronous = NORMAL``); the authorization before the bytes
        always waits for it."""
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
        self._exec = self._executor_class(engine, self._check_timeline if self.ha is not None else None)
        """The driver: transactions, compiled sends, the pipeline, and the map from driver errors."""
        self._autocommit = self._exec.autocommit
        self._builder: Statements | None = None
        self._disabled_guards: frozenset[str] = frozenset()
        self._cache: dict[tuple[Any, ...], dict[str, Any]] = {}
        self._outcome_events = frozenset(self.table.outcome_events)
        # the before-byte writes: the events that record the recovery descriptor with the authorization
        self._authorizing = frozenset(
            e.name for e in self.table.events.values() if EFFECT.write_descriptor in e.effects
        )
        # in sync mode a dispatch is not begun while the authorization would be refused: a begun attempt that
        # cannot be authorized is abandoned by the sweeper and spends one of the intent's attempts
        self._opening = frozenset(e.name for e in self.table.events.values() if EFFECT.open_attempt in e.effects)

    def close(self) -> None:
        """Close every pooled connection (both pools). The store is not used afterwards."""
        self._exec.dispose()

    def __enter__(self) -> SqlStore:
        """``with open_store(url) as store:`` closes the store when the block ends, as :meth:`close` does."""
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def _sql(self) -> Statements:
        """The statement builder of the store's table and clock (rebuilt when either is replaced)."""
        b = self._builder
        mine = (self.table, self._now, self.approval_table)
        if b is None or any(x is not y for x, y in zip((b.table, b.now, b.approval_table), mine, strict=True)):
            b = self._builder = Statements(self.table, self.dialect, self._now, self.approval_table)
        return b

    # -- plumbing -------------------------------------------------------------------------
    def _tx(self, autocommit: bool = False, lossable: bool = False) -> contextlib.AbstractContextManager[Connection]:
        """A transaction (or, with ``autocommit``, a connection for one self-contained statement); driver
        errors are mapped to the library's exceptions (``atmostonce_sql.execution``). With ``lossable``
        (:meth:`_lossable`) its commit does not wait for the disk."""
        return self._exec.tx(autocommit, lossable)

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
                # no person declared it: a terminal state (a person's parked) is left to a person
                epoch, fenced = self._declare_restore_in(
                    conn, "failover", f"failover to timeline {timeline}", by_person=False
                )
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

    def now(self) -> float:
        with self._tx() as conn:
            return float(conn.execute(sa.select(self._now)).scalar_one())

    def _next_generation(self, conn: Connection) -> int:
        """SQLite's stand-in for a SEQUENCE, bumped inside the (write-serialized) transaction (the statement
        built and compiled once, then sent to the driver as it is)."""
        stmts = self._cache.get(("<generation>", frozenset()))
        if stmts is None:
            stmts = self._cache[("<generation>", frozenset())] = {"next": self._sql.next_generation()}
        row = self._exec.run_sqlite(conn, stmts, "next", {})
        assert row is not None, "the generation row is seeded by the migrations"
        return int(row["value"])

    @staticmethod
    def _intent(row: Mapping[str, Any] | RowMapping) -> Intent:
        d = {k: row[k] for k in _INTENT_FIELDS}
        d["request"] = load_canonical(d["request"])  # canonical JSON text: the exact bytes that were digested
        d["descriptor"] = _json(d["descriptor"])
        d["requires_approval"] = bool(d["requires_approval"])  # SQLite's 0/1 when read without SQLAlchemy
        # every field given, so the frozen dataclass's __init__ (one object.__setattr__ per field, five rows a
        # publish) would only copy them: the record is filled directly (_INTENT_FIELDS: no __post_init__)
        intent = object.__new__(Intent)
        intent.__dict__.update(d)
        return intent

    # -- primitives -----------------------------------------------------------------------
    def _creation_statements(self) -> dict[str, Any]:
        hit = self._cache.get(("<create>", frozenset()))
        if hit is None:
            hit = self._cache[("<create>", frozenset())] = self._sql.creation()
        return hit

    def _create(self, sub: Submission) -> tuple[Intent, bool]:
        if sub.earlier_keys:  # the same delivery keyed by an older normalizer: found, never duplicated
            with self._tx() as conn:
                row = (
                    conn.execute(sa.select(intents, store_epoch()).where(intents.c.key.in_(sub.earlier_keys)))
                    .mappings()
                    .first()
                )
            if row is not None:
                return self._intent(row), False
        stmts = self._creation_statements()
        params = self._creation_params(stmts, sub)
        if self.dialect == "postgresql":
            with self._tx(autocommit=True) as conn:
                made = self._exec.run(conn, stmts, "one", params)
                if made is None:
                    return self._intent(conn.execute(stmts["existing"], params).mappings().one()), False
                return self._intent(made), True
        with self._tx() as conn:  # the compiled statements straight to the driver, as a move's are
            inserted = self._exec.run_sqlite(conn, stmts, "insert", params)
            if inserted is None:
                return self._intent(conn.execute(stmts["existing"], params).mappings().one()), False
            self._exec.run_sqlite(conn, stmts, "history", params, fetch=False)
            return self._intent(inserted), True

    @staticmethod
    def _creation_params(stmts: dict[str, Any], sub: Submission) -> dict[str, Any]:
        params = {f"p_{name}": getattr(sub, name) for name in SUBMITTED if name != "request"}
        return params | {
            "p_request": sub.request_json,
            "p_actor": stmts["creator"].actor,
            "p_detail": {},
            "p_generation": None,
        }

    def _create_and_apply(self, sub: Submission, steps: list[tuple[str, Any]]) -> tuple[Intent, list[Intent]] | None:
        """Create the intent and make two moves on it in one transaction: one commit where :meth:`_create` and
        :meth:`_apply_sequence` take two (docs/design.md#two-durable-points-per-send). PostgreSQL runs one
        statement in autocommit (:meth:`Statements.fused` with ``creating``: the intent inserted as the two moves
        leave it, with the creation's history row and the moves' rows); SQLite runs them in one transaction.

        Returns ``(intent, moved)``: the intent as created and the two moved rows. Returns ``None`` when nothing
        was written and the caller should create and move the intent the usual way, which names any refusal: the key was taken (the moves' arguments were
        made for a new intent), an intent keyed by an older normalizer may exist, the HA ``sync`` mode holds
        the authorization to its own check, on SQLite a move refused, on PostgreSQL a gate refused, another
        claimant held the account's text lock, or the duplicate-text constraint or a deadlock refused (the
        whole statement rolled back). Raises ``StoreError`` for any other database failure (nothing was
        written)."""
        if sub.earlier_keys or len(steps) != 2:
            return None
        events = [event for event, _ in steps]
        if self.ha == "sync" and any(e in self._authorizing | self._opening for e in events):
            return None
        stmts = self._creation_statements()
        params = self._creation_params(stmts, sub)
        if self.dialect != "postgresql":
            return self._create_and_apply_sqlite(stmts, params, sub, steps)
        fused, fused_params, chained = self._fused_call(sub.key, steps, creating=True)
        fused_params |= {f"p0_{k[2:]}": v for k, v in params.items()}
        try:
            with self._tx(autocommit=True) as conn:
                rows = self._exec.run_all(conn, fused, "one", fused_params)
        except (ConstraintRefused, Deadlock, LockNotAvailable):
            return None  # the moves could not be made without waiting: nothing was written
        if len(rows) != 3:
            # the delivery exists already (its moves are built for a new intent: epochs 0), or a gate refused:
            # nothing was written, and the usual way creates the intent and names the refusal
            return None
        intent, *moved = (self._intent(r) for r in rows)
        if chained:
            steps[1][1](moved[0])  # the arguments as the stepwise path builds them, for whoever watches
        return intent, moved

    def _create_and_apply_sqlite(
        self, stmts: dict[str, Any], params: dict[str, Any], sub: Submission, steps: list[tuple[str, Any]]
    ) -> tuple[Intent, list[Intent]] | None:
        try:
            with self._tx() as conn:
                inserted = self._exec.run_sqlite(conn, stmts, "insert", params)
                if inserted is None:
                    raise _Undo
                self._exec.run_sqlite(conn, stmts, "history", params, fetch=False)
                moved: list[Intent] = []
                for event, args in steps:
                    ev = self.table.event(event)
                    moved.append(self._apply_in(conn, ev, sub.key, step_args(args, moved[-1] if moved else None)))
        except (_Undo, Rejected, ConstraintRefused):
            return None  # rolled back: the caller submits and moves the intent the usual way
        return self._intent(inserted), moved

    # -- statements: built once per event (and set of disabled guards), executed with parameters --
    def _guard_values(self, key: str, args: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
        """What the guard fragments read besides the row: the presented arguments (``PARAMS``), the key,
        the store's default text window; each name ``prefix`` + its own (unprefixed by default)."""
        names = _prefixed(prefix)
        get = args.get
        values = {names[n]: get(n) for n in PARAMS}
        values[names["fenced"]] = get("fenced") is True
        values[names["key"]] = key
        values[names["text_window"]] = self.default_text_window_seconds
        return values

    def _params(
        self, ev, key: str, args: Mapping[str, Any], conn: Connection | None, prefix: str = "p_"
    ) -> dict[str, Any]:
        """The move's statement parameters, each name ``prefix`` + the argument's (``conn``: the open
        transaction, where SQLite draws the generation; ``None`` on PostgreSQL, whose statement draws it from its
        sequence): the guards' values (:meth:`_guard_values`), the lease, the descriptor, the remote id, the
        actor and the history detail, and a move that opens an attempt its new token."""
        names = _prefixed(prefix)
        get = args.get
        operator = get("operator")
        params = self._guard_values(key, args, prefix)
        params[names["lease_seconds"]] = float(get("lease_seconds") or 0.0)
        params[names["descriptor"]] = dict(get("descriptor") or {})
        params[names["remote_id"]] = get("remote_id")
        params[names["actor"]] = f"operator:{operator}" if operator else ev.actor
        params[names["detail"]] = {k: args[k] for k in HISTORY_DETAIL if get(k) not in (None, {}, "")}
        if EFFECT.open_attempt in ev.effects:
            params[names["new_token"]] = attempt_token()
            if self.dialect != "postgresql":
                assert conn is not None, "SQLite draws the generation inside the move's transaction"
                params[names["new_generation"]] = self._next_generation(conn)
        return params

    def _statements(self, ev, coupled: bool = False) -> dict[str, Any]:
        """Cached statements for ``ev``: the gate (``update``), the appends, the diagnosis, and on
        PostgreSQL all of it as one statement (``one``). An event that couples a claim move has two
        forms: the fast one moves only intents without an approval requirement; ``coupled`` is the
        one run inside the transaction that also moves the claim (see :meth:`_coupled_moves`)."""
        cache_key = (ev.name, self._disabled_guards, coupled)
        hit = self._cache.get(cache_key)
        if hit is None:
            hit = self._cache[cache_key] = self._sql.move(ev, self._disabled_guards, coupled)
        return hit

    def _apply(self, event: str, key: str, args: Mapping[str, Any]) -> Intent:
        ev = self.table.event(event)
        return self._refusing(ev, key, args, lambda: self._once_more(lambda: self._apply_statements(ev, key, args)))

    @staticmethod
    def _once_more(run: Any) -> Any:
        """``run()``, and once more when its conditional write moved no row yet the read that diagnosed it
        found every guard passing (:data:`~atmostonce.errors.LOST_RACE`): the row, or the database clock,
        changed between the two statements. A guard judged on the clock (a text or rate window that clears,
        a lease that lapses) can pass on the diagnosis's later reading and have refused on the write's, and
        the caller would get a race instead of the guard's name. The write is the gate either time: nothing
        was written by the first, and the second moves the row or is refused and diagnosed again; a second
        :data:`LOST_RACE` is raised (docs/design.md#the-gate-is-the-conditional-write)."""
        try:
            return run()
        except Rejected as exc:
            if exc.guard != LOST_RACE:
                raise
        return run()

    def _batch_statements(self, ev, columns: tuple[str, ...]) -> dict[str, Any]:
        """Cached :meth:`Statements.batch_move` of ``ev`` for a batch presenting ``columns``."""
        cache_key = ("<batch>", columns, *(ev.name, self._disabled_guards))  # disabled guards: the last item
        hit = self._cache.get(cache_key)
        if hit is None:
            hit = self._cache[cache_key] = self._sql.batch_move(ev, columns, cache_key[-1])
        return hit

    def _apply_batch(self, event: str, items: Sequence[tuple[str, Mapping[str, Any]]]) -> list[Intent | Rejected]:
        """``event`` for every ``(key, args)`` of ``items`` (distinct keys) in one transaction around one
        conditional write (docs/design.md#the-sweeper-moves-a-batch-per-statement; one per group of rows whose
        parameters outside the batch's columns differ, which no sweeper or reconciler move has): the batch ``UPDATE`` moves
        every row whose source state and guards hold, and each moved row's appends (attempt outcome, history
        row, reconciliation record: the single move's statements) run once per statement for all of them
        (``executemany``). A row the ``UPDATE`` did not move is diagnosed as a single move's is; one that needs
        its coupled form (an approval-gated intent's claim) is then moved on its own, as :meth:`_apply` would.
        Returns, in the order of ``items``, the moved intent or the refusal."""
        ev = self.table.event(event)
        if EFFECT.open_attempt in ev.effects:  # a new attempt draws its token and generation per move
            raise IntakeError(f"{event} opens an attempt: it is not applied in batches")
        columns = tuple(n for n in BATCH_COLUMNS if any(n in args for _, args in items))
        stmts = self._batch_statements(ev, columns)
        results: dict[int, Intent | Rejected] = {}
        coupled: list[int] = []
        for attempt in range(self._BATCH_DEADLOCK_RETRIES + 1):
            try:
                if items:
                    with self._tx(lossable=self._lossable([ev.name])) as conn:
                        results, coupled = self._batch_in(conn, ev, stmts, columns, items)
                break
            except Deadlock:
                # two batches locked their rows in different orders and PostgreSQL rolled this one back: it
                # wrote nothing, and run again it moves what the other left (and refuses what it moved)
                if attempt == self._BATCH_DEADLOCK_RETRIES:
                    raise
        for i in coupled:  # an approval-gated intent: its move with its claim's, in a transaction of its own
            key, args = items[i]
            try:
                results[i] = self._refusing(ev, key, args, lambda: self._apply_coupled(ev, key, args))  # noqa: B023
            except Rejected as exc:
                results[i] = exc
        return [results[i] for i in range(len(items))]

    _BATCH_DEADLOCK_RETRIES = 3
    """How many times a batch rolled back by a deadlock (``Deadlock``: nothing written) is run again."""

    def _batch_in(
        self,
        conn: Connection,
        ev,
        stmts: dict[str, Any],
        columns: tuple[str, ...],
        items: Sequence[tuple[str, Mapping[str, Any]]],
    ) -> tuple[dict[int, Intent | Rejected], list[int]]:
        """:meth:`_apply_batch`'s transaction: the batch ``UPDATE``, the moved rows' appends, the diagnosis of
        each row it did not move. Returns the results by position and the positions that need their coupled
        form."""
        results: dict[int, Intent | Rejected] = {}
        coupled: list[int] = []
        params = [self._params(ev, key, args, conn) for key, args in items]
        # in key order: two batches over the same rows then lock them in one order (docs/design.md#the-sweeper-moves-a-batch-per-statement)
        order = sorted(range(len(items)), key=lambda i: items[i][0])
        # the UPDATE reads a row's own values from the batch (columns) and the rest as parameters: rows whose other
        # parameters differ (a reason, a descriptor) go in separate UPDATEs, never under the first row's values
        used = stmts.get("parameters")
        if used is None:
            used = stmts["parameters"] = sorted(
                k
                for k in stmts["update"].compile(dialect=conn.dialect).params
                if k.startswith("p_") and k not in ("p_batch", "p_key") and k[2:] not in columns  # not its literals
            )
        groups: dict[str, list[int]] = {}
        for i in order:
            same = json.dumps([params[i].get(k) for k in used], sort_keys=True, default=str)
            groups.setdefault(same, []).append(i)
        moved: dict[str, Any] = {}
        for idx in groups.values():
            batch = [{"key": items[i][0], **{n: items[i][1].get(n) for n in columns}} for i in idx]
            constant = {k: params[idx[0]].get(k) for k in used}
            rows = conn.execute(stmts["update"], constant | {"p_batch": batch}).mappings().all()
            moved.update({r["key"]: r for r in rows})
        done = [params[i] for i, (key, _) in enumerate(items) if key in moved]
        for stmt in stmts["appends"] if done else ():
            conn.execute(stmt, done)  # one statement for every moved row (executemany)
        for i, (key, _) in enumerate(items):
            if key in moved:
                results[i] = self._intent(moved[key])
                continue
            refusal = self._diagnose(conn, ev, key, params[i])  # the refusal path only
            if refusal is None:
                coupled.append(i)
            else:
                results[i] = refusal
        return results, coupled

    def _apply_sequence(self, key: str, steps: list[tuple[str, Any]]) -> list[Intent]:
        """Several moves in one transaction (one commit): each its own conditional write, as
        :meth:`_apply` runs it; a refusal rolls back the moves before it and is raised. On PostgreSQL
        two moves are first one statement (:meth:`_fused`), more are pipelined (:meth:`_pipelined`); a
        refusal there, or an intent whose move needs its coupled form (an account rate window, a claim),
        then takes the transaction below, which names the refusing guard."""
        events = [event for event, _ in steps]
        durable = self.ha == "sync" and any(e in self._authorizing | self._opening for e in events)
        if self.dialect == "postgresql" and not durable:
            fusable = len(steps) == 2 and (not callable(steps[1][1]) or isinstance(steps[1][1], UnderNewLease))
            try:
                done = self._fused(key, steps) if fusable else self._pipelined(key, steps)
            except Rejected as exc:
                if exc.guard != LOST_RACE:
                    raise
                done = None  # diagnosed on another connection, after the clock moved: the path below tries again
            if done is not None:
                return done
        current: list[tuple[Any, Mapping[str, Any]]] = []

        def run() -> list[Intent]:
            out: list[Intent] = []
            current.clear()  # run again by _once_more
            with self._tx(lossable=self._lossable(events)) as conn:
                if durable:  # HA sync mode: the commit waits for the synchronous standby, or nothing moves
                    self._durable_authorization(conn, self.table.event(events[0]), key)
                for event, step in steps:
                    ev = self.table.event(event)
                    args = step_args(step, out[-1] if out else None)
                    current.append((ev, args))
                    out.append(self._apply_in(conn, ev, key, args))
            return out

        try:
            return self._once_more(run)
        except (Rejected, StoreError) as exc:
            if not current:
                raise
            ev, args = current[-1]
            err = exc
            return self._refusing(ev, key, args, lambda: self._reraise(err))

    def _lossable(self, events: list[str]) -> bool:
        """Whether a transaction of these moves may commit without waiting for the disk: when every one is
        an outcome move (``Table.outcome_events``: its loss leaves the send in flight under a lease, and the
        lease's expiry makes it unknown) and ``async_outcomes`` is on. A later synchronous commit (the next
        authorization) makes every earlier one durable: the WAL is one sequence, on PostgreSQL and in
        SQLite's WAL file alike (docs/design.md#two-durable-points-per-send)."""
        return self.async_outcomes and all(e in self._outcome_events for e in events)

    @staticmethod
    def _reraise(exc: BaseException) -> Any:
        raise exc

    REFUSED_SQLSTATE = REFUSED_SQLSTATE
    """What ``aom_moved`` raises when a pipelined move moved no row (migration 0010)."""

    def _pipelined(self, key: str, steps: list[tuple[str, Any]]) -> list[Intent] | None:
        """PostgreSQL: BEGIN, each move's statement and COMMIT sent through psycopg's pipeline, on an
        autocommit connection (:meth:`Executor.pipeline`). One round trip for moves whose arguments are
        known up front; a step whose arguments are computed from the previous move's row (a callable)
        waits for that row, one more round trip. Each move's statement fails when it moved no row, which
        aborts the transaction, so the COMMIT applies every move or none. Returns the moved rows; raises
        the refusal of the first move, diagnosed afterwards like a single move's; ``None`` (nothing was
        written) when a move needs its coupled form, or when a later move refused: the transaction
        path then runs the moves again and diagnoses the refusal where the earlier moves are visible."""
        if any(claims_text(self.table.event(event)) for event, _ in steps):
            return None  # a text claim waits for the account's text lock first: the transaction path takes it
        queued: list[tuple[Any, dict[str, Any]]] = []

        def body(pipe: Any) -> None:
            queued.clear()  # run again when the pipeline is retried (Executor.pipeline)
            for event, args in steps:
                ev = self.table.event(event)
                if callable(args):
                    rows = pipe.rows()
                    args = args(self._intent(rows[-1]) if rows else None)
                params = self._params(ev, key, args, None)
                queued.append((ev, params))
                pipe.send(self._statements(ev), "strict", params)

        try:
            with self._tx(autocommit=True) as sconn:  # driver errors become StoreError there
                rows = self._exec.pipeline(sconn, self._lossable([event for event, _ in steps]), body)
            return [self._intent(r) for r in rows]
        except MoveRefused as refused:
            at = next((i for i, (ev, _) in enumerate(queued) if ev.name == refused.move), None)
            if at is None:
                raise StoreError(f"pipelined moves: the refused move {refused.move!r} was not queued") from refused
            if at > 0:
                # a later move refused: what refused it can only be read inside the transaction the
                # earlier moves were in, so the transaction path runs them again and names it
                return None
            ev, params = queued[0]
        with self._tx(autocommit=True) as conn:
            refusal = self._diagnose(conn, ev, key, params)
        if refusal is None:
            return None
        raise refusal

    def _fused_call(
        self, key: str, steps: list[tuple[str, Any]], creating: bool = False
    ) -> tuple[dict[str, Any], dict[str, Any], bool]:
        """The statement of two moves as one (:meth:`Statements.fused`, cached; with ``creating``, the one that
        also creates the intent, whose creation parameters the caller adds), its parameters, and whether the
        second move is held to the lease the first opens (:class:`~atmostonce.store.UnderNewLease`)."""
        (first, args1), (second, args2) = steps
        ev, ev2 = self.table.event(first), self.table.event(second)
        chained = isinstance(args2, UnderNewLease)
        lossable = self._lossable([first, second])
        first_key = (ev.name, self._disabled_guards)
        cache_key = ("<fused>", second, chained, lossable, creating, *first_key)
        stmts = self._cache.get(cache_key)
        if stmts is None:
            stmts = self._cache[cache_key] = self._sql.fused(ev, ev2, chained, lossable, first_key[1], creating)
        params = self._params(ev, key, args1, None)
        params |= self._params(ev2, key, args2.fixed if chained else args2, None, "p2_")
        return stmts, params, chained

    def _fused(self, key: str, steps: list[tuple[str, Any]]) -> list[Intent] | None:
        """PostgreSQL: two moves as one statement in autocommit (:meth:`Statements.fused`): one round trip, one
        commit, without a commit wait when both are outcome moves (:meth:`_lossable`). A second step under
        :class:`~atmostonce.store.UnderNewLease` is held to the lease the first opened, read in the statement.
        Returns the two moved rows; ``None`` when no row moved (either gate refused, or a move needs its
        coupled form), the duplicate-text constraint or a deadlock refused, or another transaction holds the
        intent's row (the statement does not wait for it: see :meth:`Statements.fused`): nothing was written,
        and the caller runs the moves again one by one to move or name the refusal."""
        (_, args2) = steps[1]
        stmts, params, chained = self._fused_call(key, steps)
        try:
            with self._tx(autocommit=True) as conn:
                rows = self._exec.run_all(conn, stmts, "one", params)
        except (ConstraintRefused, Deadlock, LockNotAvailable):
            return None
        if len(rows) != 2:
            return None
        moved = [self._intent(r) for r in rows]
        if chained:
            args2(moved[0])  # the arguments as the stepwise path builds them, for whoever watches (``seen``)
        return moved

    def _apply_in(self, conn: Connection, ev, key: str, args: Mapping[str, Any]) -> Intent:
        """One move inside the open transaction ``conn``: the conditional write and its appends (on
        PostgreSQL one statement), or, for an intent whose move needs its claim or rate window, the
        coupled form; raises the diagnosed refusal when no row moved."""
        stmts = self._statements(ev)
        params = self._params(ev, key, args, conn)
        if self.dialect == "postgresql":
            self._lock_text(conn, ev, key)
            row = self._exec.run(conn, stmts, "one", params)
        else:
            row = self._exec.run_sqlite(conn, stmts, "update", params)
            if row is not None:
                for i in range(len(stmts["appends"])):
                    self._exec.run_sqlite(conn, stmts, ("appends", i), params, fetch=False)
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
        self._lock_coupled_rows(conn, ev, key)
        row = conn.execute(stmts["update"], params).mappings().first()
        if row is None:
            raise self._diagnose(conn, ev, key, params, coupled=True) or Rejected(ev.name, key, LOST_RACE, None)
        self._coupled_moves(conn, ev, row, args)
        if self._moves_window(ev):
            self._take_rate_slot(conn, ev, row)
        for stmt in stmts["appends"]:
            conn.execute(stmt, params)
        return self._intent(row)

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
            excluded = isinstance(exc, ConstraintRefused) and exc.constraint == TEXT_WINDOW_CONSTRAINT
            if excluded or (isinstance(exc, Deadlock) and EFFECT.claim_text_slot in ev.effects):
                raise GuardRefused(
                    ev.name, key, GUARD.text_window_clear, None, "refused by the database exclusion"
                ) from exc
            raise

    def _apply_statements(self, ev, key: str, args: Mapping[str, Any]) -> Intent:
        stmts = self._statements(ev)
        if self.ha == "sync" and ev.name in self._authorizing | self._opening:
            # the same one statement, in a transaction whose commit waits for the synchronous standby
            with self._tx() as conn:
                self._durable_authorization(conn, ev, key)
                self._lock_row(conn, ev, key)
                moved = self._one_statement(conn, stmts, ev, key, args)
        elif self.dialect == "postgresql" and self._lossable([ev.name]):
            # an outcome move: BEGIN, SET LOCAL synchronous_commit, the move, COMMIT in one round trip
            pipelined = self._pipelined(key, [(ev.name, args)])
            moved = pipelined[0] if pipelined is not None else None
        elif self.dialect == "postgresql" and self._reads_beyond_row(ev):
            # the intent's row locked first, then the move: its guards that read other tables (a kill
            # switch, a credential, a source) read a snapshot taken after any wait for that row
            with self._tx() as conn:
                self._lock_row(conn, ev, key)
                moved = self._one_statement(conn, stmts, ev, key, args)
        elif self.dialect == "postgresql":
            # the conditional UPDATE and every append in one statement (data-modifying CTEs), sent in
            # autocommit mode: one round trip per accepted transition
            with self._tx(autocommit=True) as conn:
                moved = self._one_statement(conn, stmts, ev, key, args)
        else:
            # SQLite: a refusal rolls the transaction back; an outcome move's commit does not sync the WAL
            with self._tx(lossable=self._lossable([ev.name])) as conn:
                return self._apply_in(conn, ev, key, args)
        # None: the move needs its coupled form (an approval-gated intent: with its claim)
        return moved if moved is not None else self._apply_coupled(ev, key, args)

    def _one_statement(
        self, conn: Connection, stmts: dict[str, Any], ev, key: str, args: Mapping[str, Any]
    ) -> Intent | None:
        """PostgreSQL: the move's one statement on ``conn``; the moved intent, else the diagnosed refusal is
        raised, else ``None`` (no guard refused: the move needs its coupled form)."""
        params = self._params(ev, key, args, conn)
        row = self._exec.run(conn, stmts, "one", params)
        if row is not None:
            return self._intent(row)
        refusal = self._diagnose(conn, ev, key, params)
        if refusal is not None:
            raise refusal
        return None

    def _reads_beyond_row(self, ev) -> bool:
        """Whether one of ``ev``'s guards reads a table other than the intent's row (the table's policy and
        waiting guards: kill switch, credential, contract, duplicate text, source, rate window)."""
        t = self.table
        return any(g in t.policy_guards or g in t.waiting_guards for g in ev.guards)

    def _lock_row(self, conn: Connection, ev, key: str) -> None:
        """PostgreSQL, inside ``conn``'s transaction: lock the intent's row before ``ev``'s statement when
        :meth:`_reads_beyond_row`. A statement that waited for the row itself would evaluate those guards in
        the snapshot it took before the wait (READ COMMITTED), and could miss a kill switch committed
        meanwhile; the statement after this lock starts after the wait and waits no more."""
        if self.dialect == "postgresql" and self._reads_beyond_row(ev):
            conn.execute(sa.select(intents.c.key).where(intents.c.key == key).with_for_update())
            self._lock_text(conn, ev, key)

    def _lock_text(self, conn: Connection, ev, key: str) -> None:
        """PostgreSQL, inside ``conn``'s transaction, before the statement of a move that claims the intent's text:
        wait for the account's text lock (:func:`~atmostonce_sql.effects.text_claim_lock`), held by any other
        claimant until it commits. The move's statement then starts after that wait, and its claim never waits
        on the exclusion constraint with guards read before (a kill switch committed meanwhile is read)."""
        if self.dialect == "postgresql" and claims_text(ev):
            c = intents.c
            lock = text_claim_lock(c.account, c.text_hash, wait=True)
            conn.execute(sa.select(lock).where(c.key == key, c.text_hash.is_not(None)))

    def _lock_coupled_rows(self, conn: Connection, ev, key: str) -> None:
        """PostgreSQL, inside ``conn``'s transaction, before the coupled move's guarded ``UPDATE``: lock the
        other rows the move then writes (the account's rate window row; the target's claim row and its
        approval's), so every wait for another transaction happens here, and the ``UPDATE`` after it reads the
        kill switch, the credential, the contract and the source in a snapshot taken after the wait. Waiting
        on one of those rows after the ``UPDATE`` would commit guards read before the wait: a kill switch
        committed meanwhile would be missed (READ COMMITTED)."""
        if self.dialect != "postgresql":
            return
        self._lock_text(conn, ev, key)
        claim = ev.couples.get("claim")
        if not self._moves_window(ev) and claim is None:
            return
        it = conn.execute(
            sa.select(intents.c.account, intents.c.target, intents.c.requires_approval).where(intents.c.key == key)
        ).first()
        if it is None:
            return  # the guarded UPDATE finds no row and names the refusal
        if self._moves_window(ev):
            conn.execute(sa.select(rate_limits.c.account).where(rate_limits.c.account == it.account).with_for_update())
        if claim is not None and it.requires_approval:
            held = self._claim_row_before(conn, it.target, lock=True)
            if held is not None and held["approval_id"] is not None:
                conn.execute(
                    sa.select(approvals.c.approval_id)
                    .where(approvals.c.approval_id == held["approval_id"])
                    .with_for_update()
                )

    def _apply_coupled(self, ev, key: str, args: Mapping[str, Any]) -> Intent:
        """The intent's move and its claim's (and approval's) in one transaction: all or nothing."""
        with self._tx(lossable=self._lossable([ev.name])) as conn:
            self._lock_row(conn, ev, key)
            if self.ha == "sync" and ev.name in self._authorizing | self._opening:
                self._durable_authorization(conn, ev, key)
            return self._coupled_in(conn, ev, key, args, self._params(ev, key, args, conn))

    @staticmethod
    def _moves_window(ev) -> bool:
        """Whether one of the move's effects moves the account's rate window row (``SqlEffect.window``)."""
        return any(SQL_EFFECTS[e].window for e in ev.effects)

    def _take_rate_slot(self, conn: Connection, ev, row: Mapping[str, Any] | RowMapping) -> None:
        """The account's window row, by compare-and-set (``atmostonce_sql.effects.rate_window_move``), in the
        move's transaction; an account without a rate limit has no row to move."""
        r = rate_limits.c
        if conn.execute(sa.select(r.account).where(r.account == row["account"])).first() is None:
            return
        check = GUARD.rate_limit_clear not in self._disabled_guards
        moved = conn.execute(rate_window_move(self._now, check), {"p_account": row["account"]}).first()
        if moved is None:
            raise GuardRefused(ev.name, row["key"], GUARD.rate_limit_clear, row["prev_state"])

    def _check(self, event: str, key: str, args: Mapping[str, Any], guards: tuple[str, ...]) -> str | None:
        """A read-only ``SELECT`` of the event's source state and guard fragments (the diagnosis statement
        the conditional write is explained with), in no transaction that writes."""
        ev = self.table.event(event)
        stmts = self._statements(ev)
        with self._tx() as conn:
            values = self._guard_values(key, args)
            row = conn.execute(stmts["diagnose"], {f"p_{k}": v for k, v in values.items()}).first()
        if row is None:
            raise UnknownIntent(event, key, INTENT_EXISTS, None)
        if row[0] not in ev.sources:
            return SOURCE_STATE
        passed = {g: bool(row[i + 1]) for i, g in enumerate(stmts["checked"])}  # disabled guards are absent
        return next((g for g in guards if not passed.get(g, True)), None)

    def _diagnose(
        self, conn: Connection, ev, key: str, params: Mapping[str, Any], coupled: bool = False
    ) -> Rejected | None:
        """Name what refused a zero-row write; ``None`` when the intent needs its coupled claim move."""
        row = conn.execute(self._statements(ev)["diagnose"], params).first()
        if row is None:
            return UnknownIntent(ev.name, key, INTENT_EXISTS, None)
        if row[0] not in ev.sources:
            return IllegalMove(ev.name, key, SOURCE_STATE, row[0])
        for i, g in enumerate(self._statements(ev)["checked"]):
            if not row[i + 1]:
                return GuardRefused(ev.name, key, g, row[0])
        if not coupled and ((ev.couples and row[-2]) or (self._moves_window(ev) and row[-1])):
            return None  # the move needs its transaction: the claim, or the account's rate window
        return Rejected(ev.name, key, LOST_RACE, row[0], "the row changed between the write and the diagnosis")

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
    _POLICY: dict[str, tuple[sa.Table, str, str | None]] = {
        "kill_switches": (kill_switches, "scope", None),  # engaged while the row exists
        "credentials": (credentials, "account", "version"),
        "contracts": (contracts, "platform", "version"),
        "signing_policies": (signing_policies, "account", "required"),
    }

    def _write_policy(self, kind: str, name: str, value: Any, operator: str | None) -> None:
        val_col: str | None
        if kind == "text_window_seconds":
            table, key_col, val_col, key = settings, "name", "value", TEXT_WINDOW_SETTING
        else:
            table, key_col, val_col = self._POLICY[kind]
            key = name
        with self._tx() as conn:
            conn.execute(sa.delete(table).where(table.c[key_col] == key))
            if value is not None and value is not False:
                conn.execute(
                    sa.insert(table).values({key_col: key} if val_col is None else {key_col: key, val_col: value})
                )
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

    def _declare_restore_in(
        self, conn: Connection, who: str, reason: str | None, by_person: bool = True
    ) -> tuple[int, int]:
        """:meth:`_declare_restore`'s work inside the caller's transaction (also the ``async`` HA mode's fence of a
        failover, whose history rows say so in ``reason``). Not ``by_person`` (the failover's fence, which no
        person declared), it leaves intents in a terminal state of the table as they are: no machine moves an
        intent out of one."""
        ev = self.table.event(EVENT.restore_fence)
        sources = [s for s in ev.sources if by_person or s not in self.table.terminal_states]
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
            sa.select(intents.c.key).where(intents.c.state.in_(sources)).order_by(intents.c.created_at, intents.c.key)
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
            ks = {r.scope: True for r in conn.execute(sa.select(kill_switches))}
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
        # the guard's own fragment, over the account given instead of an intent's column
        x = GuardRefs(None, None, self.table, self.approval_table)
        q = sa.select(
            ~SQL_GUARDS[GUARD.kill_switch_off](SimpleNamespace(account=sa.literal(account, sa.Text)), self._now, x)
        )
        with self._tx() as conn:
            return bool(conn.execute(q).scalar_one())

    # -- reads ----------------------------------------------------------------------------
    def find(self, key: str) -> Intent | None:
        check_text("key", key, max_chars=256)
        stmts = self._cache.get(("<find>", frozenset()))
        if stmts is None:
            stmts = self._cache[("<find>", frozenset())] = {"find": self._sql.find()}
        row: Mapping[str, Any] | None
        if self.dialect == "postgresql":  # one statement, one round trip: no BEGIN/COMMIT around a read
            with self._tx(autocommit=True) as conn:
                row = self._exec.run(conn, stmts, "find", {"p_key": key})
        else:
            with self._tx() as conn:
                row = conn.execute(stmts["find"], {"p_key": key}).mappings().first()  # type: ignore[assignment]
        return None if row is None else self._intent(row)

    def get(self, key: str) -> Intent:
        it = self.find(key)
        if it is None:
            raise UnknownIntent("get", key, INTENT_EXISTS, None)
        return it

    def list_intents(self, state: str | None = None, limit: int = 1000, *, after: str | None = None) -> list[Intent]:
        check_limit(limit)
        q = sa.select(intents, store_epoch()).order_by(intents.c.created_at, intents.c.key).limit(limit)
        if state is not None:
            q = q.where(intents.c.state == state)
        if after is not None:
            q = q.where(_after(after))
        with self._tx() as conn:
            if state is not None:
                self._read_in_index_order(conn)
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
        the reconciler's lookups by result (``reconcile_lookups``: not the record a send's unknown outcome opens,
        nor a person's settlement) and recorded refusals by guard (``refusals``)."""
        r = reconciliations.c
        looked = r.event.in_(lookup_events(self.table)) | r.event.is_(None)  # None: a record from before 0002
        pairs = (
            ("sends", attempt_outcomes.c.outcome, sa.true()),
            ("reconcile_lookups", r.result, looked),
            ("refusals", refusals.c.guard, sa.true()),
        )
        out: dict[str, dict[str, int]] = {}
        with self._tx() as conn:
            for name, col, where in pairs:
                rows = conn.execute(sa.select(col, sa.func.count()).where(where).group_by(col).order_by(col))
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
            sa.select(intents, store_epoch())
            .where(intents.c.lease_expires_at.is_not(None), intents.c.lease_expires_at <= self._now)
            .order_by(intents.c.lease_expires_at)
            .limit(limit)
        )
        with self._tx() as conn:
            return [self._intent(r) for r in conn.execute(q).mappings()]

    def claimable(self, limit: int = 100, *, after: str | None = None) -> list[str]:
        """Keys of intents in the initial state with no open attempt whose source (if any) is still the
        head: the freshness fence runs before any expensive work (candidates for ``begin``), oldest first;
        ``after``: only those after that intent (creation time, then key)."""
        check_limit(limit)
        head = sa.select(sources.c.head_version).where(sources.c.source_id == intents.c.source_id).scalar_subquery()
        q = (
            sa.select(intents.c.key)
            .where(
                intents.c.state == self.table.initial,
                intents.c.attempt_token.is_(None),
                sa.or_(intents.c.source_version.is_(None), intents.c.source_version == head),
            )
            .order_by(intents.c.created_at, intents.c.key)
            .limit(limit)
        )
        if after is not None:
            q = q.where(_after(after))
        with self._tx() as conn:
            self._read_in_index_order(conn)
            return list(conn.execute(q).scalars())

    def _read_in_index_order(self, conn: Connection) -> None:
        """PostgreSQL, inside ``conn``'s transaction: a page of a queue is read in the order of its index
        (``aom_intents_claimable``, ``aom_intents_unknown``), never by sorting the whole queue. Intents that
        arrived after the last ANALYZE (an outage making thousands of sends unknown at once) are not in the
        planner's statistics; estimating the queue empty, it may scan it all and sort, a cost that grows
        with the queue. Sorting is priced out for this transaction only (``SET LOCAL``)."""
        if self.dialect == "postgresql":
            conn.exec_driver_sql("SET LOCAL enable_sort = off")

    def total_attempts(self) -> int:
        with self._tx() as conn:
            return int(conn.execute(sa.select(sa.func.count()).select_from(attempts)).scalar_one())


def _after(key: str) -> sa.ColumnElement[bool]:
    """Rows after the intent ``key`` in (creation time, key) order; none when no intent has that key. A row
    comparison, so an index ordered by ``(created_at, key)`` (the partial ``aom_intents_claimable`` and
    ``aom_intents_unknown``, or ``aom_intents_state`` within one state) starts the page at that row instead of
    reading the rows before it."""
    other = intents.alias("after_row")
    ref = sa.select(other.c.created_at).where(other.c.key == key).scalar_subquery()
    return sa.tuple_(intents.c.created_at, intents.c.key) > sa.tuple_(ref, sa.literal(key, sa.Text))


def _evidence(r: Mapping[str, Any] | RowMapping) -> Evidence:
    return Evidence(**{k: r[k] for k in Evidence.__dataclass_fields__})


def _json(v: Any) -> Any:
    return json.loads(v) if isinstance(v, str) else v
