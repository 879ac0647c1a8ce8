"""The outbox for asyncio programs (docs/design.md#asyncio-the-async-outbox-and-stores).

``atmostonce.open_async(url, transport=...)`` returns an :class:`AsyncOutbox` over an
:class:`~atmostonce.transport.AsyncTransport` (``atmostonce_http.AsyncHttpTransport``)::

    async with atmostonce.open_async("sqlite:///outbox.sqlite3", transport=my_async_transport) as outbox:
        await outbox.submit("my-account", "post", "room-42", {"text": "hello"})  # idempotent
        await outbox.run(until_idle=True)

**The store is native, the service threaded.** For a URL whose scheme has a native asyncio store
(``sqlite://``, ``postgresql://``: :func:`atmostonce.open_async_store`, ``atmostonce_sql.AsyncSqlStore``) the
store is opened and every store operation awaited on the caller's event loop: :meth:`AsyncOutbox.submit` and
:meth:`AsyncOutbox.get` directly, the service's through :class:`LoopStore`. The service itself (dispatch
workers, sweeper, reconciler) is still the synchronous :class:`~atmostonce.service.Outbox` in worker threads
(``asyncio.to_thread``); each of its store calls and platform calls is a coroutine run on the loop
(:class:`LoopStore`, :class:`ThreadedTransport`) that the worker thread waits on. A scheme with no async store
(``memory://``, a sync-only plugin) keeps its synchronous store, called from the worker threads. Every write
is still the runtime's, under the table's guards.

Cancellation: cancelling :meth:`AsyncOutbox.run` stops the service (no new key is taken) and cancels the
sends in flight. A send cancelled after authorization may already have written its bytes: it is recorded
``unknown`` (:func:`~atmostonce.transport.cancelled_send`), never ``not sent``, and reconciliation or a person
settles it. ``run`` then re-raises the ``CancelledError``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import threading
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

from .errors import AtMostOnceError
from .plugins import async_store_factory, open_store, resolve_url
from .protocols import OutboxStore
from .records import Intent
from .service import Outbox, OutboxReport
from .transport import (
    AsyncTransport,
    Capabilities,
    Found,
    LookupResult,
    ReadBackResult,
    SendResult,
    WireRequest,
    cancelled_send,
)

__all__ = ["AsyncOutbox", "LoopStore", "ThreadedTransport", "TransportCancelled", "open_async"]

_T = TypeVar("_T")


class TransportCancelled(AtMostOnceError):
    """A read-back or lookup whose task was cancelled: no answer, so no evidence (nothing is written on it)."""


class ThreadedTransport:
    """A synchronous :class:`~atmostonce.transport.Transport` over an :class:`AsyncTransport`, for the
    runtime's worker threads: each call runs the coroutine on ``loop`` and waits for it. It must not be called
    on ``loop``'s own thread (that would wait on itself).

    A send whose task is cancelled (by :meth:`cancel_in_flight`, or on the loop) returns
    :func:`~atmostonce.transport.cancelled_send`: unknown, never not sent. A cancelled read-back or lookup
    raises :class:`TransportCancelled`. Other attributes (``compare``, ``contract_version``) are the async
    transport's. :meth:`close` does nothing: the async transport is closed on its loop (``aclose``).
    """

    def __init__(self, transport: AsyncTransport, loop: asyncio.AbstractEventLoop):
        self.inner, self.loop = transport, loop
        self.name: str = transport.name
        self.protocol_version: int = transport.protocol_version
        self.capabilities: Capabilities = transport.capabilities
        self._lock = threading.Lock()
        self._in_flight: set[concurrent.futures.Future[Any]] = set()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _wait(self, awaitable: Awaitable[_T]) -> _T:
        async def call() -> _T:
            with self._lock:  # wait until the call is registered: cancel_in_flight must see it once it runs
                pass
            return await awaitable

        with self._lock:
            fut = asyncio.run_coroutine_threadsafe(call(), self.loop)
            self._in_flight.add(fut)
        try:
            return fut.result()
        finally:
            with self._lock:
                self._in_flight.discard(fut)

    def send(self, request: WireRequest) -> SendResult:
        try:
            return self._wait(self.inner.send(request))
        except concurrent.futures.CancelledError:
            return cancelled_send(request.idempotency_key)

    def read_back(self, remote_id: str) -> ReadBackResult:
        try:
            return self._wait(self.inner.read_back(remote_id))
        except concurrent.futures.CancelledError as exc:
            raise TransportCancelled(f"read-back of {remote_id} was cancelled") from exc

    def lookup(self, delivery_key: str, resend_epoch: int = 0, fence_epoch: int = 0) -> LookupResult:
        try:
            return self._wait(self.inner.lookup(delivery_key, resend_epoch, fence_epoch))
        except concurrent.futures.CancelledError as exc:
            raise TransportCancelled(f"lookup of {delivery_key} was cancelled") from exc

    def matches(self, request: WireRequest, found: Found) -> bool:
        return self.inner.matches(request, found)

    def cancel_in_flight(self) -> int:
        """Cancel every platform call in flight (from any thread); returns how many were cancelled."""
        with self._lock:
            pending = list(self._in_flight)
        return sum(1 for fut in pending if fut.cancel())

    def close(self) -> None:
        pass


class LoopStore:
    """A synchronous store over a native asyncio store (every operation a coroutine,
    ``atmostonce_sql.AsyncSqlStore``), for the service's worker threads: each operation runs on ``loop`` and the
    calling thread waits for its result or its exception. Store calls are never cancelled from here: a worker
    that recorded an authorization always gets to record its outcome. Calling it on ``loop``'s own thread
    raises ``RuntimeError`` (it would wait on itself: await the async store there). Attributes that are not
    operations are the async store's. :meth:`close` does nothing: the async store is closed on its loop
    (``aclose``)."""

    def __init__(self, store: Any, loop: asyncio.AbstractEventLoop):
        self.inner, self.loop = store, loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        def operation(*args: Any, **kwargs: Any) -> Any:
            if _running_loop() is self.loop:
                raise RuntimeError(f"store.{name} called on the event loop: await the async store instead")
            return asyncio.run_coroutine_threadsafe(attr(*args, **kwargs), self.loop).result()

        operation.__name__ = name
        return operation

    def close(self) -> None:
        pass


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def check_async_transport(transport: Any) -> None:
    """Refuse, before any store is opened or any byte sent, a transport that is not an :class:`AsyncTransport`:
    its ``send`` and ``aclose``, and ``read_back`` / ``lookup`` when its capabilities claim them, must be
    coroutine functions (``async def``, also behind ``functools.wraps`` or ``functools.partial``, or an object
    with an ``async def __call__``), and its ``matches`` must not be one (the runtime calls it without awaiting:
    a coroutine would read as a confirmation). A synchronous transport (``FunctionTransport``, ``HttpTransport``)
    goes to :func:`atmostonce.open`; given here, its send would run and its result could not be awaited, so the
    outcome of a send that happened would be lost. Raises ``TypeError`` naming the first method at fault."""
    caps = getattr(transport, "capabilities", None)
    needed = ["send", "aclose"]
    if getattr(caps, "read_back", False):
        needed.append("read_back")
    if getattr(caps, "lookup_by_key", False):
        needed.append("lookup")
    kind = type(transport).__name__
    for name in needed:
        method = getattr(transport, name, None)
        if not _awaits(method):
            raise TypeError(
                f"open_async needs an AsyncTransport: {kind}.{name} is "
                f"{'missing' if method is None else 'not a coroutine function'} (a synchronous transport goes to "
                "atmostonce.open)"
            )
    for name in ("matches", "compare"):
        if _awaits(getattr(transport, name, None)):
            raise TypeError(f"{kind}.{name} must be a plain function: the runtime calls it without awaiting it")


def _awaits(fn: Any) -> bool:
    """Whether calling ``fn`` gives a coroutine: an ``async def`` (also unwrapped from ``functools.wraps``), or an
    object whose ``__call__`` is one."""
    if fn is None:
        return False
    if inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(inspect.unwrap(fn)):
        return True
    if inspect.isroutine(fn):
        return False
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the class's own __call__, not callable()
    return call is not None and inspect.iscoroutinefunction(call)


class AsyncOutbox:
    """The outbox service for asyncio: :class:`~atmostonce.service.Outbox` run in worker threads (see the
    module), its sends, and with a native async store its store operations, awaited on this event loop.

    Made by :func:`open_async`; use ``async with`` (or :meth:`open` and :meth:`aclose`). ``open_store_`` opens a
    synchronous store (in a thread), ``open_native`` a native async one (awaited; it is closed with
    ``aclose``); give one. ``options`` are the :class:`~atmostonce.service.Outbox`'s (``workers=``,
    ``config=``, ...). ``outbox.store`` is the store the service calls (its calls block: from a coroutine use
    :meth:`get`, or :attr:`async_store`).
    """

    def __init__(
        self,
        open_store_: Callable[[], OutboxStore] | None,
        transport: AsyncTransport,
        *,
        close_transport: bool = True,
        open_native: Callable[[], Awaitable[Any]] | None = None,
        **options: Any,
    ):
        if (open_store_ is None) == (open_native is None):
            raise ValueError("give one of open_store_ (a sync store) and open_native (an async store)")
        check_async_transport(transport)
        self._open_store, self.transport, self.close_transport = open_store_, transport, close_transport
        self._open_native = open_native
        self._options = options
        self._outbox: Outbox | None = None
        self._bridge: ThreadedTransport | None = None
        self._native: Any = None

    # -- lifecycle ----------------------------------------------------------------------------------
    async def open(self) -> AsyncOutbox:
        """Open the store (in a thread) and build the service; returns ``self``. Raises what the store's
        opening raises, ``ValueError`` for a bad option, ``RuntimeError`` when already open."""
        if self._outbox is not None:
            raise RuntimeError("this async outbox is already open")
        loop = asyncio.get_running_loop()
        store: Any
        if self._open_native is not None:
            native = await self._open_native()
            store = LoopStore(native, loop)
        else:
            assert self._open_store is not None
            native, store = None, await asyncio.to_thread(self._open_store)
        self._bridge = ThreadedTransport(self.transport, loop)
        try:
            self._outbox = Outbox(store, self._bridge, close_store=True, close_transport=False, **self._options)
        except BaseException:
            await (native.aclose() if native is not None else asyncio.to_thread(store.close))
            raise
        self._native = native
        return self

    async def aclose(self) -> None:
        """Stop gracefully (each worker finishes its dispatch), close the store, then the async transport when
        this outbox owns it. Idempotent."""
        outbox, self._outbox = self._outbox, None
        native, self._native = self._native, None
        if outbox is not None:
            await asyncio.to_thread(outbox.close)
        if native is not None:
            await native.aclose()
        if self.close_transport:
            self.close_transport = False
            await self.transport.aclose()

    async def __aenter__(self) -> AsyncOutbox:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def outbox(self) -> Outbox:
        """The synchronous service underneath (its calls block). Raises ``RuntimeError`` before :meth:`open`."""
        if self._outbox is None:
            raise RuntimeError("open the async outbox first (async with atmostonce.open_async(...))")
        return self._outbox

    @property
    def store(self) -> OutboxStore:
        """The store the service calls (for a native async store its :class:`LoopStore`: not on the loop)."""
        return self.outbox.store

    @property
    def async_store(self) -> Any:
        """The native async store (``atmostonce_sql.AsyncSqlStore``; await its operations), or ``None`` when the
        URL's scheme has none (the service then calls the synchronous :attr:`store` from its threads)."""
        self.outbox  # noqa: B018 - raises before open
        return self._native

    # -- intake and reads -----------------------------------------------------------------------------
    async def submit(
        self, account: str, action_kind: str, target: str, request: Mapping[str, Any], **options: Any
    ) -> Intent:
        """:meth:`Outbox.submit <atmostonce.service.Outbox.submit>` (idempotent, same options): awaited on the
        native async store, else in a thread."""
        outbox = self.outbox
        if self._native is not None:
            intent: Intent = await self._native.submit(account, action_kind, target, request, **options)
            return intent
        return await asyncio.to_thread(outbox.submit, account, action_kind, target, request, **options)

    async def get(self, key: str) -> Intent:
        """``store.get(key)``: awaited on the native async store, else in a thread."""
        outbox = self.outbox
        if self._native is not None:
            intent: Intent = await self._native.get(key)
            return intent
        return await asyncio.to_thread(outbox.store.get, key)

    def report(self) -> OutboxReport:
        return self.outbox.report()

    # -- running ----------------------------------------------------------------------------------------
    async def run(self, until_idle: bool = True, *, timeout: float | None = None) -> OutboxReport:
        """:meth:`Outbox.run <atmostonce.service.Outbox.run>` in a thread, awaiting its sends on this loop;
        returns its report. Cancelled: stops the service, cancels the sends in flight (each recorded unknown,
        never not sent), waits until every worker has recorded its outcome, then re-raises."""
        outbox, bridge = self.outbox, self._bridge
        assert bridge is not None
        loop = asyncio.get_running_loop()
        done = loop.run_in_executor(None, lambda: outbox.run(until_idle, timeout=timeout))
        try:
            return await asyncio.shield(done)
        except asyncio.CancelledError:
            await _wind_down(done, outbox, bridge)
            raise

    async def start(self) -> AsyncOutbox:
        """Run the service in the background (:meth:`Outbox.start <atmostonce.service.Outbox.start>`)."""
        await asyncio.to_thread(self.outbox.start)
        return self

    async def stop(self, timeout: float | None = None) -> OutboxReport:
        """Stop gracefully (:meth:`Outbox.stop <atmostonce.service.Outbox.stop>`) and return the report."""
        return await asyncio.to_thread(self.outbox.stop, timeout)


async def _wind_down(done: asyncio.Future[OutboxReport], outbox: Outbox, bridge: ThreadedTransport) -> None:
    """After ``run`` was cancelled: no new key, the sends in flight cancelled (recorded unknown by their
    workers), and wait for the service thread to end, so no authorized send is left without its outcome."""
    while not done.done():
        outbox.request_stop()  # again each round: a stop asked before the run began would be lost
        bridge.cancel_in_flight()
        await asyncio.wait({done}, timeout=0.05)


def open_async(
    url: str | None = None,
    *,
    transport: AsyncTransport,
    store_options: Mapping[str, Any] | None = None,
    **options: Any,
) -> AsyncOutbox:
    """``atmostonce.open_async``: an :class:`AsyncOutbox` over the store at ``url`` and ``transport``; the
    store is the native async one when the URL's scheme has it (:func:`atmostonce.open_async_store`, awaited on
    entering ``async with``), else the synchronous one (:func:`atmostonce.open_store`, opened in a thread);
    ``store_options`` go to either. ``options`` are the :class:`~atmostonce.service.Outbox`'s. The outbox owns
    both: leaving ``async with`` closes the store and the transport."""
    opts = dict(store_options or {})
    factory = async_store_factory(url)
    if factory is not None:
        target = resolve_url(url)
        return AsyncOutbox(None, transport, open_native=lambda: factory(target, **opts), **options)
    return AsyncOutbox(lambda: open_store(url, **opts), transport, **options)
