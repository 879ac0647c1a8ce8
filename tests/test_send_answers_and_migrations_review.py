"""Adversarial review of the "whatever a transport answers is recorded" round (storable_send_result, the
Reconciler's unkeepable-id check, FunctionTransport's exception text, the migration locks, the shielded async
store operations, check_async_transport and the projection's absent-on-both-sides rule).

Each test names the behaviour it protects; its docstring says what broke when it was written."""

from __future__ import annotations

import asyncio
import multiprocessing
import smtplib
import threading

import pytest

from atmostonce.projection import compare
from atmostonce.records import MAX_TEXT_CHARS, exception_reason, storable_reason, usable_remote_id
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, storable_send_result
from atmostonce.transport import Capabilities, Found, NotSent, Sent, Unknown, WireRequest
from tests.helpers import submit
from tests.test_transport_answers import Answering

# --------------------------------------------------------------------------------------------------------------
# 1. storable_send_result / Dispatcher._send: never raise after the send, never record a weaker outcome


class _Unprintable:
    """An SDK object whose repr raises (a lazy proxy whose connection is gone)."""

    def __repr__(self):
        raise RuntimeError("repr needs the connection")

    __str__ = __repr__


RAISING_AFTER_SEND = {
    # an int id with more digits than int->str converts by default (sys.get_int_max_str_digits)
    "sent-int-id-beyond-str-limit": Sent(10**5000),
    # an id object whose repr raises: the refusal message repr()s it
    "sent-id-whose-repr-raises": Sent(_Unprintable()),
    # an outcome name the table does not have
    "unknown-with-unknown-outcome-name": Unknown("timeout", outcome="send.timeout"),
    # a not-sent answer naming the success outcome: recorded with record_success(reason=...)
    "not-sent-naming-the-success-outcome": NotSent("refused", outcome="send.success"),
}


@pytest.mark.parametrize("answer", list(RAISING_AFTER_SEND.values()), ids=list(RAISING_AFTER_SEND))
def test_a_send_answer_is_recorded_as_unknown_whatever_its_fields(any_store, answer):
    """``storable_send_result`` promises "never raises: after the bytes left, the outcome must be recorded", but
    it passes ``outcome`` through unchecked and calls ``str()`` / ``repr()`` on the id unguarded: each of these
    answers raised out of ``Dispatcher.dispatch`` after the send (ValueError, RuntimeError, KeyError,
    TypeError) and left the attempt ``authorized`` with no outcome recorded, to wait out its send lease."""
    store = any_store.store
    it = submit(store)
    transport = Answering(answer)
    try:
        outcome = Dispatcher(store, transport).dispatch(it.key)
    except Exception as exc:  # noqa: BLE001 - the failure under test
        pytest.fail(f"dispatch raised after the send: {type(exc).__name__}: {str(exc)[:120]}")
    assert transport.sends == 1
    assert outcome == "send.unknown"
    assert store.get(it.key).state == "indeterminate"


def test_an_unknown_answer_is_never_recorded_as_not_sent(any_store):
    """An :class:`Unknown` whose ``outcome`` field names ``send.not_sent`` (a transport that built its result
    from a classification row, as the email transport does, with a row mixed up) was recorded with
    ``record_not_sent``: the intent went to ``failed`` and is retried, a possible duplicate send of an
    unknown outcome. ``storable_send_result`` must hold each result class to its own outcome (an Unknown is
    unknown), or refuse to weaken it."""
    store = any_store.store
    it = submit(store)
    outcome = Dispatcher(store, Answering(Unknown("read timeout", outcome="send.not_sent"))).dispatch(it.key)
    assert outcome == "send.unknown"
    assert store.get(it.key).state == "indeterminate"


def test_storable_send_result_never_raises_for_a_bad_id():
    """The function the Dispatcher relies on, directly: an id beyond int->str's digit limit and an id whose
    repr raises both escaped as exceptions (ValueError, RuntimeError)."""
    for answer in (Sent(10**5000), Sent(_Unprintable())):
        try:
            got = storable_send_result(answer)
        except Exception as exc:  # noqa: BLE001 - the failure under test
            pytest.fail(f"storable_send_result raised {type(exc).__name__}")
        assert isinstance(got, Unknown)
        assert got.reason.strip() and len(got.reason) <= MAX_TEXT_CHARS


def test_usable_remote_id_answers_none_for_an_int_it_cannot_render():
    """``usable_remote_id`` is documented to answer ``None`` for an id the store cannot keep; an int of more
    than 4,300 digits raised ValueError from ``str()`` instead."""
    try:
        got = usable_remote_id(10**5000)
    except ValueError:
        pytest.fail("usable_remote_id raised ValueError for a very long int")
    assert got is None


def test_fitted_reasons_and_exception_text_hold_the_store_rules():
    """What held: every fitted reason passes the store's own text rule (no NUL, no lone surrogate, at most
    MAX_TEXT_CHARS), including a cut that lands inside an escape, and an exception whose ``__str__`` raises or
    returns a non-string is described by its class."""
    from atmostonce.records import check_text

    for raw in ("\x00" * 5000, "\udcff" * 2000, "a" * (MAX_TEXT_CHARS - 2) + "\x00", "\ud800x" * 3000):
        fitted = storable_reason(raw)
        assert check_text("reason", fitted) == fitted and len(fitted) <= MAX_TEXT_CHARS

    class Raises(Exception):
        def __str__(self):
            raise KeyError("no message")

    class NotAString(Exception):
        def __str__(self):
            return 42  # type: ignore[return-value]

    assert exception_reason(Raises()) == "Raises: (its message could not be rendered)"
    assert exception_reason(NotAString()) == "NotAString: (its message could not be rendered)"


# --------------------------------------------------------------------------------------------------------------
# 1b. The Reconciler: an object found under an id the store cannot keep


class LookingUp:
    """A transport whose send is unknown and whose key lookup answers ``found[delivery_key]``."""

    name, protocol_version = "hand-lookup", 1
    capabilities = Capabilities(read_back=False, lookup_by_key=True)

    def __init__(self):
        self.found: dict[str, object] = {}

    def send(self, request):
        return Unknown("read timeout")

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        return self.found[delivery_key]

    def read_back(self, remote_id):  # pragma: no cover - not a capability
        raise AssertionError("no read-back")

    def matches(self, request, found):
        return True

    def close(self):
        pass


def test_a_lookup_naming_an_int_id_is_recorded_or_counted_as_a_lookup_error(any_store):
    """A lookup answering ``Found(42)`` (an SDK's numeric id; FunctionTransport passes a ``Found`` its lookup
    callable returns straight through): the Reconciler's new check asks ``usable_remote_id(42)``, which says
    usable ("42"), but the int itself goes to ``reconcile_many``, whose store refuses it (IntakeError:
    remote_id must be a string), and the whole ``Reconciler.run`` raised (the service's reconcile pass fails on
    it every round). It should record "42" (as the Dispatcher does for a Sent) or count a lookup error."""
    store = any_store.store
    it = submit(store)
    transport = LookingUp()
    assert Dispatcher(store, transport).dispatch(it.key) == "send.unknown"
    transport.found[it.key] = Found(42, None)  # type: ignore[arg-type]
    rec = Reconciler(store, transport, RuntimeConfig(first_look_after=0))
    try:
        out = rec.run()
    except Exception as exc:  # noqa: BLE001 - the failure under test
        pytest.fail(f"Reconciler.run raised {type(exc).__name__}: {exc}")
    after = store.get(it.key)
    if out.get("lookup.found"):
        assert after.state == "published" and after.remote_id == "42"
    else:
        assert out == {"lookup.error": 1} and after.state == "indeterminate"


def test_one_int_id_in_a_reconcile_batch_does_not_lose_the_others(any_store):
    """Three unknown sends (three accounts), looked up in one pass: the first and third found under good ids,
    the second under an int id. ``Reconciler.run`` raised IntakeError from the batch write, so neither the
    first nor the third intent's proof of publication was recorded: one odd answer holds every unknown of the
    batch unsettled, on every pass."""
    store = any_store.store
    transport = LookingUp()
    keys = []
    for i, found in enumerate([Found("obj-1", None), Found(7, None), Found("obj-3", None)]):
        it = submit(store, account=f"acct-{i}", target=f"t{i}")
        assert Dispatcher(store, transport).dispatch(it.key) == "send.unknown"
        transport.found[it.key] = found
        keys.append(it.key)
    try:
        Reconciler(store, transport, RuntimeConfig(first_look_after=0)).run()
    except Exception:  # noqa: BLE001 - reported by the assertion below
        pass
    assert [store.get(k).state for k in (keys[0], keys[2])] == ["published", "published"]


def test_a_lookup_naming_an_unkeepable_id_is_a_lookup_error(any_store):
    """What held: an id too long, with a NUL, or beyond int->str's limit is a lookup error, nothing written."""
    store = any_store.store
    transport = LookingUp()
    keys = []
    for i, bad in enumerate(["9" * (MAX_TEXT_CHARS + 1), "id\x00", 10**5000]):
        it = submit(store, account=f"acct-{i}", target=f"t{i}")  # one unknown per account: the gate
        assert Dispatcher(store, transport).dispatch(it.key) == "send.unknown"
        transport.found[it.key] = Found(bad, None)  # type: ignore[arg-type]
        keys.append(it.key)
    out = Reconciler(store, transport, RuntimeConfig(first_look_after=0)).run()
    assert out == {"lookup.error": 3}
    assert [store.get(k).state for k in keys] == ["indeterminate"] * 3


# --------------------------------------------------------------------------------------------------------------
# 2. FunctionTransport


class _DictBackedSmtpError(smtplib.SMTPDataError):
    """An SDK error whose fields live in a payload dict (``__getattr__`` indexes it, raising KeyError)."""

    def __init__(self, payload):
        Exception.__init__(self, "smtp failure")
        self.payload = payload

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return self.payload[name]


def test_function_transport_classifies_an_exception_whose_attribute_lookup_raises():
    """``FunctionTransport.send`` "never raises for an Exception the callable raised": a row with an
    ``attribute`` (``SMTPDataError.smtp_code``) reads it with ``getattr(exc, name, None)``, which only absorbs
    AttributeError; an SDK error whose ``__getattr__`` raises KeyError made ``send`` raise out of the
    transport instead of answering unknown."""
    from atmostonce_function import FunctionTransport

    def send(request):
        raise _DictBackedSmtpError({})

    t = FunctionTransport(send)
    try:
        got = t.send(_wire({"text": "hi"}))
    except KeyError:
        pytest.fail("FunctionTransport.send raised the classifier's KeyError")
    assert isinstance(got, Unknown)


def test_function_transport_describes_an_unprintable_exception_by_its_class():
    """What held: an exception whose ``__str__`` raises, and one with a 1 MB message, become an unknown whose
    reason is storable and starts with the row that decided."""
    from atmostonce.records import check_text
    from atmostonce_function import FunctionTransport

    class Weird(Exception):
        def __str__(self):
            raise RuntimeError("boom")

    for exc in (Weird(), RuntimeError("x\x00" * 500_000)):

        def send(request, exc=exc):
            raise exc

        got = FunctionTransport(send).send(_wire({"text": "hi"}))
        assert isinstance(got, Unknown) and got.reason.startswith("default: ")
        assert check_text("reason", got.reason) == got.reason


def _wire(body, action="create"):
    return WireRequest(body=body, delivery_key="dk", action=action)


# --------------------------------------------------------------------------------------------------------------
# 6. The projection: a field absent from both sides


def test_a_projection_none_of_whose_fields_the_request_carries_confirms_nothing():
    """A projection ``{/text: /text}`` over a request that carries none of its fields (``{"message": ...}``: a
    request of another shape than the projection was written for). Since "absent from both sides counts as
    equal", ``compare`` matched ANY object that also lacks ``/text``, an empty object or an error body
    included, so a read-back or a key lookup confirms an object that holds nothing of what was approved.
    Before the change it was a mismatch. A comparison in which no projected field was compared must not
    confirm."""
    approved = {"message": "wire 5,000 EUR to account 1"}
    projection = (("/text", "/text"),)
    for platform_object in ({}, {"error": "not found"}, {"message": "something else entirely"}):
        assert compare(approved, platform_object, projection).match is False, platform_object


def test_a_pointer_that_does_not_resolve_in_a_mis_shaped_request_is_not_absent():
    """The request carries ``to`` as a string where the projection expects a list of recipients
    (``/to/0/address``): the pointer does not resolve in the request, nor in an object whose recipients list
    is empty, and the pair was skipped as "optional, carried by neither"; with the subject equal the object
    was confirmed though it names no recipient and the request did. A pointer whose parent the request
    carries is not an absent optional field."""
    approved = {"subject": "invoice", "to": "bob@example.com"}
    projection = (("/subject", "/subject"), ("/to/0/address", "/recipients/0/address"))
    assert compare(approved, {"subject": "invoice", "recipients": []}, projection).match is False


def test_a_read_back_of_an_empty_object_does_not_publish_a_send(any_store):
    """End to end: a FunctionTransport whose projection the request does not carry (``/text`` over a
    ``{"message": ...}`` body) and a platform whose read-back answers an empty object for the id. The
    Dispatcher recorded ``read_back.match`` and the intent went to ``published`` (before the change it was
    ``read_back.differs``)."""
    from atmostonce_function import FunctionTransport

    store = any_store.store
    it = store.submit("acct", "post", "room-1", {"message": "hello"})
    transport = FunctionTransport(
        lambda request: {"id": "p-1"}, read_back=lambda remote_id: {"id": remote_id}, projection={"/text": "/text"}
    )
    assert Dispatcher(store, transport).dispatch(it.key) == "read_back.differs"
    assert store.get(it.key).state != "published"


def test_the_absent_on_both_sides_rule_keeps_null_and_present_fields_strict():
    """What held: null against absent, absent against null, a value against absent, and array elements all
    still differ; an optional field absent from both sides while another is equal still confirms."""
    projection = (("/text", "/text"), ("/link", "/link"))
    assert compare({"text": "a"}, {"text": "a"}, projection).match is True
    assert compare({"text": "a", "link": None}, {"text": "a"}, projection).field == "/link"
    assert compare({"text": "a"}, {"text": "a", "link": None}, projection).field == "/link"
    assert compare({"text": "a"}, {"text": "a", "link": "x"}, projection).field == "/link"
    tags = (("/text", "/text"), ("/tags/0", "/tags/0"))
    assert compare({"text": "a", "tags": []}, {"text": "a", "tags": ["x"]}, tags).field == "/tags/0"


# --------------------------------------------------------------------------------------------------------------
# 5. check_async_transport


class _AsyncBase:
    name, protocol_version = "async-hand", 1
    capabilities = Capabilities(read_back=False, lookup_by_key=False)

    def matches(self, request, found):
        return False

    async def aclose(self):
        pass


class _AsyncCallable:
    async def __call__(self, request):
        return Sent("obj-1")


class CallableObjectSend(_AsyncBase):
    """``send`` an instance with ``async def __call__`` (a per-route client object)."""

    def __init__(self):
        self.send = _AsyncCallable()


def _traced(fn):
    """A sync decorator that returns the wrapped coroutine (tracing / metrics wrappers are often written so)."""
    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        return fn(*args, **kwargs)

    return wrapper


class DecoratedSend(_AsyncBase):
    @_traced
    async def send(self, request):
        return Sent("obj-1")


@pytest.mark.parametrize("cls", [CallableObjectSend, DecoratedSend], ids=["callable-object", "sync-decorator"])
def test_open_async_takes_a_send_that_returns_an_awaitable(cls):
    """``AsyncTransport.send`` is typed ``-> Awaitable[SendResult]`` and ThreadedTransport only awaits what it
    returns, but ``check_async_transport`` asks ``inspect.iscoroutinefunction``: a callable object with an
    ``async def __call__`` and an ``async def`` under a plain ``functools.wraps`` decorator were refused with
    TypeError ("not a coroutine function") though both work."""
    import atmostonce

    try:
        atmostonce.open_async("memory://", transport=cls())
    except TypeError as exc:
        pytest.fail(f"a working async transport was refused: {exc}")


class AsyncMatches(_AsyncBase):
    """An async transport whose author made ``matches`` a coroutine too (it answers False: nothing matches)."""

    capabilities = Capabilities(read_back=True, lookup_by_key=False)

    async def send(self, request):
        return Sent("obj-1")

    async def read_back(self, remote_id):
        return Found(remote_id, {"text": "NOT what was approved"})

    async def matches(self, request, found):  # type: ignore[override]
        return False


def test_open_async_refuses_a_transport_whose_matches_is_a_coroutine_function():
    """``check_async_transport`` refuses sync ``send``/``read_back``/``lookup`` but accepts an ``async def
    matches``, which the runtime calls synchronously (``ThreadedTransport.matches`` returns the coroutine
    object, which is truthy): every read-back then "matches". See the end-to-end test below."""
    import atmostonce

    with pytest.raises(TypeError):
        atmostonce.open_async("memory://", transport=AsyncMatches())


def test_an_async_matches_never_publishes_an_object_that_differs():
    """End to end on the memory store: an async transport whose ``async def matches`` answers False and whose
    read-back shows another text; the send was recorded ``published`` (``read_back.match``), a confirmation of
    an object that does not hold what was approved. It must be refused at ``open_async`` or never confirm."""
    import atmostonce

    async def scenario():
        try:
            outbox = atmostonce.open_async("memory://", transport=AsyncMatches(), workers=1)
        except TypeError:
            return None  # refused up front: safe
        async with outbox:
            it = await outbox.submit("acct", "post", "room-1", {"text": "approved text"})
            await outbox.run(until_idle=True, timeout=30)
            return (await outbox.get(it.key)).state

    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # "coroutine ... was never awaited"
        state = asyncio.run(scenario())
    assert state != "published"


def test_check_async_transport_takes_the_common_async_shapes():
    """What held: ``functools.partial`` of an ``async def``, an ``AsyncMock``, and a ``__getattr__`` proxy over
    an async transport are accepted; a synchronous transport (FunctionTransport) is refused."""
    import functools
    from unittest.mock import AsyncMock

    from atmostonce.aio import check_async_transport
    from atmostonce_function import FunctionTransport

    async def send(request):
        return Sent("x")

    class Partial(_AsyncBase):
        def __init__(self):
            self.send = functools.partial(send)

    class Mocked(_AsyncBase):
        def __init__(self):
            self.send = AsyncMock(return_value=Sent("x"))

    class Proxy:
        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            return getattr(self._inner, name)

    for t in (Partial(), Mocked(), Proxy(Partial())):
        check_async_transport(t)
    with pytest.raises(TypeError):
        check_async_transport(FunctionTransport(lambda r: "1"))


# --------------------------------------------------------------------------------------------------------------
# 3. Migration locks


def _open_new_sqlite(path: str, q) -> None:  # runs in a forked child
    from atmostonce_sql import open_store

    open_store(f"sqlite:///{path}").close()
    q.put("opened")


def test_a_process_forked_while_a_thread_migrates_can_still_open_a_new_database(tmp_path):
    """``MIGRATION_LOCK`` is a plain ``threading.Lock`` with no fork handler: a process forked (multiprocessing's
    default start method on Linux) while another thread of the parent is migrating inherits it held, and no
    thread in the child will ever release it. The child's ``open_store`` of any database not yet at the head
    revision then blocks for ever (before this round there was no process-wide lock). Here a helper thread
    holds the lock as a migration does while the parent forks."""
    from atmostonce_sql.migrate import MIGRATION_LOCK

    held, release = threading.Event(), threading.Event()

    def migrating():
        with MIGRATION_LOCK:
            held.set()
            release.wait(60)

    t = threading.Thread(target=migrating)
    t.start()
    held.wait(10)
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    child = ctx.Process(target=_open_new_sqlite, args=(str(tmp_path / "child.sqlite3"), q))
    try:
        child.start()
    finally:
        release.set()
        t.join(10)
    child.join(10)  # bounded: a deadlocked child never ends
    alive = child.is_alive()
    if alive:
        child.kill()
        child.join()
    assert not alive, "the forked child deadlocked on the inherited MIGRATION_LOCK"
    assert child.exitcode == 0 and q.get(timeout=5) == "opened"


@pytest.mark.postgres
def test_a_waiting_postgresql_migration_does_not_stall_other_databases(request, tmp_path):
    """One database's migration waits for its PostgreSQL advisory lock (another process is migrating it, or a
    session holds the lock). The process-wide ``MIGRATION_LOCK`` is held across that wait, so an open of an
    unrelated new SQLite database in another thread of the same process waited too, for as long as the
    PostgreSQL lock is held (no timeout). The advisory lock is per database; the process lock is only there
    for Alembic's globals and need not be held while waiting for another database."""
    import psycopg

    from atmostonce_sql import open_store
    from atmostonce_sql.migrate import MIGRATION_LOCK_KEY
    from tests.helpers import empty_database_url

    url, cleanup = empty_database_url(request, "postgresql", tmp_path)
    libpq = url.replace("postgresql+psycopg://", "postgresql://", 1)
    errors: list[BaseException] = []
    try:
        with psycopg.connect(libpq, autocommit=True) as admin:
            admin.execute("SELECT pg_advisory_lock(%s)", (MIGRATION_LOCK_KEY,))

            def pg_open():
                try:
                    open_store(url).close()
                except BaseException as exc:  # noqa: BLE001
                    errors.append(exc)

            pg = threading.Thread(target=pg_open)
            pg.start()
            try:
                key = MIGRATION_LOCK_KEY
                for _ in range(600):  # until the PostgreSQL open waits on the advisory lock
                    (n,) = admin.execute(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = %s",
                        (key & 0xFFFFFFFF,),
                    ).fetchone()
                    if n:
                        break
                    threading.Event().wait(0.05)
                sqlite_done = threading.Event()

                def sqlite_open():
                    open_store(f"sqlite:///{tmp_path / 'other.sqlite3'}").close()
                    sqlite_done.set()

                other = threading.Thread(target=sqlite_open, daemon=True)
                other.start()
                finished = sqlite_done.wait(10)
            finally:
                admin.execute("SELECT pg_advisory_unlock(%s)", (MIGRATION_LOCK_KEY,))
                pg.join(60)
                other.join(60)
        assert errors == []
        assert finished, "an unrelated SQLite open waited on another database's PostgreSQL migration lock"
    finally:
        if cleanup is not None:
            cleanup()


def test_async_opens_cancelled_at_every_point_leave_the_lock_free_and_the_file_openable(tmp_path):
    """What held: opens of new SQLite files cancelled at 0..50 ms (each runs to its end behind its cancelled
    caller, and the store it made is closed) leave the file openable at the head revision and, once every open
    has ended, ``MIGRATION_LOCK`` free; an exception inside the migration (SchemaNewer) releases it too; a sync
    open in a thread and async opens on the loop, together, all succeed."""
    from atmostonce_sql import open_store
    from atmostonce_sql.aio import open_async_store
    from atmostonce_sql.migrate import MIGRATION_LOCK

    async def scenario():
        for i, delay in enumerate((0, 0.001, 0.003, 0.01, 0.03, 0.05)):
            url = f"sqlite:///{tmp_path / f'c{i}.sqlite3'}"
            task = asyncio.create_task(open_async_store(url))
            await asyncio.sleep(delay)
            task.cancel()
            (res,) = await asyncio.gather(task, return_exceptions=True)
            if not isinstance(res, BaseException):
                await res.aclose()
            store = await open_async_store(url)  # waits for a cancelled open still migrating, then opens
            assert await store.list_intents() == []
            await store.aclose()
        urls = [f"sqlite:///{tmp_path / f'm{i}.sqlite3'}" for i in range(6)]
        sync = asyncio.to_thread(lambda: [open_store(u).close() for u in urls[:3]])
        stores = await asyncio.gather(sync, *(open_async_store(u) for u in urls[3:]))
        for s in stores[1:]:
            await s.aclose()
        assert not MIGRATION_LOCK.locked()

    asyncio.run(scenario())


# --------------------------------------------------------------------------------------------------------------
# 4. AsyncSqlStore._finish


def test_cancelled_callers_of_failing_operations_leave_no_unretrieved_exception(tmp_path):
    """What held: store operations that raise (UnknownIntent) with their callers cancelled at once report
    nothing to the loop's exception handler (no "exception was never retrieved"), ``quiesce`` returns, and a
    cancelled submit storm leaves every intent all-or-nothing."""
    from atmostonce_sql.aio import open_async_store

    async def scenario():
        loop = asyncio.get_running_loop()
        seen: list[dict] = []
        loop.set_exception_handler(lambda _loop, ctx: seen.append(ctx))
        store = await open_async_store(f"sqlite:///{tmp_path / 'q.sqlite3'}", pool_size=2)
        try:
            tasks = [asyncio.create_task(store.get(f"missing-{i}")) for i in range(20)]
            tasks += [asyncio.create_task(store.submit("acct", "post", f"t{i}", {"text": "hi"})) for i in range(20)]
            await asyncio.sleep(0)
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            await store.quiesce()
            assert not store._inflight
            for it in await store.list_intents(limit=100):
                assert len(await store.history(it.key)) == 1
        finally:
            await store.aclose()
        import gc

        gc.collect()
        await asyncio.sleep(0)
        return seen

    assert asyncio.run(scenario()) == []


def test_an_operation_after_aclose_does_not_reopen_the_closed_store(tmp_path):
    """``aclose()`` quiesces and disposes of the engines, but nothing marks the store closed: a ``submit``
    awaited after ``aclose`` returned (a late task of the application) ran, wrote, and left a new pooled
    connection open on the disposed engine that nothing will close (for SQLite an open file handle and an
    aiosqlite thread). Pre-existing in kind, but ``aclose`` now promises the store is quiet: an operation after
    it should be refused (or at least leave nothing open)."""
    from atmostonce_sql.aio import open_async_store

    async def scenario():
        store = await open_async_store(f"sqlite:///{tmp_path / 'closed.sqlite3'}", pool_size=2)
        await store.aclose()
        try:
            await store.submit("acct", "post", "late", {"text": "hi"})
        except Exception:  # noqa: BLE001 - a refusal is the fix
            return 0
        left = store.engine.sync_engine.pool.checkedin()
        await store.engine.dispose()  # the test's own cleanup
        return left

    assert asyncio.run(scenario()) == 0
