"""A new user's integration trial: an HTTP "orders" API of our own on loopback (no idempotency support, so a
resend shows as a second order), reached through ``FunctionTransport`` (sync) and a hand-written
``AsyncTransport``, on SQLite and on a PostgreSQL ``LocalCluster`` with fsync on.

Duplicates are counted from the orders server's own record, never from the library's counters. The first
group are the defects this trial found, each fixed: its docstring says what went wrong before.
"""

from __future__ import annotations

import asyncio
import http.client
import itertools
import json
import socket
import threading
import time
import uuid
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

import atmostonce
from atmostonce.errors import AtMostOnceError, IllegalMove, IntakeError, Rejected
from atmostonce.identity import platform_idempotency_key
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig, Sweeper
from atmostonce.transport import Capabilities, Found, NotFound, Sent
from atmostonce_function import FunctionTransport

QUICK = {"sweep_every": 0.05, "reconcile_every": 0.05, "poll_every": 0.01, "backoff_base": 0.01, "backoff_max": 0.1}
SHORT = RuntimeConfig(lease_seconds=1, send_lease_seconds=1, reconcile_interval=0.01, lookup_error_backoff=0.01)


# ----------------------------------------------------------------------------------------- the orders server
class OrdersServer:
    """POST /orders stores an order (header X-Key kept with it) and answers 201 with it; GET /orders/<id>;
    GET /orders?key=K lists the orders carrying that key. ``gate``: when set to an Event, each POST waits on it
    after storing; ``drop``: each POST stores, then drops the connection without an answer."""

    def __init__(self):
        self.lock = threading.Lock()
        self.orders: dict[str, dict] = {}
        self.ids = itertools.count(1)
        self.posts = 0
        self.gate: threading.Event | None = None
        self.stored = threading.Event()
        self.drop = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _json(self, code, obj):
                body = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except OSError:
                    pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                with server.lock:
                    server.posts += 1
                    oid = str(next(server.ids))
                    server.orders[oid] = dict(body, id=oid, key=self.headers.get("X-Key"))
                server.stored.set()
                if server.gate is not None:
                    server.gate.wait(30)
                if server.drop:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                self._json(201, server.orders[oid])

            def do_GET(self):
                url = urlparse(self.path)
                if url.path == "/orders":
                    key = parse_qs(url.query).get("key", [None])[0]
                    with server.lock:
                        return self._json(200, [o for o in server.orders.values() if o["key"] == key])
                with server.lock:
                    order = server.orders.get(url.path.rsplit("/", 1)[-1])
                self._json(200, order) if order is not None else self._json(404, {"error": "no such order"})

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.http.daemon_threads = True
        self.host, self.port = self.http.server_address
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def close(self):
        if self.gate is not None:
            self.gate.set()
        self.http.shutdown()
        self.http.server_close()

    def by_key(self, key: str) -> list[dict]:
        with self.lock:
            return [o for o in self.orders.values() if o["key"] == key]

    def duplicates(self) -> dict[str, int]:
        with self.lock:
            counts = Counter(o["key"] for o in self.orders.values())
        return {k: n for k, n in counts.items() if n > 1}


class OrdersClient:
    """My SDK for the orders API: the three callables FunctionTransport wraps. One attempt per call."""

    def __init__(self, server: OrdersServer, timeout: float = 5):
        self.server, self.timeout = server, timeout
        self.calls = 0

    def _call(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection(self.server.host, self.server.port, timeout=self.timeout)
        try:
            conn.request(method, path, body=None if body is None else json.dumps(body), headers=headers or {})
            resp = conn.getresponse()
            return resp.status, json.loads(resp.read())
        finally:
            conn.close()

    def send(self, request):
        self.calls += 1
        status, order = self._call("POST", "/orders", dict(request.body), {"X-Key": request.idempotency_key})
        if status >= 400:
            raise RuntimeError(f"orders API answered {status}")
        return order

    def read_back(self, remote_id):
        status, order = self._call("GET", f"/orders/{remote_id}")
        return None if status == 404 else order

    def lookup(self, key):
        _, found = self._call("GET", f"/orders?key={key}")
        return found[0] if found else None


def function_transport(client: OrdersClient, send=None) -> FunctionTransport:
    return FunctionTransport(
        send or client.send, read_back=client.read_back, lookup=client.lookup, name="orders", projection=PROJECTION
    )


PROJECTION = {"/sku": "/sku", "/qty": "/qty"}


class AsyncOrders:
    """My asyncio transport for the orders API (asyncio streams, HTTP/1.0); it classifies its own failures
    with FunctionTransport's table and lets a cancellation propagate, as docs/design.md asks."""

    name, protocol_version = "orders", 1
    capabilities = Capabilities(read_back=True, lookup_by_key=True)

    def __init__(self, server: OrdersServer, fail=None):
        self.server, self.fail = server, fail
        self._table = FunctionTransport(lambda r: None, name="orders", projection=PROJECTION)
        self.sends = 0
        self.closed = False

    async def _http(self, method, path, body=None, headers=None):
        reader, writer = await asyncio.open_connection(self.server.host, self.server.port)
        try:
            data = b"" if body is None else json.dumps(body).encode()
            extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
            writer.write(f"{method} {path} HTTP/1.0\r\nContent-Length: {len(data)}\r\n{extra}\r\n".encode() + data)
            await writer.drain()
            raw = await reader.read()
        finally:
            writer.close()
        if not raw:
            raise ConnectionResetError("the orders API closed the connection without an answer")
        head, _, payload = raw.partition(b"\r\n\r\n")
        return int(head.split()[1]), json.loads(payload)

    async def send(self, request):
        self.sends += 1
        try:
            _, order = await self._http("POST", "/orders", dict(request.body), {"X-Key": request.idempotency_key})
            if self.fail is not None:
                raise self.fail
            return Sent(order["id"])
        except Exception as exc:  # a CancelledError is no Exception: it propagates
            return self._table.classify(exc)

    async def read_back(self, remote_id):
        status, order = await self._http("GET", f"/orders/{remote_id}")
        return NotFound() if status == 404 else Found(remote_id, order)

    async def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        key = platform_idempotency_key(delivery_key, resend_epoch, fence_epoch)
        _, found = await self._http("GET", f"/orders?key={key}")
        return Found(found[0]["id"], found[0]) if found else NotFound()

    def matches(self, request, found):
        return self._table.matches(request, found)

    def compare(self, request, found):
        return self._table.compare(request, found)

    async def aclose(self):
        self.closed = True


# ----------------------------------------------------------------------------------------- fixtures
@pytest.fixture
def server():
    srv = OrdersServer()
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def cluster():
    from atmostonce_sql.pgserver import LocalCluster

    c = LocalCluster(fsync=True).start()  # its own folder under /tmp, reachable by the server's OS user
    yield c
    c.stop()


def _empty_pg_database(cluster) -> str:
    import psycopg

    name = "trial_" + uuid.uuid4().hex[:10]
    with psycopg.connect(cluster.dsn, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return cluster.url_for(name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def url(request, tmp_path):
    """An empty database (the library migrates it on open): a SQLite file, or a PostgreSQL database on a
    LocalCluster with fsync on."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'orders.sqlite3'}"
    return _empty_pg_database(request.getfixturevalue("cluster"))


def _migrated(url: str) -> str:
    atmostonce.open_store(url).close()
    return url


# ================================================================== defects the trial found (fixed)
class BadMessage(ConnectionResetError):
    """An SDK error whose message cannot be rendered (its __str__ raises)."""

    def __str__(self):
        raise RuntimeError("message unavailable")


@pytest.mark.parametrize(
    ("exc", "outcome", "state"),
    [
        (ConnectionRefusedError("refused: " + "x" * 5000), "send.not_sent", "failed"),
        (ConnectionRefusedError("refused\x00"), "send.not_sent", "failed"),
        (TimeoutError("timed out: " + "y" * 5000), "send.unknown", "indeterminate"),
        (ValueError("bad bytes \udcff from the SDK"), "send.unknown", "indeterminate"),
        (BadMessage(), "send.unknown", "indeterminate"),
    ],
    ids=["refused-long-message", "refused-nul", "timeout-long-message", "lone-surrogate", "unprintable"],
)
def test_a_send_exception_is_recorded_whatever_its_message(url, server, exc, outcome, state):
    """The exception's text becomes the outcome's ``reason`` fitted to what the store keeps (cut, NUL and lone
    surrogates escaped; a ``__str__`` that raises leaves the class alone). Before, the store refused such a
    reason (IntakeError field=reason) or the RuntimeError escaped ``send``, and the classified outcome was never
    recorded: a proven not-sent sat ``authorized`` until its send lease lapsed and cost lookups and a person
    instead of a retry."""
    client = OrdersClient(server)

    def send(request):
        raise exc

    with atmostonce.open_store(url) as store:
        key, got = Dispatcher(store, function_transport(client, send)).publish(
            "shop", "order", "c1", {"sku": "A", "qty": 1}
        )
        assert got == outcome
        assert store.get(key).state == state


@pytest.mark.parametrize("remote_id", ["", 42, "id\x00", "9" * 5000], ids=["empty", "int", "nul", "too-long"])
def test_a_sent_with_an_unusable_id_is_recorded(url, server, remote_id):
    """A ``Sent`` the send callable built itself with an id the store cannot keep is recorded as unknown (an
    int is kept as its decimal string), as a plain return of the same id is. Before, it was passed through,
    the store refused the id with IntakeError after the order was created, and the send went unrecorded."""
    client = OrdersClient(server)

    def send(request):
        client.send(request)
        return Sent(remote_id)

    with atmostonce.open_store(url) as store:
        key, got = Dispatcher(store, function_transport(client, send)).publish(
            "shop", "order", "c1", {"sku": "A", "qty": 1}
        )
        assert got in ("send.unknown", "read_back.match", "read_back.not_found")
        assert store.get(key).state in ("indeterminate", "published")
    assert len(server.by_key(key)) == 1


def test_open_async_refuses_a_synchronous_transport_before_any_send(tmp_path, server):
    """``open_async`` refuses a synchronous FunctionTransport (TypeError) before any byte is sent. Before, the
    worker called its send (the order was created), then failed awaiting the result; every later lookup failed
    the same way, so the intent stayed indeterminate for ever, and leaving ``async with`` raised a bare
    AttributeError ('aclose')."""
    client = OrdersClient(server)
    sync_transport = function_transport(client)
    raised: list[BaseException] = []

    async def go():
        try:
            async with atmostonce.open_async(
                f"sqlite:///{tmp_path / 'a.sqlite3'}", transport=sync_transport, config=SHORT, **QUICK
            ) as outbox:
                await outbox.submit("shop", "order", "c1", {"sku": "A", "qty": 1})
                await outbox.run(until_idle=True, timeout=3)
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            raised.append(exc)

    asyncio.run(go())
    assert client.calls == 0 and server.posts == 0
    assert [type(e) for e in raised if not isinstance(e, (TypeError, ValueError, AtMostOnceError))] == []
    assert raised, "the synchronous transport was accepted"


def _open_many_async_stores(url: str, n: int, bound: float) -> list[BaseException] | None:
    """Open ``n`` native async stores concurrently on one event loop (in a daemon thread); the exceptions
    raised, or ``None`` when the opens did not finish within ``bound`` seconds (a hang)."""
    out: list[BaseException] = []

    async def one():
        store = await atmostonce.open_async_store(url)
        await store.aclose()

    async def go():
        results = await asyncio.gather(*(one() for _ in range(n)), return_exceptions=True)
        out.extend(r for r in results if isinstance(r, BaseException))

    thread = threading.Thread(target=asyncio.run, args=(go(),), daemon=True)
    thread.start()
    thread.join(bound)
    return None if thread.is_alive() else out


@pytest.mark.postgres
@pytest.mark.parametrize("migrated", [True, False], ids=["migrated-db", "empty-db"])
def test_async_stores_open_concurrently_on_one_loop(cluster, migrated):
    """Four ``open_async_store`` calls at once on one loop all open the database. ``open_async_store`` runs
    Alembic inside a greenlet on the caller's loop, and Alembic keeps its environment in module globals; before
    the migration lock, two opens interleaved on one loop clobbered each other: on a migrated database a bare
    ``KeyError: 'config'`` leaked from Alembic, and on an empty one the two migrations waited on each other and
    the loop hung for ever."""
    url = _empty_pg_database(cluster)
    if migrated:
        _migrated(url)
    errors = _open_many_async_stores(url, 4, bound=20)
    assert errors is not None, "concurrent open_async_store calls hung"
    assert [f"{type(e).__module__}.{type(e).__name__}: {e}" for e in errors] == []


def test_the_async_outbox_reads_through_its_async_store_and_refuses_blocking_calls_on_the_loop(tmp_path, server):
    """What the README says of the async outbox's stores: ``outbox.async_store`` is awaited on the loop;
    ``outbox.store`` is the blocking store of the worker threads, and a call of it on the loop is refused
    (it would wait on itself). The README had said ``outbox.store`` was the awaitable one."""

    async def go():
        async with atmostonce.open_async(f"sqlite:///{tmp_path / 'a.sqlite3'}", transport=AsyncOrders(server)) as ob:
            it = await ob.submit("shop", "order", "c1", {"sku": "A", "qty": 1})
            state = (await ob.async_store.get(it.key)).state
            with pytest.raises(RuntimeError):
                ob.store.get(it.key)
            return state, (await asyncio.to_thread(ob.store.get, it.key)).state

    assert asyncio.run(go()) == ("pending", "pending")


# ================================================================== what holds
def test_concurrent_publishers_of_one_order_create_it_once(url, server):
    """8 threads publish the same logical order, 6 orders in turn: one order each on the server; every loser
    gets IllegalMove naming the state it found (authorized or published)."""
    client = OrdersClient(server)
    transport = function_transport(client)
    refusals: Counter[tuple] = Counter()
    outcomes: Counter[str] = Counter()
    lock = threading.Lock()
    with atmostonce.open_store(url) as store:
        keys = set()
        for order in range(6):
            barrier = threading.Barrier(8)

            def publish(i, order=order, barrier=barrier):
                barrier.wait()
                try:
                    key, out = Dispatcher(store, transport, owner=f"t{i}").publish(
                        "shop", "order", f"cust-{order}", {"sku": "Z", "qty": order}
                    )
                    with lock:
                        outcomes[out] += 1
                        keys.add(key)
                except Rejected as exc:
                    with lock:
                        refusals[(type(exc), exc.event, exc.guard, exc.state)] += 1

            threads = [threading.Thread(target=publish, args=(i,)) for i in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
        assert outcomes == {"read_back.match": 6}
        assert sum(refusals.values()) == 42
        assert {(cls, guard) for cls, _, guard, _ in refusals} == {(IllegalMove, "source_state")}
        assert {state for *_, state in refusals} <= {"authorized", "published"}
        assert {store.get(k).state for k in keys} == {"published"}
    assert server.posts == 6 and server.duplicates() == {}


def test_stored_then_dropped_connection_is_unknown_and_settled_by_lookup(url, server):
    """The server stores the order and drops the connection: unknown, never resent, found by the lookup."""
    server.drop = True
    client = OrdersClient(server)
    transport = function_transport(client)
    with atmostonce.open_store(url) as store:
        key, out = Dispatcher(store, transport, config=SHORT).publish("shop", "order", "c1", {"sku": "A", "qty": 1})
        assert out == "send.unknown" and store.get(key).state == "indeterminate"
        assert Reconciler(store, transport, SHORT).run() == {"lookup.found": 1}
        it = store.get(key)
        assert it.state == "published" and it.remote_id == server.by_key(key)[0]["id"]
    assert client.calls == 1 and server.posts == 1


def test_an_answer_slower_than_the_send_lease_is_late_evidence(url, server):
    """The server holds its answer past the send lease; the sweeper makes the send unknown meanwhile. The
    publisher gets a typed Rejected, the answer's id is kept as late evidence and the lookup settles it."""
    server.gate = threading.Event()
    client = OrdersClient(server)
    transport = function_transport(client)
    got: dict = {}
    with atmostonce.open_store(url) as store:

        def publish():
            try:
                got["ok"] = Dispatcher(store, transport, config=SHORT).publish(
                    "shop", "order", "c1", {"sku": "A", "qty": 1}
                )
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                got["error"] = exc

        thread = threading.Thread(target=publish)
        thread.start()
        assert server.stored.wait(10)
        (it,) = store.list_intents()
        while Sweeper(store, SHORT).sweep_leases()["expired"] == 0:  # wait out the 1 s send lease
            time.sleep(0.05)
        server.gate.set()
        thread.join(10)
        err = got["error"]
        assert isinstance(err, Rejected) and err.event == "record_success" and err.state == "indeterminate"
        assert [e.remote_id for e in store.evidence(it.key)] == [server.by_key(it.key)[0]["id"]]
        assert Reconciler(store, transport, SHORT).run() == {"lookup.found": 1}
        assert store.get(it.key).state == "published"
    assert server.posts == 1


def test_a_keyboard_interrupt_in_send_is_left_to_the_lease_and_settled(url, server):
    """A BaseException from send goes up unclassified (documented); the send lease turns it unknown and the
    lookup settles it: one order. The order leaves the projection's optional ``qty`` out, and the order found
    has none either: that confirms it (it had been read as a difference, and the order left for a person)."""
    client = OrdersClient(server)

    def send(request):
        client.send(request)
        raise KeyboardInterrupt

    with atmostonce.open_store(url) as store:
        with pytest.raises(KeyboardInterrupt):
            Dispatcher(store, function_transport(client, send), config=SHORT).publish(
                "shop", "order", "c1", {"sku": "A"}
            )
        (it,) = store.list_intents()
        assert it.state == "authorized"
        while Sweeper(store, SHORT).sweep_leases()["expired"] == 0:
            time.sleep(0.05)
        assert Reconciler(store, function_transport(client), SHORT).run() == {"lookup.found": 1}
        assert store.get(it.key).state == "published"
    assert server.posts == 1 and client.calls == 1


def test_outbox_under_mixed_faults_never_duplicates(url, server):
    """40 orders through the sync outbox (4 workers), the send callable failing in every documented way in
    turn: each intent ends published, or parked for a person; no order twice; every published one exists."""
    client = OrdersClient(server)
    turn = itertools.count()
    lock = threading.Lock()

    class SdkError(Exception):
        pass

    def send(request):
        with lock:
            n = next(turn) % 7
        if n == 0:
            raise ConnectionRefusedError("refused")  # before any byte: retried
        if n == 1:
            client.send(request)
            raise TimeoutError("read timed out")
        if n == 2:
            client.send(request)
            raise SdkError("the SDK blew up")
        if n == 3:
            client.send(request)
            return None  # no id
        if n == 4:
            client.send(request)
            return {"no": "id"}
        return client.send(request)

    with atmostonce.open(url, transport=function_transport(client, send), workers=4, config=SHORT, **QUICK) as ob:
        keys = [ob.submit("shop", "order", f"c{i}", {"sku": f"s{i}", "qty": i}).key for i in range(40)]
        ob.run(until_idle=True, timeout=40)
        states = Counter(ob.store.get(k).state for k in keys)
        published = [k for k in keys if ob.store.get(k).state == "published"]
    assert set(states) <= {"published", "parked"}, states
    assert server.duplicates() == {}
    assert all(len(server.by_key(k)) == 1 for k in published)
    assert states["published"] >= 35


def test_cancelling_an_async_run_mid_send_never_resends(url, server):
    """Cancel ``run`` while the server holds a send: it is recorded unknown (never not sent), the next run
    settles it by lookup, and the order exists once."""
    server.gate = threading.Event()
    transport = AsyncOrders(server)

    async def go():
        async with atmostonce.open_async(url, transport=transport, config=SHORT, **QUICK) as ob:
            it = await ob.submit("shop", "order", "c1", {"sku": "A", "qty": 1})
            task = asyncio.create_task(ob.run(until_idle=True, timeout=20))
            assert await asyncio.to_thread(server.stored.wait, 10)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            server.gate.set()
            assert (await ob.get(it.key)).state in ("indeterminate", "published")
            await ob.run(until_idle=True, timeout=20)
            return (await ob.get(it.key)).state

    assert asyncio.run(go()) == "published"
    assert transport.sends == 1 and server.posts == 1 and server.duplicates() == {}


@pytest.mark.parametrize(
    "fail", [asyncio.CancelledError(), TimeoutError("t"), ConnectionResetError("r")], ids=["cancel", "timeout", "reset"]
)
def test_async_transport_failures_after_the_order_is_stored_settle_once(url, server, fail):
    """My async transport stores the order then fails (its SDK's own CancelledError, a timeout, a reset):
    unknown, looked up, published; one order."""
    transport = AsyncOrders(server, fail=fail)

    async def go():
        async with atmostonce.open_async(url, transport=transport, config=SHORT, **QUICK) as ob:
            it = await ob.submit("shop", "order", "c1", {"sku": "A", "qty": 1})
            report = await ob.run(until_idle=True, timeout=20)
            return (await ob.get(it.key)).state, report

    state, report = asyncio.run(go())
    assert state == "published"
    assert report.dispatched["send.unknown"] == 1 and report.reconciled["lookup.found"] == 1
    assert server.posts == 1 and transport.sends == 1


def test_closing_the_async_outbox_while_a_send_is_in_flight_records_it(url, server):
    """``aclose`` while a run is mid-send: the worker finishes the send and records it; one order."""
    server.gate = threading.Event()
    transport = AsyncOrders(server)

    async def go():
        ob = await atmostonce.open_async(url, transport=transport, config=RuntimeConfig(), **QUICK).open()
        it = await ob.submit("shop", "order", "c1", {"sku": "A", "qty": 1})
        task = asyncio.create_task(ob.run(until_idle=True, timeout=20))
        assert await asyncio.to_thread(server.stored.wait, 10)
        threading.Timer(0.2, server.gate.set).start()
        await ob.aclose()
        await task
        return it.key

    key = asyncio.run(go())
    with atmostonce.open_store(url) as store:
        assert store.get(key).state == "published"
    assert server.posts == 1 and transport.closed


def test_cancelled_async_submits_commit_all_or_nothing(url, server):
    """Submits cancelled at random points on the native async store: each either committed (and is then sent
    once) or left nothing; the store keeps working and errors are never raw driver errors."""
    transport = AsyncOrders(server)

    async def go():
        async with atmostonce.open_async(url, transport=transport, config=SHORT, **QUICK) as ob:
            for r in range(10):
                tasks = [
                    asyncio.create_task(ob.submit("shop", "order", f"r{r}-{i}", {"sku": "S", "qty": 1}))
                    for i in range(4)
                ]
                await asyncio.sleep(0.01 * r)
                for t in tasks:
                    t.cancel()
                for t in tasks:
                    try:
                        await t
                    except asyncio.CancelledError:
                        pass
            await ob.run(until_idle=True, timeout=30)

    asyncio.run(go())
    with atmostonce.open_store(url) as store:
        intents = store.list_intents(limit=100)
        assert {i.state for i in intents} <= {"published"}
        assert server.posts == len(intents)
    assert server.duplicates() == {}


def test_an_intake_error_is_typed_with_its_field(url, server):
    with atmostonce.open_store(url) as store:
        with pytest.raises(IntakeError) as info:
            Dispatcher(store, function_transport(OrdersClient(server))).publish(
                "", "order", "c1", {"sku": "A", "qty": 1}
            )
    assert info.value.field == "account" and info.value.code is not None
    assert server.posts == 0


def test_a_read_back_that_raises_keeps_the_order_id(url, server):
    """The read-back callable times out after the order was made: FunctionTransportError goes up, the order's
    id is kept on the intent, and the reconciler's read-back publishes it."""
    from atmostonce_function import FunctionTransportError

    client = OrdersClient(server)

    def flaky_read_back(remote_id):
        raise TimeoutError("read-back timed out")

    transport = FunctionTransport(client.send, read_back=flaky_read_back, lookup=client.lookup, name="orders")
    with atmostonce.open_store(url) as store:
        with pytest.raises(FunctionTransportError):
            Dispatcher(store, transport, config=SHORT).publish("shop", "order", "c1", {"sku": "A", "qty": 1})
        (it,) = store.list_intents()
        assert it.remote_id == "1" and it.state == "authorized"
        while Sweeper(store, SHORT).sweep_leases()["expired"] == 0:
            time.sleep(0.05)
        assert Reconciler(store, function_transport(client), SHORT).run() == {"lookup.found": 1}
        assert store.get(it.key).state == "published"
    assert server.posts == 1
