"""Review of retry spacing (docs/design.md#retries-are-spaced): attempts to break the reading of a platform's
pause (HTTP ``Retry-After``, Matrix ``retry_after_ms``), its recording with the not-sent, and the sweeper's
schedule (helper-written). The review found nine defects, each now held fixed by the test named for it; the
rest pin what held under attack.

The central promise under test: a platform's refusal is a *proven* not-sent. Whatever the pause hint looks like,
the not-sent must be recorded (the intent ends ``failed``, retryable), never turned into an exception that leaves
the attempt to lapse into an unknown send; and a pause the platform asked for is waited for."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
import time

import pytest

from atmostonce import MemoryStore
from atmostonce.records import MAX_LEASE_SECONDS
from atmostonce.runtime import Dispatcher, RuntimeConfig, Sweeper
from atmostonce.testing.stateful import FakeClock
from atmostonce.transport import Capabilities, NotSent, WireRequest, retry_after_seconds
from tests.helpers import answer_json, begin_authorize, http_platform, run_cli, submit

UNSPACED = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, retry_backoff=0)


# ---------------------------------------------------------------- fake platforms on real sockets
class _Refuses429(http.server.BaseHTTPRequestHandler):
    """A REST platform that refuses every create with 429 and the configured raw headers (stores nothing)."""

    def do_POST(self):  # noqa: N802 - http.server's name
        srv = self.server
        self.rfile.read(int(self.headers["content-length"]))
        with srv.lock:
            srv.creates += 1
        answer_json(self, 429, b'{"error": "slow down"}', srv.headers_out)

    def log_message(self, *args):
        pass


@pytest.fixture
def refusing():
    with http_platform(_Refuses429, creates=0, headers_out=[]) as srv:
        yield srv


def _http_config(srv):
    from atmostonce_http import HttpPlatformConfig

    return HttpPlatformConfig(
        base_url=f"http://127.0.0.1:{srv.server_address[1]}",
        create_path="/posts",
        id_pointer="/id",
        read_back_path="/posts/{id}",
    )


def _dispatch_once(store, transport):
    """Dispatch one fresh intent; returns (its key, the dispatch's outcome or the exception's type name)."""
    key = submit(store).key
    try:
        outcome = Dispatcher(store, transport, UNSPACED).dispatch(key)
    except Exception as exc:  # noqa: BLE001 - the defect under test is that something escapes
        outcome = type(exc).__name__
    return key, outcome


class _Homeserver(http.server.BaseHTTPRequestHandler):
    """A Matrix homeserver that logs anyone in (as the device asked for) and answers every send with 429 and
    the configured body and headers."""

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self._answer(
            200, json.dumps({"access_token": "tok", "user_id": "@u:hs", "device_id": body["device_id"]}).encode()
        )

    def do_PUT(self):  # noqa: N802
        self.rfile.read(int(self.headers["content-length"]))
        self._answer(429, self.server.body, self.server.headers_out)

    def _answer(self, status, data, headers=()):
        answer_json(self, status, data, headers)

    def log_message(self, *args):
        pass


@pytest.fixture
def homeserver():
    with http_platform(_Homeserver, body=b"{}", headers_out=[]) as srv:
        yield srv


def _matrix(srv, tmp_path):
    from atmostonce_matrix.transport import MatrixConfig, MatrixTransport

    return MatrixTransport(
        MatrixConfig(
            homeserver_url=f"http://127.0.0.1:{srv.server_address[1]}",
            room_id="!r:hs",
            user="u",
            password="p",
            state_path=str(tmp_path / "state.json"),
        )
    )


class _Refusing:
    """A custom transport whose platform refuses every send with the pause hint ``retry_after``."""

    name = "refusing"
    protocol_version = 1

    def __init__(self, retry_after):
        self.retry_after = retry_after
        self.capabilities = Capabilities(read_back=False)

    def send(self, request):
        return NotSent("HTTP 429", retry_after=self.retry_after)


# ---------------------------------------------------------------- defects: a hint that crashes the send
@pytest.mark.parametrize(
    "value",
    [
        pytest.param("²", id="superscript-two"),  # str.isdigit() is true, int() refuses it
        pytest.param("①", id="circled-one"),
        pytest.param("1" + "0" * 400, id="too-big-for-a-float"),  # int() reads it, float() overflows
        pytest.param("9" * 5000, id="over-the-int-digit-limit"),  # int() refuses over 4300 digits
    ],
)
def test_a_429_whose_retry_after_is_unreadable_is_still_recorded_as_not_sent(refusing, value):
    """On a real socket: a 429 is a proven not-sent whatever its Retry-After says. An unreadable hint must be
    left out (as "soon" or "-5" are); today it raises out of ``HttpTransport.send`` (ValueError/OverflowError
    from ``retry_after_seconds``), the attempt stays ``authorized`` and later lapses to an unknown send."""
    from atmostonce_http import HttpTransport

    refusing.headers_out = [("Retry-After", value)]
    store = MemoryStore(clock=FakeClock())
    with HttpTransport(_http_config(refusing)) as transport:
        key, outcome = _dispatch_once(store, transport)
    assert (outcome, store.get(key).state) == ("send.not_sent", "failed")
    assert refusing.creates == 1


def test_the_async_http_transport_answers_not_sent_for_a_429_with_an_unreadable_retry_after(refusing):
    """``AsyncHttpTransport.send`` "never raises for a network or HTTP failure": a 429 with ``Retry-After: ²``
    must come back as ``NotSent`` (no usable pause), not as a ValueError."""
    from atmostonce_http import AsyncHttpTransport

    refusing.headers_out = [("Retry-After", "²")]

    async def send():
        transport = AsyncHttpTransport(_http_config(refusing))
        try:
            return await transport.send(WireRequest(body={"text": "hi"}, delivery_key="k" * 64))
        except Exception as exc:  # noqa: BLE001
            return exc
        finally:
            await transport.aclose()

    result = asyncio.run(send())
    assert isinstance(result, NotSent) and result.retry_after is None


def test_a_429_with_a_retry_after_header_too_long_for_a_reason_is_still_recorded_as_not_sent(refusing):
    """The HTTP transport now copies the raw Retry-After value into the not-sent's reason. A 4,100-character
    header (h11 accepts it) makes the reason longer than the 4,096 characters ``record_not_sent`` takes: the
    IntakeError escapes the dispatch and the proven not-sent is lost (the intent stays ``authorized``)."""
    from atmostonce_http import HttpTransport

    refusing.headers_out = [("Retry-After", "x" * 4100)]
    store = MemoryStore(clock=FakeClock())
    with HttpTransport(_http_config(refusing)) as transport:
        key, outcome = _dispatch_once(store, transport)
    assert (outcome, store.get(key).state) == ("send.not_sent", "failed")


def _matrix_dispatch(homeserver, tmp_path):
    """One fresh intent on a model store dispatched through the Matrix transport to ``homeserver``: (store, key,
    outcome or the escaping exception's type name)."""
    store = MemoryStore(clock=FakeClock())
    transport = _matrix(homeserver, tmp_path)
    try:
        key, outcome = _dispatch_once(store, transport)
    finally:
        transport.close()
    return store, key, outcome


@pytest.mark.parametrize(
    ("body", "headers"),
    [
        pytest.param(
            b'{"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": 1' + b"0" * 400 + b"}", [], id="retry_after_ms-10e400"
        ),
        pytest.param(b'{"errcode": "M_LIMIT_EXCEEDED"}', [("Retry-After", "²")], id="retry-after-superscript"),
    ],
)
def test_a_matrix_429_with_an_unusable_pause_is_still_recorded_as_not_sent(homeserver, tmp_path, body, headers):
    """``MatrixTransport.send`` "never raises for a network or HTTP failure". A JSON integer ``retry_after_ms``
    of 10**400 passes the ``0 <= ms < inf`` check and overflows in ``ms / 1000.0``; a Retry-After of ``²``
    raises in ``retry_after_seconds``. Either way the 429 (M_LIMIT_EXCEEDED: not sent) is lost."""
    homeserver.body, homeserver.headers_out = body, headers
    store, key, outcome = _matrix_dispatch(homeserver, tmp_path)
    assert (outcome, store.get(key).state) == ("send.not_sent", "failed")


# ---------------------------------------------------------------- defects: a pause asked for and not waited for
@pytest.mark.parametrize("zone", ["EST+5", "JST-9"])
def test_an_asctime_retry_after_is_read_on_gmt_whatever_this_machines_zone(monkeypatch, zone):
    """RFC 9110 makes recipients accept the asctime form, which is GMT. ``parsedate_to_datetime`` gives a naive
    datetime for it and ``.timestamp()`` reads that in the machine's local zone: 3 s becomes 18,003 s west of
    Greenwich (the retry waits five hours) and 0 east of it (retried at once, refused again)."""
    monkeypatch.setenv("TZ", zone)
    time.tzset()
    try:
        with_date = retry_after_seconds("Sun Nov  6 08:49:40 1994", "Sun, 06 Nov 1994 08:49:37 GMT")
        without_date = retry_after_seconds("Sun Nov  6 08:49:40 1994", None, now=784111777.0)
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert (with_date, without_date) == (3.0, 3.0)


@pytest.mark.parametrize("ask", [MAX_LEASE_SECONDS + 1, 10**30])
def test_a_pause_asked_for_longer_than_a_year_is_waited_for_at_least_as_long_as_a_shorter_one(any_store, ask):
    """A platform that asks for a pause longer than a year gets none: the hint is dropped and the sweeper
    re-queues the intent on its next pass, though a pause of exactly a year is held to ``retry_after_max``.
    A longer ask must never mean an earlier retry (hold it to the ceiling instead)."""
    s = any_store.store
    shorter = submit(s, text="a year").key
    longer = submit(s, text="more").key
    Dispatcher(s, _Refusing(MAX_LEASE_SECONDS), UNSPACED).dispatch(shorter)
    Dispatcher(s, _Refusing(ask), UNSPACED).dispatch(longer)
    sweeper = Sweeper(s, UNSPACED)
    assert sweeper.retry_failed() == {"retried": 0, "exhausted": 0, "waiting": 2, "skipped": 0}
    assert [s.get(k).state for k in (shorter, longer)] == ["failed", "failed"]


@pytest.mark.parametrize("value", ["40000000", "Fri, 31 Dec 9999 23:59:59 GMT"])
def test_a_429_asking_for_more_than_a_year_on_a_real_socket_is_not_retried_on_the_next_pass(refusing, value):
    """The same over HTTP: ``Retry-After: 40000000`` (463 days) or a date in year 9999 is dropped, so the
    sweeper re-queues at once and the platform is asked again immediately."""
    from atmostonce_http import HttpTransport

    refusing.headers_out = [("Retry-After", value)]
    store = MemoryStore(clock=FakeClock())
    with HttpTransport(_http_config(refusing)) as transport:
        key, outcome = _dispatch_once(store, transport)
    assert outcome == "send.not_sent"
    assert Sweeper(store, UNSPACED).retry_failed()["waiting"] == 1
    assert store.get(key).state == "failed"


def test_a_matrix_429_whose_retry_after_ms_is_unusable_still_waits_for_its_retry_after_header(homeserver, tmp_path):
    """A 429 whose body's ``retry_after_ms`` is not a number (a proxy's "5000") but whose ``Retry-After`` header
    is: the header is only read when the body has no ``retry_after_ms`` at all, so no pause is kept."""
    homeserver.body = b'{"errcode": "M_LIMIT_EXCEEDED", "retry_after_ms": "5000"}'
    homeserver.headers_out = [("Retry-After", "5")]
    store, key, outcome = _matrix_dispatch(homeserver, tmp_path)
    assert outcome == "send.not_sent"
    (row,) = [h for h in store.history(key) if h.event == "record_not_sent"]
    assert row.detail.get("retry_after") == 5


def test_a_second_failure_at_the_same_store_time_waits_for_its_own_pause(set_clock_store):
    """failed -> (operator) pending -> authorized -> failed again, on a clock that did not move between the two
    failures (the model's clock; SQLite's julianday('now') has millisecond steps): the sweeper's pause cache is
    keyed by ``updated_at`` alone, so it reuses the first failure's pause (none) and re-queues after its
    backoff, although the second refusal asked for an hour."""
    store, set_clock = set_clock_store
    set_clock(1000.0)
    key = submit(store).key
    store.record_not_sent(begin_authorize(store, key), reason="HTTP 503")
    sweeper = Sweeper(store, RuntimeConfig(retry_backoff=60, retry_backoff_max=60))
    assert sweeper.retry_failed()["waiting"] == 1  # the first failure's pause (0) is read and kept
    store.retry(key, operator="alice")  # an operator's retry does not wait (by design)
    store.record_not_sent(begin_authorize(store, key), reason="HTTP 429", retry_after=3600)
    assert store.get(key).attempt_count == 2
    set_clock(1061.0)  # the backoff has passed, the platform's hour has not
    assert sweeper.retry_failed() == {"retried": 0, "exhausted": 0, "waiting": 1, "skipped": 0}
    assert store.get(key).state == "failed"


def test_with_no_pause_and_no_backoff_a_failed_intent_is_retried_on_the_next_pass_after_the_clock_steps_back(
    set_clock_store,
):
    """No backoff (``retry_backoff = 0``) and no Retry-After is documented as "the next pass". A store clock that
    steps back (NTP on the database host) now holds every failed intent as ``waiting`` until the clock catches
    up with its ``updated_at``; before the feature it was retried at once."""
    store, set_clock = set_clock_store
    set_clock(10_000.0)
    key = submit(store).key
    store.record_not_sent(begin_authorize(store, key), reason="connect refused")
    set_clock(9_000.0)
    assert Sweeper(store, UNSPACED).retry_failed() == {"retried": 1, "exhausted": 0, "waiting": 0, "skipped": 0}
    assert store.get(key).state == "pending"


def test_the_worker_config_accepts_a_retry_backoff_of_zero(tmp_path):
    """docs/operations.md: ``retry_backoff`` "0: next pass". ``[runtime] retry_backoff = 0`` in a worker config was
    refused ("must be positive"): only first_look_after and reconcile_interval could be 0, so an operator could
    not turn a backoff off."""
    from atmostonce_cli.worker import load_worker_config
    from tests.worker_proc import SINK_PROFILE

    cfg = tmp_path / "w.toml"
    cfg.write_text(f"platform = {json.dumps(str(SINK_PROFILE))}\n[runtime]\nretry_backoff = 0\n")
    assert load_worker_config(str(cfg)).runtime == {"retry_backoff": 0}


# ---------------------------------------------------------------- what held
@pytest.mark.parametrize("hint", [-0.0, 5e-324, MAX_LEASE_SECONDS])
def test_edge_pauses_from_a_transport_are_kept_as_whole_seconds_rounded_up(any_store, hint):
    s = any_store.store
    key = submit(s).key
    assert Dispatcher(s, _Refusing(hint), UNSPACED).dispatch(key) == "send.not_sent"
    (row,) = [h for h in s.history(key) if h.event == "record_not_sent"]
    assert row.detail["retry_after"] == {-0.0: 0, 5e-324: 1, MAX_LEASE_SECONDS: int(MAX_LEASE_SECONDS)}[hint]
    assert type(row.detail["retry_after"]) is int


def test_the_audit_chain_verifies_after_not_sents_that_kept_a_pause(capsys, sql_store, tmp_path):
    """The history row hash covers the detail JSON: rows with ``retry_after`` (0, rounded, a year) verify on
    both dialects, through ``verify_store`` and the CLI."""
    from atmostonce.audit import verify_store

    for i, hint in enumerate([0, 0.5, 90.2, MAX_LEASE_SECONDS]):
        key = submit(sql_store, text=f"audit {i}").key
        sql_store.record_not_sent(begin_authorize(sql_store, key), reason="HTTP 429", retry_after=hint)
    report = verify_store(sql_store)
    assert (report.intact, report.intents, report.breaks) == (True, 4, ())
    url = sql_store.engine.url.render_as_string(hide_password=False)
    rc, out, _ = run_cli(capsys, "--json", "audit", "verify", "--database-url", url)
    assert rc == 0 and json.loads(out)["intact"] is True


@pytest.mark.parametrize("shared", [False, True], ids=["two-sweepers", "one-sweeper-two-threads"])
def test_two_sweepers_at_once_retry_each_due_intent_once_and_leave_the_waiting_ones(any_store, shared):
    s = any_store.store
    due, waiting = [], []
    for i in range(12):
        key = submit(s, text=f"race {i}").key
        s.record_not_sent(begin_authorize(s, key), reason="HTTP 429", retry_after=3600 if i % 2 else 1)
        (waiting if i % 2 else due).append(key)
    any_store.advance(2)
    once = RuntimeConfig(retries_per_tick=3, retry_backoff=0)  # only the platform's pause spaces them
    first = Sweeper(s, once)
    sweepers = [first, first] if shared else [first, Sweeper(s, once)]
    results, errors, barrier = [], [], threading.Barrier(2)

    def run(sweeper):
        barrier.wait()
        try:
            for _ in range(10):
                results.append(sweeper.retry_failed())
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(sw,)) for sw in sweepers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sum(r["retried"] for r in results) == len(due)
    assert {k: sum(h.event == "retry" for h in s.history(k)) for k in due} == dict.fromkeys(due, 1)
    assert [s.get(k).state for k in waiting] == ["failed"] * len(waiting)


def test_an_operator_retry_does_not_wait_for_the_platforms_pause(any_store):
    s = any_store.store
    key = submit(s).key
    s.record_not_sent(begin_authorize(s, key), reason="HTTP 429", retry_after=3600)
    assert Sweeper(s, UNSPACED).retry_failed()["waiting"] == 1
    assert s.retry(key, operator="alice").state == "pending"
    assert Sweeper(s, UNSPACED).retry_failed() == {"retried": 0, "exhausted": 0, "waiting": 0, "skipped": 0}


def test_the_outbox_with_a_long_retry_after_runs_to_its_timeout_and_reports_the_one_refusal(tmp_path, refusing):
    """``run(until_idle=True, timeout=...)`` with a failed intent waiting an hour: not idle (a retryable intent is
    left), ended by the timeout, the platform asked once, the waiting passes kept out of ``swept``."""
    import atmostonce
    from atmostonce.service import Outbox
    from atmostonce_http import HttpTransport

    refusing.headers_out = [("Retry-After", "3600")]
    with atmostonce.open_store(f"sqlite:///{tmp_path / 'outbox.sqlite3'}") as store:
        outbox = Outbox(store, HttpTransport(_http_config(refusing)), config=UNSPACED, sweep_every=0.05)
        try:
            key = outbox.submit("acct", "post", "room-1", {"text": "slow"}).key
            report = outbox.run(until_idle=True, timeout=1.5)
        finally:
            outbox.close()
        assert store.get(key).state == "failed"
    assert report.idle is False
    assert dict(report.dispatched) == {"send.not_sent": 1}
    assert "waiting" not in report.swept and "retried" not in report.swept
    assert sum(report.errors.values()) == 0
    assert refusing.creates == 1
