"""Native asyncio SQL stores (docs/design.md#asyncio-the-async-outbox-and-stores): PostgreSQL through psycopg 3's
async connection (``postgresql+psycopg://`` on SQLAlchemy's ``create_async_engine``) and SQLite through aiosqlite
(``sqlite+aiosqlite://``).

No second copy of the SQL or of the operations: an :class:`AsyncSqlStore` holds an ordinary
:class:`~atmostonce_sql.store.SqlStore` built on the async engine's ``sync_engine``, and runs each of its
operations inside a greenlet (SQLAlchemy's ``greenlet_spawn``, what ``AsyncConnection.run_sync`` does), so
every statement the sync store sends is awaited on the async driver and the event loop is never blocked. Same
table, same guards, same statements (``atmostonce_sql.statements``), same SQLSTATE map
(``atmostonce_sql.execution.driver_error``).

What the sync store sends past SQLAlchemy, on the DBAPI connection directly, is adapted here
(:class:`AsyncExecutor`): the PostgreSQL statements sent by psycopg's ``RawCursor`` go through SQLAlchemy's
execution on the async connection, and the pipelined moves (``BEGIN``, each move, ``COMMIT`` in one round trip)
become the same transaction sent statement by statement, each move still refused by ``aom_moved``
(SQLSTATE ``AOM01``) when it moved no row, so the commit applies every move or none.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable, Coroutine, Mapping
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.util import greenlet_spawn

from atmostonce.errors import StoreError

from . import normalize_url, open_on, split_ha_mode, sqlite_session
from .execution import (
    REFUSED_SQLSTATE,
    Executor,
    MoveRefused,
    Pipeline,
    durable_commits,
    generic_plans,
    sqlite_checkout,
)
from .store import SqlStore

__all__ = [
    "AsyncExecutor",
    "AsyncSqlStore",
    "BlockingStore",
    "async_url",
    "make_async_engine",
    "open_async_store",
]

_T = TypeVar("_T")


def async_url(url: str) -> str:
    """The async driver's URL: ``sqlite:///`` -> ``sqlite+aiosqlite:///``, ``postgres(ql)://`` ->
    ``postgresql+psycopg://`` (``create_async_engine`` picks psycopg's async connection). ``ValueError`` for a
    URL with a synchronous driver named (``sqlite+pysqlite``, ``postgresql+psycopg2``) or another database."""
    if not isinstance(url, str) or not url.strip():
        raise ValueError("a database URL is required (sqlite:///path or postgresql://...)")
    for sync, native in (("sqlite:///", "sqlite+aiosqlite:///"), ("sqlite+pysqlite:///", "sqlite+aiosqlite:///")):
        if url.startswith(sync):
            return native + url[len(sync) :]
    url = normalize_url(url)
    if url.startswith(("sqlite+aiosqlite:///", "postgresql+psycopg://", "postgresql+psycopg_async://")):
        return url
    raise ValueError(f"no async store for {url!r}: use sqlite:///path or postgresql://...")


def make_async_engine(url: str, *, pool_size: int = 8) -> AsyncEngine:
    """:func:`atmostonce_sql.make_engine`'s configuration on the async drivers: SQLite in WAL with
    ``BEGIN IMMEDIATE`` transactions, PostgreSQL pooled."""
    url = async_url(url)
    try:
        sa.engine.make_url(url)
    except sa.exc.ArgumentError as exc:
        raise ValueError(f"malformed database URL {url!r}: {exc}") from exc
    if url.startswith("sqlite"):
        engine = create_async_engine(url, connect_args={"timeout": 30})

        sa.event.listen(engine.sync_engine, "connect", sqlite_session)
        sa.event.listen(engine.sync_engine, "checkout", sqlite_checkout)

        @sa.event.listens_for(engine.sync_engine, "begin")
        def _on_begin(conn: Connection) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    engine = create_async_engine(url, pool_size=pool_size, max_overflow=pool_size, pool_pre_ping=False)
    sa.event.listen(engine.sync_engine, "connect", durable_commits)  # from the first connection on
    return engine


class AsyncExecutor(Executor):
    """The driver layer of a store on an async engine's ``sync_engine`` (every call inside a greenlet): the
    statements the sync :class:`Executor` sends on the raw psycopg or sqlite3 connection go through
    SQLAlchemy's execution on the async driver instead (same compiled statements, same parameters)."""

    def __init__(self, engine: Engine, on_connect: Callable[[Connection], None] | None = None):
        if on_connect is not None:
            raise ValueError("the async stores have no HA mode (open the synchronous store with ha=)")
        self.engine = engine
        self.dialect = engine.dialect.name
        self.on_connect = None
        if self.dialect == "postgresql":  # autocommit connections of their own, on the async driver too
            size = engine.pool.size() if hasattr(engine.pool, "size") else 5
            self._autocommit_async = create_async_engine(
                engine.url, isolation_level="AUTOCOMMIT", pool_size=size, max_overflow=size
            )
            self.autocommit: Engine = self._autocommit_async.sync_engine
            for e in (engine, self.autocommit):
                if not sa.event.contains(e, "connect", durable_commits):
                    sa.event.listen(e, "connect", durable_commits)
            sa.event.listen(self.autocommit, "connect", generic_plans)
        else:
            self.autocommit = engine.execution_options(isolation_level="AUTOCOMMIT")

    def run(
        self, conn: Connection, stmts: dict[str, Any], name: str, params: Mapping[str, Any]
    ) -> dict[str, Any] | None:
        row = conn.execute(stmts[name], dict(params)).mappings().first()
        return None if row is None else dict(row)

    def run_all(
        self, conn: Connection, stmts: dict[str, Any], name: str, params: Mapping[str, Any]
    ) -> list[dict[str, Any]]:
        return [dict(row) for row in conn.execute(stmts[name], dict(params)).mappings()]

    def run_sqlite(
        self, conn: Connection, stmts: dict[str, Any], name: Any, params: Mapping[str, Any], fetch: bool = True
    ) -> dict[str, Any] | None:
        stmt = stmts[name] if isinstance(name, str) else stmts[name[0]][name[1]]
        result = conn.execute(stmt, dict(params))
        if not fetch or not result.returns_rows:
            result.close()
            return None
        row = result.mappings().first()
        return None if row is None else dict(row)

    def pipeline(self, conn: Connection, lossable: bool, body: Callable[[Pipeline], None]) -> list[dict[str, Any]]:
        """The pipelined transaction sent statement by statement on the autocommit connection ``conn``:
        ``BEGIN``, (``SET LOCAL synchronous_commit = off``), each move as ``body`` queues it, ``COMMIT``; a move
        that moved no row raises ``AOM01`` in the database, the transaction is rolled back and
        :class:`MoveRefused` raised, as :meth:`Executor.pipeline` does."""
        pipe = _SentPipeline(self, conn)
        try:
            conn.exec_driver_sql("BEGIN")
            if lossable:
                conn.exec_driver_sql("SET LOCAL synchronous_commit = off")
            body(pipe)
            conn.exec_driver_sql("COMMIT")
            return pipe.rows()
        except sa.exc.DBAPIError as exc:
            if not exc.connection_invalidated:
                with contextlib.suppress(sa.exc.DBAPIError):
                    conn.exec_driver_sql("ROLLBACK")
            orig = exc.orig
            if getattr(orig, "sqlstate", None) == REFUSED_SQLSTATE:
                raise MoveRefused(orig.diag.message_detail) from exc  # type: ignore[union-attr]  # psycopg's
            raise
        except BaseException:  # a cancelled task, a failed argument: roll back here (the pool's reset on return
            try:  # would too: psycopg's rollback asks the server whether a transaction is open)
                conn.exec_driver_sql("ROLLBACK")
            except BaseException:
                conn.invalidate()  # the pool must not hand out a connection inside a transaction
            raise


class _SentPipeline(Pipeline):
    """:class:`Pipeline`'s interface over statements sent one by one (each row read when it is sent)."""

    def __init__(self, executor: AsyncExecutor, conn: Connection):
        super().__init__(executor, None)
        self._conn = conn

    def send(self, stmts: dict[str, Any], name: str, params: Mapping[str, Any]) -> None:
        row = self._conn.execute(stmts[name], dict(params)).mappings().first()
        if row is None:  # aom_moved raises first; an empty answer is no move either
            raise StoreError(f"pipelined move {name!r} returned no row")
        self._rows.append(dict(row))

    def rows(self) -> list[dict[str, Any]]:
        return list(self._rows)


class _GreenStore:
    """Marks a SqlStore class whose executor is :class:`AsyncExecutor` (see :func:`green_class`)."""


_GREEN: dict[type[SqlStore], type[SqlStore]] = {}


def green_class(store_class: type[SqlStore]) -> type[SqlStore]:
    """``store_class`` with :class:`AsyncExecutor` as its driver layer (one subclass per class, cached)."""
    if issubclass(store_class, _GreenStore):
        return store_class
    made = _GREEN.get(store_class)
    if made is None:
        made = _GREEN[store_class] = type(
            f"Async{store_class.__name__}", (_GreenStore, store_class), {"_executor_class": AsyncExecutor}
        )
    return made


class AsyncSqlStore:
    """A SQL store for asyncio: every operation of :class:`~atmostonce_sql.store.SqlStore` (``submit``,
    ``apply``, ``get``, ``find``, ``due_leases``, ...) as a coroutine with the same arguments, results and
    exceptions, run on the async driver (see the module). Attributes that are not operations (``table``,
    ``dialect``, ...) are the store's. Open one with :func:`open_async_store` (or :meth:`open`);
    ``await store.aclose()`` disposes of its engines. ``store.sync`` is the store underneath: its calls work only
    inside :meth:`call` (outside a greenlet the async driver refuses them)."""

    def __init__(self, sync: SqlStore, engine: AsyncEngine):
        self.sync, self.engine = sync, engine
        self._inflight: set[asyncio.Future[Any]] = set()
        self._closed = False

    async def _finish(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn`` in a greenlet to its end even when the awaiting task is cancelled: the caller gets its
        ``CancelledError`` at once, and the operation commits or rolls back and gives its connection back to the
        pool clean. A cancellation delivered inside the driver's own await would leave a transaction open on a
        pooled connection: on SQLite its write lock then held every other writer for the busy timeout (30 s). So
        a cancelled write is all or nothing, as an uncancelled one is; :meth:`aclose` waits for those still
        running."""
        if self._closed:  # a late task of the application: its connection would outlive the disposed engine
            raise StoreError("this async store is closed (aclose): open another one")
        task: asyncio.Future[_T] = asyncio.ensure_future(greenlet_spawn(fn, *args, **kwargs))
        self._inflight.add(task)
        task.add_done_callback(_settled)
        task.add_done_callback(self._inflight.discard)
        return await asyncio.shield(task)

    @classmethod
    async def open(
        cls,
        engine: AsyncEngine,
        url: str = "",
        *,
        migrate: bool = True,
        check_sequences: bool = True,
        create: bool = True,
        store_class: type[SqlStore] = SqlStore,
        **kw: Any,
    ) -> AsyncSqlStore:
        """Build the store on ``engine`` (``store_class``'s constructor runs on the async driver too):
        :func:`atmostonce_sql.open_store`'s migrations and checks, and its errors."""
        sync = await greenlet_spawn(
            open_on, engine.sync_engine, url, migrate, check_sequences, create, green_class(store_class), **kw
        )
        return cls(sync, engine)

    async def call(self, fn: Callable[..., _T], *args: Any, **kwargs: Any) -> _T:
        """Run ``fn(*args, **kwargs)``, synchronous code over ``self.sync``, on the async driver."""
        return await self._finish(fn, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.sync, name)
        if name.startswith("_") or not callable(attr):
            return attr

        async def operation(*args: Any, **kwargs: Any) -> Any:
            return await self._finish(attr, *args, **kwargs)

        operation.__name__ = operation.__qualname__ = name
        operation.__doc__ = attr.__doc__
        return operation

    async def quiesce(self) -> None:
        """Return once every operation started on this store has finished, those whose callers were cancelled
        included (their writes are then committed or rolled back, their connections back in the pool)."""
        while self._inflight:
            await asyncio.wait(set(self._inflight))

    async def aclose(self) -> None:
        """:meth:`quiesce`, then dispose of the store's engines (its own autocommit engine, then ``engine``).
        Idempotent; an operation awaited after it raises ``StoreError``."""
        if self._closed:
            return
        self._closed = True
        await self.quiesce()
        await greenlet_spawn(self.sync.close)
        await self.engine.dispose()

    async def __aenter__(self) -> AsyncSqlStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


def _settled(task: asyncio.Future[Any]) -> None:
    """Mark the outcome of an operation whose caller may be gone as seen (its caller, if any, re-raises it)."""
    if not task.cancelled():
        task.exception()


async def open_async_store(
    url: str,
    *,
    migrate: bool = True,
    pool_size: int = 8,
    check_sequences: bool = True,
    create: bool = True,
    store_class: type[SqlStore] = SqlStore,
    **kw: Any,
) -> AsyncSqlStore:
    """:func:`atmostonce_sql.open_store` on the async drivers (``atmostonce.open_async_store`` resolves here
    for ``sqlite`` and ``postgresql`` URLs): the same options and errors (``ValueError`` for a bad URL or an HA
    mode, which the async stores do not have; ``SequenceBehind``; ``StoreError``). Cancelled, the opening (its
    migration's transaction included) still runs to its end, and the store it opened is closed: a migration cut
    inside the driver's await would leave its transaction, and on SQLite the write lock, open."""
    url, ha = split_ha_mode(url)
    if ha is not None or kw.get("ha") is not None:
        raise ValueError("the async stores have no HA mode (open the synchronous store with ha=)")
    engine = make_async_engine(url, pool_size=pool_size)

    async def opening() -> AsyncSqlStore:
        try:
            return await AsyncSqlStore.open(
                engine,
                url,
                migrate=migrate,
                check_sequences=check_sequences,
                create=create,
                store_class=store_class,
                **kw,
            )
        except BaseException:
            await engine.dispose()
            raise

    task = asyncio.ensure_future(opening())
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        _CLOSING.add(task)
        task.add_done_callback(_close_unwanted)
        raise


_CLOSING: set[asyncio.Future[Any]] = set()
"""Opens whose callers were cancelled, and the closes of the stores they opened (kept until they end)."""


def _close_unwanted(task: asyncio.Future[AsyncSqlStore]) -> None:
    """Close the store an open whose caller was cancelled made (its failure is seen and dropped)."""
    _CLOSING.discard(task)
    if task.cancelled() or task.exception() is not None:
        return
    closing = asyncio.ensure_future(task.result().aclose())
    _CLOSING.add(closing)
    closing.add_done_callback(_CLOSING.discard)
    closing.add_done_callback(_settled)


class BlockingStore:
    """A synchronous facade over an :class:`AsyncSqlStore` for synchronous callers (the stateful machine,
    threads): a private event loop in a daemon thread runs each operation; the caller waits for it. Not for use
    on an event loop's thread. :meth:`close` closes the async store, then stops the loop."""

    def __init__(self, opener: Callable[[], Coroutine[Any, Any, AsyncSqlStore]]):
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="atmostonce-async-store", daemon=True)
        self._thread.start()
        try:
            self.inner: AsyncSqlStore = self.wait(opener())
        except BaseException:
            self._stop()
            raise

    def wait(self, coro: Coroutine[Any, Any, _T]) -> _T:
        """Run ``coro`` on the private loop and return its result (or raise its exception)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def operation(*args: Any, **kwargs: Any) -> Any:
            return self.wait(attr(*args, **kwargs))

        operation.__name__ = name
        return operation

    def close(self) -> None:
        if self._thread.is_alive():
            try:
                self.wait(self.inner.aclose())
            finally:
                self._stop()

    def _stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()
