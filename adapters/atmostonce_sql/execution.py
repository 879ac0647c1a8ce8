"""Execution: the only code that talks to the database driver (psycopg 3, the stdlib's sqlite3), and the
map from driver errors to the library's own exceptions.

Statements come from ``atmostonce_sql.statements``, compiled once by SQLAlchemy (same SQL, same bind
processing, through its public compiler API) and cached beside them; the hot path sends them through
the driver directly, without SQLAlchemy's per-call execution machinery. On PostgreSQL the compiled text
is rewritten to the server's own ``$n`` placeholders and sent as a prepared statement: in autocommit as
the store's own (:meth:`Executor._query`), inside a transaction by psycopg's ``RawCursor``; pipelined moves
(:meth:`Executor.pipeline`) send ``BEGIN``, every move and ``COMMIT`` in one round trip.

Errors are mapped by what the driver reports as data, never by message text: PostgreSQL's SQLSTATE,
and constraint name (:func:`driver_error`). SQLite reports a trigger's ``RAISE(ABORT,
...)`` only as ``SQLITE_CONSTRAINT_TRIGGER`` with the trigger's message, so the message is looked up
exactly among the constant messages this package's migrations give their triggers.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import sqlalchemy as sa
import sqlalchemy.dialects.postgresql
from sqlalchemy.engine import Connection, Engine

from atmostonce.errors import AppendOnlyViolation, StoreError

from .append_only import append_only_messages
from .moves import DELETE_GUARD_MESSAGE, MOVE_GUARD_MESSAGE
from .schema import metadata

__all__ = [
    "APPEND_ONLY_SQLSTATE",
    "REFUSED_SQLSTATE",
    "TEXT_WINDOW_CONSTRAINT",
    "ConstraintRefused",
    "Deadlock",
    "Executor",
    "LockNotAvailable",
    "MoveRefused",
    "Pipeline",
    "driver_error",
    "generic_plans",
]

REFUSED_SQLSTATE = "AOM01"
"""What ``aom_moved`` raises when a pipelined move moved no row (migration 0010)."""
APPEND_ONLY_SQLSTATE = "AOM02"
"""What ``aom_refuse_change()``, the append-only trigger, raises (migration 0014; the table is the error's
detail). A grant's refusal is ``42501`` and stays a plain :class:`StoreError`."""
TEXT_WINDOW_CONSTRAINT = "aom_text_claims_window"
"""The database's duplicate-text exclusion (PostgreSQL: an ``EXCLUDE`` constraint; SQLite: a trigger)."""
_EXCLUSION_VIOLATION = "23P01"
_DEADLOCK_DETECTED = "40P01"
_LOCK_NOT_AVAILABLE = "55P03"


_PREPARED: weakref.WeakKeyDictionary[Any, dict[bytes, Any]] = weakref.WeakKeyDictionary()
"""The statements :meth:`Executor._query` prepared, per psycopg connection (a new connection has none), each
with the psycopg ``Transformer`` that loads its rows once it has run (``None`` before): its columns and their
types are fixed while the statement stays prepared, so the loaders are looked up once."""


_SESSION_FREE = frozenset({16, 20, 21, 23, 25, 114, 700, 701, 1043, 1700, 3802})
"""The result types whose loaders read no session setting (boolean, integers, text, varchar, floats, numeric,
json, jsonb): a statement whose columns are all of these keeps its loaders (:data:`_PREPARED`). A date or time
depends on the session's ``DateStyle`` and ``TimeZone``, and is loaded with the connection's context each run."""


class _Loading:
    """The adaptation context of a ``Transformer`` kept in :data:`_PREPARED`: the connection's adapters without
    the connection (a value referring to its weak key would keep the connection alive). Text is read as UTF-8,
    the only encoding :meth:`Executor._query` runs under. The loaders are the adapters' when the statement first
    ran on the connection (the store's statements read their own columns; a loader registered later on the
    connection is not looked up for them)."""

    __slots__ = ("adapters",)
    connection = None

    def __init__(self, adapters: Any):
        self.adapters = adapters


_NO_SUCH_PREPARED = "26000"
_DUPLICATE_PREPARED = "42P05"
_STALE_PREPARED = frozenset({_NO_SUCH_PREPARED, "0A000"})  # gone, or "cached plan must not change result type"


def _text_value(v: Any) -> bytes | None:
    """A parameter's value in PostgreSQL's text format (what the server parses for the ``$n``'s type): a
    ``str``, ``bool``, ``int`` or ``float`` (or a subclass: its value, not its ``str()``), psycopg's
    ``Json``/``Jsonb`` wrapper (as SQLAlchemy's JSON type binds a value), anything else by psycopg's own text
    dumper for its type."""
    if v is None:
        return None
    if isinstance(v, str):
        if "\x00" in v:  # libpq reads a text value up to its first NUL: refused, as psycopg's own dumper does
            import psycopg

            raise psycopg.DataError("PostgreSQL text fields cannot contain NUL (0x00) bytes")
        return str.encode(v)
    if isinstance(v, bool):
        return b"t" if v else b"f"
    if isinstance(v, int):
        return int.__repr__(v).encode()
    if isinstance(v, float):
        return float.__repr__(v).encode()  # the shortest text that reads back as the same double
    from psycopg.adapt import PyFormat, Transformer
    from psycopg.types.json import Json, Jsonb

    if isinstance(v, (Json, Jsonb)):
        text = (v.dumps or json.dumps)(v.obj)  # psycopg's default is json.dumps
        return text.encode() if isinstance(text, str) else bytes(text)
    dumped = Transformer().get_dumper(v, PyFormat.TEXT).dump(v)
    return None if dumped is None else bytes(dumped)


_OIDS: tuple[tuple[type, int], ...] = (
    (sa.Boolean, 16),
    (sa.BigInteger, 20),
    (sa.SmallInteger, 21),
    (sa.Integer, 23),
    (sa.Float, 701),
    (sa.Numeric, 1700),
    (sa.dialects.postgresql.JSONB, 3802),
    (sa.JSON, 114),
)
"""A bind's PostgreSQL type OID by its SQLAlchemy type (checked in order: ``Float`` is a ``Numeric``)."""


def _processed(proc: Any, v: Any) -> Any:
    """A bind's value as its bind processor leaves it (``None`` stays ``None``)."""
    return proc(v) if proc is not None and v is not None else v


def _encoded(proc: Any, v: Any) -> bytes | None:
    """A bind's value processed, in PostgreSQL's text format (:func:`_text_value`)."""
    if v is None:
        return None
    if proc is None:  # the common cases, without another call
        t = type(v)
        if t is str and "\x00" not in v:
            return v.encode()
        if t is bool:
            return b"t" if v else b"f"
        if t is float:
            return float.__repr__(v).encode()
    return _text_value(_processed(proc, v))


def _binder(
    parts: tuple[tuple[str, Any, Any, bool], ...], value: Callable[[Any, Any], Any]
) -> Callable[[Mapping[str, Any]], list[Any]]:
    """The function from a statement's parameters to its arguments in placeholder order: a passed bind's
    ``value(processor, given)``, any other bind its part's value (a constant of the statement); a required bind
    not passed raises ``InvalidRequestError``, as SQLAlchemy refuses it."""

    template = [default for _, _, default, _ in parts]
    constants = frozenset(k for k, _, default, required in parts if default is not None and not required)
    # the binds a caller may pass: every one but the statement's constants (which a caller passes only by
    # naming one, the rare case below)
    variable = tuple((i, k, proc, required) for i, (k, proc, _, required) in enumerate(parts) if k not in constants)
    every = tuple((i, k, proc, required) for i, (k, proc, _, required) in enumerate(parts))

    def bind(params: Mapping[str, Any]) -> list[Any]:
        out = template.copy()
        for i, k, proc, required in every if not constants.isdisjoint(params) else variable:
            if k in params:
                out[i] = value(proc, params[k])
            elif required:
                raise sa.exc.InvalidRequestError(f"a value is required for bind parameter {k!r}")
        return out

    return bind


class ConstraintRefused(StoreError):
    """A named constraint of the schema refused the write (``constraint``); nothing was written."""

    def __init__(self, message: str, constraint: str, sqlstate: str | None = None):
        super().__init__(message)
        self.constraint = constraint
        self.sqlstate = sqlstate


class Deadlock(StoreError):
    """PostgreSQL broke a wait cycle and rolled this transaction back (SQLSTATE 40P01); nothing was written."""


class LockNotAvailable(StoreError):
    """A row this statement would have waited for is locked by another transaction (``FOR UPDATE NOWAIT``,
    SQLSTATE 55P03); nothing was written."""


class MoveRefused(Exception):  # noqa: N818 - a signal between execution and the operations, never raised to callers
    """A pipelined move moved no row (SQLSTATE ``AOM01``); ``move`` is the event named in the error's detail.
    The transaction was rolled back."""

    def __init__(self, move: str | None):
        super().__init__(move)
        self.move = move


def _sqlite_trigger_constraints() -> dict[str, str]:
    """Every message a trigger of this package's SQLite schema raises, to the trigger's rule."""
    out = {m: "append_only" for t in metadata.tables for m in append_only_messages(t)}
    out["atmostonce: aom_text_claims_window: duplicate text inside the window"] = TEXT_WINDOW_CONSTRAINT
    out[MOVE_GUARD_MESSAGE] = "aom_intents_move_guard"
    out[DELETE_GUARD_MESSAGE] = "aom_intents_no_delete"
    return out


_SQLITE_TRIGGERS = _sqlite_trigger_constraints()


def driver_error(exc: sa.exc.DBAPIError) -> StoreError:
    """The library's exception for a driver error: :class:`AppendOnlyViolation`, :class:`ConstraintRefused`
    (with the constraint's name), :class:`Deadlock`, :class:`LockNotAvailable`, else :class:`StoreError`."""
    orig = exc.orig
    text = str(orig) if orig is not None else str(exc)
    message = f"{type(orig).__name__ if orig is not None else 'database error'}: {text}"
    sqlstate = getattr(orig, "sqlstate", None)
    diag = getattr(orig, "diag", None)
    if sqlstate is not None:  # psycopg
        if sqlstate == APPEND_ONLY_SQLSTATE:
            return AppendOnlyViolation(text)
        if sqlstate == _EXCLUSION_VIOLATION and getattr(diag, "constraint_name", None):
            return ConstraintRefused(message, diag.constraint_name, sqlstate)  # type: ignore[union-attr]
        if sqlstate == _DEADLOCK_DETECTED:
            return Deadlock(message)
        if sqlstate == _LOCK_NOT_AVAILABLE:
            return LockNotAvailable(message)
        return StoreError(message)
    if getattr(orig, "sqlite_errorname", None) == "SQLITE_CONSTRAINT_TRIGGER":
        rule = _SQLITE_TRIGGERS.get(orig.args[0] if orig is not None and orig.args else "")
        if rule == "append_only":
            return AppendOnlyViolation(text)
        if rule == TEXT_WINDOW_CONSTRAINT:
            return ConstraintRefused(message, rule)
    return StoreError(message)


SQLITE_WAL = "atmostonce.sqlite_wal"
"""The key, in a pooled SQLite connection's ``info``, that the store's connect listener sets to whether
``journal_mode=WAL`` took: only then does an outcome's transaction commit under ``synchronous = NORMAL``
(:meth:`Executor._sqlite_lowered`). In a rollback journal ``NORMAL`` risks the file itself on a power loss."""

SQLITE_LOWERED = "atmostonce.sqlite_lowered"
"""The key, in a pooled SQLite connection's ``info``, marking a connection that may still be at
``synchronous = NORMAL`` (:meth:`Executor._sqlite_lowered`); :func:`sqlite_checkout` never hands one out."""


def sqlite_checkout(dbapi_conn: Any, record: Any, _proxy: Any) -> None:
    """The pool's ``checkout`` listener on SQLite engines: a connection still marked :data:`SQLITE_LOWERED` (an
    outcome's transaction was interrupted before its connection was set back) is set to ``synchronous = FULL``
    before use, or, if that fails, dropped (``DisconnectionError``: the pool connects afresh). An interrupt or a
    cancellation meanwhile is raised as it is, the mark kept for the next checkout."""
    if record.info.get(SQLITE_LOWERED):
        try:
            dbapi_conn.execute("PRAGMA synchronous = FULL")
        except Exception as exc:
            raise sa.exc.DisconnectionError("a SQLite connection could not be set back to synchronous = FULL") from exc
        record.info.pop(SQLITE_LOWERED, None)


DURABLE_COMMITS_SQL = (
    "SELECT set_config('synchronous_commit', 'on', false) WHERE current_setting('synchronous_commit') = 'off'"
)
"""Run on each new PostgreSQL connection of a store: a server, database or role default of
``synchronous_commit = off`` is raised to ``on`` for the session, so the authorization before the bytes
waits for the disk whatever the server's defaults (docs/design.md#two-durable-points-per-send). Any other
setting (``local``, ``remote_write``, ``remote_apply``, ``on``) is left as it is: each already waits for the
local disk. The outcome moves still turn the wait off, each for its own transaction."""


def durable_commits(dbapi_conn: Any, _record: Any = None) -> None:
    """The ``connect`` listener that runs :data:`DURABLE_COMMITS_SQL` (committed, so it outlives the
    transaction a non-autocommit connection opens for it)."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(DURABLE_COMMITS_SQL)
    finally:
        cur.close()
    dbapi_conn.commit()


GENERIC_PLANS_SQL = (
    "SELECT set_config('plan_cache_mode', 'force_generic_plan', false), set_config('enable_seqscan', 'off', false), "
    "set_config('jit', 'off', false)"
)
"""Run on each new connection of a store's autocommit pool (PostgreSQL). That pool sends the statements of one
intent (the moves, their diagnosis, the creating statement, the read by key), each finding its row by key. Their
generic plan reads the row through the primary key: the key is unique, while a state, token or lease compared
with a parameter proves no partial index's predicate and promises the planner no fewer rows. PostgreSQL's
default for a prepared statement's first five runs is a custom plan, made with the values; with a backlog the
last ANALYZE did not see, the statistics call the queue's partial index nearly empty, and a custom plan of a
``begin`` scanned all of it for the one key (tens of milliseconds behind 200,000 queued intents, on every new
connection). The generic plan is also made once per connection instead of five times.

A generic plan is kept until something invalidates it (an ANALYZE of a table it reads), so it must not depend on
a table's size when it was made. Made while the text claims looked empty, the authorizing statements' plan read
``aom_text_claims`` sequentially; every send adds a claim, so each authorization then read all of them, until
the next automatic ANALYZE (in ``tests/bench/ab_publish.py``, 0.7 ms against 0.45 ms for that statement).
Every statement of this pool finds its rows by key or through the index its guard was written for, so the pool
also turns sequential scans off (``enable_seqscan``): a table with an index is read through it whatever its
statistics said; a table without one (the one-row meta table) is still read as it must be.

That scan is priced at PostgreSQL's disable cost (10^10), above every JIT threshold, so the pool also turns JIT
off (``jit``): a plan with such a scan was compiled anew on each run, half a second of server CPU for a one-row
statement (``tests/test_pg_session_no_jit.py``). These statements touch a row or a few; compiling never pays."""


def generic_plans(dbapi_conn: Any, _record: Any = None) -> None:
    """The ``connect`` listener of a store's autocommit pool that runs :data:`GENERIC_PLANS_SQL` (committed,
    so it holds for the session)."""
    cur = dbapi_conn.cursor()
    try:
        cur.execute(GENERIC_PLANS_SQL)
    finally:
        cur.close()
    dbapi_conn.commit()


class Executor:
    """Connections, transactions and the driver-level sends of one store."""

    def __init__(self, engine: Engine, on_connect: Callable[[Connection], None] | None = None):
        self.engine = engine
        self.dialect = engine.dialect.name
        self.on_connect = on_connect
        """Run on every checked-out connection before its first statement (the HA timeline check)."""
        if self.dialect == "postgresql":  # a pool of connections that stay in autocommit: no toggling per checkout
            size = engine.pool.size() if hasattr(engine.pool, "size") else 5
            self.autocommit: Engine = sa.create_engine(
                engine.url, isolation_level="AUTOCOMMIT", pool_size=size, max_overflow=size
            )
            for e in (engine, self.autocommit):  # an engine made elsewhere than make_engine gets it too
                if not sa.event.contains(e, "connect", durable_commits):
                    sa.event.listen(e, "connect", durable_commits)
            sa.event.listen(self.autocommit, "connect", generic_plans)
        else:
            self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    def dispose(self) -> None:
        self.engine.dispose()
        if self.autocommit is not self.engine and isinstance(self.autocommit, Engine):
            self.autocommit.dispose()

    @contextlib.contextmanager
    def tx(self, autocommit: bool = False, lossable: bool = False) -> Iterator[Connection]:
        """A transaction (or, with ``autocommit``, a connection for one self-contained statement);
        driver errors are mapped by :func:`driver_error`. With ``lossable`` the transaction commits without
        waiting for the disk (docs/design.md#two-durable-points-per-send): on PostgreSQL under
        ``SET LOCAL synchronous_commit = off``, on SQLite under ``PRAGMA synchronous = NORMAL``, which SQLite
        only takes outside a transaction, so it is set before ``BEGIN`` and set back to ``FULL`` after the
        commit or rollback."""
        try:
            if autocommit:
                with self.autocommit.connect() as conn:
                    if self.on_connect is not None:
                        self.on_connect(conn)
                    yield conn
                return
            with self.engine.connect() as conn:
                if self.on_connect is not None:
                    self.on_connect(conn)
                if lossable and self.dialect == "sqlite":
                    with self._sqlite_lowered(conn):
                        with conn.begin():
                            yield conn
                    return
                with conn.begin():
                    if lossable and self.dialect == "postgresql":
                        conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
                    yield conn
        except sa.exc.DBAPIError as exc:
            if self.dialect == "postgresql" and self._lost_connection(exc):
                # the server went away (a failover, a restart): every pooled connection is to the old server, so
                # all are dropped and the next operation connects afresh (libpq finds the primary again). The
                # move this was is an unknown outcome to the caller: it re-reads, and never repeats a send.
                self.dispose()
            raise driver_error(exc) from exc

    @staticmethod
    @contextlib.contextmanager
    def _sqlite_lowered(conn: Connection) -> Iterator[None]:
        """SQLite: ``PRAGMA synchronous = NORMAL`` for the transaction opened inside, ``FULL`` again after it
        (committed or rolled back), on a connection whose journal reads back as WAL (:data:`SQLITE_WAL`; any
        other journal keeps ``FULL``). The pooled connection is marked (:data:`SQLITE_LOWERED`) before it is
        lowered and unmarked only once it is ``FULL`` again: one that cannot be set back (an error, a
        cancellation, an interrupt at any point) is invalidated, and a marked one is set back or dropped
        before the pool hands it out again (:func:`sqlite_checkout`). So no other transaction commits on it
        without syncing the WAL. A failure to lower surfaces as ``DBAPIError`` (:meth:`tx` maps it)."""
        info = conn.connection.info
        if not info.get(SQLITE_WAL):
            yield
            return
        raw: Any = conn.connection.dbapi_connection
        info[SQLITE_LOWERED] = True
        try:
            try:
                raw.execute("PRAGMA synchronous = NORMAL")
            except Exception as exc:
                raise sa.exc.DBAPIError.instance("PRAGMA synchronous = NORMAL", None, exc, type(exc)) from exc
            yield
        finally:
            try:
                raw.execute("PRAGMA synchronous = FULL")
                info.pop(SQLITE_LOWERED, None)
            except Exception:
                # still lowered (a COMMIT that failed left SQLite's transaction open, the connection broke):
                # never used again; what the transaction itself did or raised stands
                conn.invalidate()
            except BaseException:
                # interrupted or cancelled: never used again (if even this is interrupted, the mark stays and
                # the next checkout sets it back or drops it)
                conn.invalidate()
                raise

    def _lost_connection(self, exc: sa.exc.DBAPIError) -> bool:
        if exc.connection_invalidated:
            return True
        try:
            return bool(exc.orig is not None and self.engine.dialect.is_disconnect(exc.orig, None, None))  # type: ignore[arg-type]  # a DBAPI error
        except Exception:  # noqa: BLE001 - a dialect that cannot tell: keep the pool
            return False

    # -- compiled statements ---------------------------------------------------------------
    def compiled(self, stmts: dict[str, Any], name: Any) -> tuple[Any, str, dict[str, Any]]:
        """A cached statement (``name``, or ``(list name, index)``) compiled once: the compiled object, its SQL
        and its bind processors."""
        key = f"{name!r}.compiled"
        compiled = stmts.get(key)
        if compiled is None:
            stmt = stmts[name] if isinstance(name, str) else stmts[name[0]][name[1]]
            dialect = self.engine.dialect
            c = stmt.compile(dialect=dialect)
            processors = {}
            for bind_name, bind in c.binds.items():
                proc = bind.type.dialect_impl(dialect).bind_processor(dialect)
                if proc is not None:
                    processors[bind_name] = proc
            compiled = stmts[key] = (c, c.string, processors)
        return compiled

    def native(self, stmts: dict[str, Any], name: str) -> tuple[str, tuple[str, ...]]:
        """The compiled statement in PostgreSQL's own ``$n`` placeholders, with the parameter names in
        order: psycopg's ``RawCursor`` sends it as it is, without parsing the query on every call (its
        parse cache skips statements over 4 kB, and the authorizing statement is longer)."""
        native = stmts.get(f"{name}.native")
        if native is None:
            _, sql, _ = self.compiled(stmts, name)
            order: dict[str, int] = {}

            def number(m: re.Match[str]) -> str:
                return f"${order.setdefault(m.group(1), len(order) + 1)}"

            text = re.sub(r"%\(([^)]+)\)s", number, sql).replace("%%", "%")
            native = stmts[f"{name}.native"] = (text, tuple(order))
        return native

    def arguments(self, stmts: dict[str, Any], name: Any) -> Callable[[Mapping[str, Any]], list[Any]]:
        """The arguments of a cached statement from its parameters, in its placeholders' order (PostgreSQL:
        the ``$n`` of :meth:`native`; SQLite: the compiled ``?``), without building every bind's value on every
        call. A bind the caller passes is its bind processor's output of the
        caller's value (``None`` stays ``None``); any other bind (a constant of the statement: an event name, a
        state, the epoch's row name) is its value as compiled, processed once. The function returned raises
        ``InvalidRequestError`` when a required parameter is missing."""
        plan = stmts.get(f"{name}.arguments")
        if plan is None:
            plan = stmts[f"{name}.arguments"] = _binder(self._parts(stmts, name), _processed)
        return plan

    def _parts(self, stmts: dict[str, Any], name: Any) -> tuple[tuple[str, Any, Any, bool], ...]:
        """Each bind of a cached statement in its placeholders' order: its name, its bind processor, its value as
        compiled and processed (the statement's constants; a required bind's is ``None``), whether it is
        required."""
        parts = stmts.get(f"{name}.parts")
        if parts is None:
            c, _, processors = self.compiled(stmts, name)
            order = self.native(stmts, name)[1] if self.dialect == "postgresql" else tuple(c.positiontup or ())
            fixed = c.construct_params(_check=False)
            parts = stmts[f"{name}.parts"] = tuple(
                (k, processors.get(k), _processed(processors.get(k), fixed.get(k)), c.binds[k].required) for k in order
            )
        return parts

    def send(self, raw: Any, stmts: dict[str, Any], name: str, params: Mapping[str, Any]) -> Any:
        """Send a cached statement on the psycopg connection ``raw``; returns the open cursor."""
        import psycopg

        sql, _ = self.native(stmts, name)
        cur = psycopg.RawCursor(raw)
        cur.execute(sql, self.arguments(stmts, name)(params), prepare=True)
        return cur

    def _encoder(self, stmts: dict[str, Any], name: str) -> Callable[[Mapping[str, Any]], list[bytes | None]]:
        """The function that turns a cached statement's parameters into the text-format values the server
        parses, in its ``$n`` order: the constants of the statement encoded once, a passed value by its
        Python type (``str``, ``int``, ``float``, ``bool``, psycopg's ``Json``/``Jsonb``, as SQLAlchemy's bind
        processors leave them); any other type through psycopg's own dumper for it."""
        enc = stmts.get(f"{name}.encoder")
        if enc is None:
            parts = tuple(
                (k, proc, _text_value(value), required) for k, proc, value, required in self._parts(stmts, name)
            )
            enc = stmts[f"{name}.encoder"] = _binder(parts, _encoded)
        return enc

    def _param_types(self, stmts: dict[str, Any], name: str) -> list[int]:
        """The type OIDs a cached statement is prepared with, in its ``$n`` order, from its binds' SQLAlchemy
        types (as psycopg would send them): booleans, numbers and JSON typed; a string left to the server
        (``unknown``: the statement's cast or its context types it, as psycopg sends a ``str``)."""
        c, _, _ = self.compiled(stmts, name)
        _, order = self.native(stmts, name)
        out = []
        for k in order:
            t = c.binds[k].type
            if isinstance(t, sa.types.NullType) and c.binds[k].value is not None:
                t = sa.literal(c.binds[k].value).type
            impl = t.dialect_impl(self.engine.dialect)
            out.append(next((oid for kind, oid in _OIDS if isinstance(impl, kind)), 0))
        return out

    def _query(
        self, raw: Any, stmts: dict[str, Any], name: str, params: Mapping[str, Any]
    ) -> tuple[list[str], list[tuple[Any, ...]]]:
        """Run a cached statement on the psycopg connection ``raw``, in autocommit (the statement is its own
        transaction) and outside a pipeline, as a prepared statement of its own name, prepared on first use
        per connection: one round trip, values sent as text and rows loaded by psycopg's adapters. Returns the column names and the rows. Raises
        psycopg's exception for the server's error (by SQLSTATE, as its cursors do). A statement the server
        no longer holds as prepared (``DEALLOCATE``, ``DISCARD ALL``, a cached plan whose result type changed)
        did not run: it is prepared again and sent once more.

        psycopg's cursors parse, dump and track every query on each call; this keeps that work per
        statement instead (docs/performance.md: client CPU per call)."""
        import psycopg
        from psycopg import generators, pq

        sql, _ = self.native(stmts, name)
        pname = stmts.get(f"{name}.pname")
        if pname is None:
            pname = stmts[f"{name}.pname"] = b"aom_" + hashlib.sha1(sql.encode()).hexdigest()[:20].encode()
        values = self._encoder(stmts, name)(params)
        pgconn = raw.pgconn
        prepared = _PREPARED.get(raw)
        if prepared is None:
            prepared = _PREPARED[raw] = {}
        for retry in (False, True):
            with raw.lock:
                if pname not in prepared:
                    pgconn.send_prepare(pname, sql.encode(), param_types=self._param_types(stmts, name))
                    for res in raw.wait(generators.execute(pgconn)):
                        if res.status == pq.ExecStatus.FATAL_ERROR:
                            exc = psycopg.errors.error_from_result(res, encoding=raw.info.encoding)
                            # already prepared on this session (an interrupt lost the note of it): the name is
                            # the SQL's digest, so it is this statement, with these types
                            if exc.sqlstate != _DUPLICATE_PREPARED:
                                raise exc
                    prepared[pname] = None
                pgconn.send_query_prepared(pname, values)
                res = raw.wait(generators.execute(pgconn))[-1]
            if res.status != pq.ExecStatus.FATAL_ERROR:
                break
            exc = psycopg.errors.error_from_result(res, encoding=raw.info.encoding)
            if exc.sqlstate not in _STALE_PREPARED or retry:
                raise exc
            # the server no longer holds the statement as prepared (or the statement raised that code itself):
            # either way its transaction, the statement alone, rolled back, so it is prepared again (if the
            # server still has it, that is found above) and sent once more
            prepared.pop(pname, None)
            if exc.sqlstate != _NO_SUCH_PREPARED:
                with raw.lock:
                    pgconn.send_query(b"DEALLOCATE " + pname)
                    raw.wait(generators.execute(pgconn))
        names = stmts.get(f"{name}.columns")
        if names is None:  # the RETURNING list is fixed per statement
            names = stmts[f"{name}.columns"] = [res.fname(i).decode() for i in range(res.nfields)]
        tx = prepared.get(pname)
        if tx is not None:
            tx.set_pgresult(res, set_loaders=False)
        elif all(res.ftype(i) in _SESSION_FREE for i in range(res.nfields)):
            # the first run since it was prepared: its columns' loaders are looked up once
            tx = prepared[pname] = psycopg.adapt.Transformer(_Loading(raw.adapters))
            tx.set_pgresult(res)
        else:  # a date or time, or a type of the application's: loaded as the session reads it, each run
            tx = psycopg.adapt.Transformer(raw)
            tx.set_pgresult(res)
        rows = tx.load_rows(0, res.ntuples, tuple)
        tx.set_pgresult(None, set_loaders=False)  # the result is not kept until the next run
        return names, rows

    def run(
        self, conn: Connection, stmts: dict[str, Any], name: str, params: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        """PostgreSQL: run a cached statement through psycopg directly on ``conn`` (:meth:`_query`). Returns
        the first row as a mapping, or ``None``. Driver errors surface as ``DBAPIError`` (:meth:`tx` maps them)."""
        rows = self.run_all(conn, stmts, name, params)
        return rows[0] if rows else None

    def run_all(
        self, conn: Connection, stmts: dict[str, Any], name: str, params: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        """PostgreSQL: :meth:`run`, returning every row (as mappings, in the statement's order)."""
        raw: Any = conn.connection.dbapi_connection
        try:
            if raw.autocommit and raw.pgconn.parameter_status(b"client_encoding") == b"UTF8":  # _query sends UTF-8
                names, rows = self._query(raw, stmts, name, params)
            else:  # inside a transaction psycopg's cursor opens it (BEGIN); it also encodes for the connection
                cur = self.send(raw, stmts, name, params)
                try:
                    names = [d.name for d in cur.description]
                    rows = cur.fetchall()
                finally:
                    cur.close()
        except Exception as exc:
            if raw.broken or raw.closed:  # sent past SQLAlchemy: tell its pool the connection is gone
                conn.invalidate()
            raise sa.exc.DBAPIError.instance(self.compiled(stmts, name)[1], dict(params), exc, type(exc)) from exc
        return [dict(zip(names, row, strict=True)) for row in rows]

    @staticmethod
    def _named(stmts: dict[str, Any], name: str, cur: Any, row: Any) -> dict[str, Any]:
        names = stmts.get(f"{name}.columns")
        if names is None:  # the RETURNING list is fixed per statement
            names = stmts[f"{name}.columns"] = [d.name for d in cur.description]
        return dict(zip(names, row, strict=True))

    def run_sqlite(
        self, conn: Connection, stmts: dict[str, Any], name: Any, params: Mapping[str, Any], fetch: bool = True
    ) -> dict[str, Any] | None:
        """SQLite: run a cached statement (``name``, or ``("appends", i)``) on the sqlite3 connection under
        ``conn``'s transaction. Returns the first row as a mapping (values as SQLite holds them), or ``None``.
        Driver errors surface as ``DBAPIError``."""
        _, sql, _ = self.compiled(stmts, name)
        try:
            raw: Any = conn.connection.dbapi_connection
            cur = raw.execute(sql, self.arguments(stmts, name)(params))
        except Exception as exc:
            raise sa.exc.DBAPIError.instance(sql, dict(params), exc, type(exc)) from exc
        try:
            if not fetch:
                return None
            row = cur.fetchone()
            return None if row is None else dict(zip([d[0] for d in cur.description], row, strict=True))
        finally:
            cur.close()

    def pipeline(self, conn: Connection, lossable: bool, body: Callable[[Pipeline], None]) -> list[dict[str, Any]]:
        """PostgreSQL: ``BEGIN``, what ``body`` queues on the :class:`Pipeline`, and ``COMMIT``, sent through
        psycopg's pipeline on the autocommit connection ``conn`` (with ``lossable``, the transaction commits
        with ``synchronous_commit = off``). Every queued move fails when it moved no row, which aborts the
        transaction, so the COMMIT applies every move or none. Returns the moved rows in order; raises
        :class:`MoveRefused` when a move moved no row (the transaction rolled back). When the server no longer
        holds one of psycopg's prepared statements (SQLSTATE 26000: a ``DISCARD ALL`` psycopg did not see),
        nothing was written, and ``body`` runs once more, on statements psycopg prepares anew."""
        import psycopg

        raw: Any = conn.connection.dbapi_connection
        for retry in (False, True):
            pipe = Pipeline(self, raw)
            try:
                first: psycopg.Error | None = None  # what failed inside the block: the cause, not the abort after it
                try:
                    with raw.pipeline():
                        try:
                            # never prepared: psycopg prepares a statement it has run five times, and a Parse queued
                            # after a refused move is skipped by the aborted pipeline while psycopg keeps its name,
                            # so every later COMMIT on the connection would fail with "prepared statement does not
                            # exist"
                            raw.execute("BEGIN", prepare=False)
                            if lossable:
                                raw.execute("SET LOCAL synchronous_commit = off", prepare=False)
                            body(pipe)
                            raw.execute("COMMIT", prepare=False)
                        except psycopg.Error as exc:
                            # left by the block, the pipeline would end with psycopg logging "pipeline aborted" as
                            # a warning; kept here, its exit raises that abort, which the cause below replaces
                            first = exc
                except psycopg.Error as exc:
                    raise first or exc from None
                if first is not None:
                    raise first
                return pipe.rows()
            except psycopg.Error as exc:
                with contextlib.suppress(psycopg.Error):
                    raw.execute("ROLLBACK", prepare=False)  # psycopg forgets its prepared statements on it
                if getattr(exc, "sqlstate", None) == REFUSED_SQLSTATE:
                    raise MoveRefused(exc.diag.message_detail) from exc
                if raw.broken or raw.closed:  # the connection is gone: the pool must not hand it out again
                    conn.invalidate()
                elif getattr(exc, "sqlstate", None) == _NO_SUCH_PREPARED and not retry:
                    # psycopg's prepared statement was dropped on the server (a DISCARD ALL it did not see): the
                    # transaction rolled back, nothing was written, and psycopg prepares its statements anew
                    continue
                raise sa.exc.DBAPIError.instance("pipelined moves", None, exc, type(exc)) from exc
        raise AssertionError("unreachable: the second attempt returns or raises")


class Pipeline:
    """The moves queued in one pipelined transaction (:meth:`Executor.pipeline`)."""

    def __init__(self, executor: Executor, raw: Any):
        self._executor, self._raw = executor, raw
        self._queued: list[tuple[Any, dict[str, Any]]] = []
        self._rows: list[dict[str, Any]] = []

    def send(self, stmts: dict[str, Any], name: str, params: Mapping[str, Any]) -> None:
        """Queue a cached statement (a move's ``strict`` form); its row is read by :meth:`rows`."""
        self._queued.append((self._executor.send(self._raw, stmts, name, params), stmts))

    def rows(self) -> list[dict[str, Any]]:
        """The rows of every move queued so far (waiting for the ones not read yet: one round trip)."""
        for cur, stmts in self._queued[len(self._rows) :]:
            row = cur.fetchone()
            self._rows.append(self._executor._named(stmts, "strict", cur, row))
            cur.close()
        return list(self._rows)
