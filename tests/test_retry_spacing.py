"""Retries of a proven not-sent are spaced (docs/design.md#the-runtime): the sweeper re-queues a failed intent
only once its backoff has passed on the store's clock, and never before the pause its platform asked for
(``Retry-After``, kept in the not-sent move's history row). A short outage or a rate limit then does not spend
every attempt in one burst and park the intent for a person.

Each behaviour runs on every store (the model with its fake clock; SQLite and PostgreSQL with their clocks
moved by ``age_leases``), and the platform's pause is read from a real HTTP answer on a socket."""

from __future__ import annotations

import http.server
import json
from email.utils import formatdate

import pytest

from atmostonce.errors import IntakeCode, IntakeError
from atmostonce.runtime import Dispatcher, RuntimeConfig, Sweeper
from atmostonce.transport import NotSent, retry_after_seconds
from tests.helpers import answer_json, begin_authorize, http_platform, submit, to_state

SPACED = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, retry_backoff=60)
UNSPACED = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0, retry_backoff=0)


def fail(store, text="hello", retry_after=None, **kw):
    """A fresh intent whose first send took nothing (``retry_after``: the pause its platform asked for)."""
    it = submit(store, text=text, **kw)
    lease = begin_authorize(store, it.key)
    store.record_not_sent(lease, reason="HTTP 429", **({} if retry_after is None else {"retry_after": retry_after}))
    return it.key


def test_a_failed_intent_waits_out_its_backoff_then_is_retried_once(any_store):
    s = any_store.store
    key = fail(s)
    sweeper = Sweeper(s, SPACED)
    assert sweeper.retry_failed() == {"retried": 0, "exhausted": 0, "waiting": 1, "skipped": 0}
    assert s.get(key).state == "failed"
    any_store.advance(61)
    assert sweeper.retry_failed() == {"retried": 1, "exhausted": 0, "waiting": 0, "skipped": 0}
    assert s.get(key).state == "pending"


def test_the_backoff_doubles_with_each_attempt_made_up_to_its_ceiling():
    from atmostonce import MemoryStore
    from atmostonce.records import Intent

    sweeper = Sweeper(MemoryStore(), RuntimeConfig(retry_backoff=2, retry_backoff_max=30))
    waits = [sweeper.retry_wait(Intent(**{**_INTENT, "attempt_count": n})) for n in range(1, 7)]
    assert waits == [2, 4, 8, 16, 30, 30]


def test_the_pause_a_platform_asked_for_is_kept_with_the_not_sent_and_waited_for(any_store):
    s = any_store.store
    key = fail(s, retry_after=90.2)
    (row,) = [h for h in s.history(key) if h.event == "record_not_sent"]
    assert row.detail["retry_after"] == 91  # whole seconds, rounded up
    sweeper = Sweeper(s, UNSPACED)  # no backoff of its own: the platform's pause alone spaces the retry
    any_store.advance(60)
    assert sweeper.retry_failed()["waiting"] == 1
    assert s.get(key).state == "failed"
    any_store.advance(32)
    assert sweeper.retry_failed()["retried"] == 1
    assert s.get(key).state == "pending"


def test_a_platforms_pause_is_held_to_the_configured_ceiling(any_store):
    s = any_store.store
    key = fail(s, retry_after=86_400)
    sweeper = Sweeper(s, RuntimeConfig(reconcile_interval=0, retry_after_max=120))
    assert sweeper.retry_failed()["waiting"] == 1
    any_store.advance(121)
    assert sweeper.retry_failed()["retried"] == 1
    assert s.get(key).state == "pending"


def test_an_intent_with_no_attempt_left_is_parked_at_once_whatever_it_waits_for(any_store):
    s = any_store.store
    key = fail(s, retry_after=3600, max_attempts=1)
    assert Sweeper(s, SPACED).retry_failed() == {"retried": 0, "exhausted": 1, "waiting": 0, "skipped": 0}
    assert s.get(key).state == "parked"


def test_intents_that_wait_do_not_hold_back_the_ones_behind_them(any_store):
    s = any_store.store
    waiting = [fail(s, text=f"long {i}", retry_after=3600) for i in range(3)]
    due = fail(s, text="due")
    sweeper = Sweeper(s, UNSPACED)
    for _ in range(4):  # one intent offered per pass: the queue is read in turn, not from its head each time
        sweeper.retry_failed(limit=1)
    assert s.get(due).state == "pending"
    assert [s.get(k).state for k in waiting] == ["failed"] * 3


@pytest.mark.parametrize(
    ("value", "code"),
    [
        (-1, IntakeCode.OUT_OF_RANGE),
        (float("nan"), IntakeCode.OUT_OF_RANGE),
        (float("inf"), IntakeCode.OUT_OF_RANGE),
        (400 * 86_400, IntakeCode.OUT_OF_RANGE),
        (True, IntakeCode.NOT_NUMBER),
        ("30", IntakeCode.NOT_NUMBER),
    ],
)
def test_a_pause_that_is_not_a_number_of_seconds_is_refused_and_nothing_moves(any_store, value, code):
    s = any_store.store
    it = submit(s)
    lease = begin_authorize(s, it.key)
    with pytest.raises(IntakeError) as e:
        s.record_not_sent(lease, reason="HTTP 429", retry_after=value)
    assert (e.value.code, e.value.field) == (code, "retry_after")
    assert s.get(it.key).state == "authorized"


class _Refusing:
    """A transport whose platform refuses every send with a pause hint of ``retry_after``."""

    name = "refusing"
    protocol_version = 1

    def __init__(self, retry_after):
        from atmostonce.transport import Capabilities

        self.retry_after, self.sends = retry_after, 0
        self.capabilities = Capabilities(read_back=False)

    def send(self, request):
        self.sends += 1
        return NotSent("HTTP 429", retry_after=self.retry_after)


@pytest.mark.parametrize("hint", [-5, float("nan"), "soon"])
def test_an_unusable_pause_from_a_transport_is_left_out_and_the_not_sent_still_recorded(any_store, hint):
    s = any_store.store
    key = submit(s).key
    assert Dispatcher(s, _Refusing(hint), UNSPACED).dispatch(key) == "send.not_sent"
    assert s.get(key).state == "failed"
    (row,) = [h for h in s.history(key) if h.event == "record_not_sent"]
    assert "retry_after" not in row.detail


# ---------------------------------------------------------------- Retry-After read from a real HTTP answer
@pytest.mark.parametrize(
    ("value", "date", "seconds"),
    [
        ("120", None, 120.0),
        (" 7 ", None, 7.0),
        ("Wed, 21 Oct 2015 07:28:30 GMT", "Wed, 21 Oct 2015 07:28:00 GMT", 30.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", "Wed, 21 Oct 2015 07:28:30 GMT", 0.0),  # a date already past: no pause
        ("-5", None, None),
        ("1.5", None, None),
        ("soon", None, None),
        ("", None, None),
    ],
)
def test_retry_after_is_read_as_seconds_or_as_a_date_on_the_platforms_clock(value, date, seconds):
    assert retry_after_seconds(value, date) == seconds


def test_a_retry_after_date_without_a_date_header_counts_from_this_machines_clock():
    assert retry_after_seconds(formatdate(1_000_060, usegmt=True), None, now=1_000_000.0) == 60.0


class _RateLimited(http.server.BaseHTTPRequestHandler):
    """A REST platform that answers its first ``refusals`` creates with 429 and ``Retry-After`` (storing nothing),
    then stores each create and answers 201 with its id; ``GET /posts/<id>`` reads one back."""

    def do_POST(self):  # noqa: N802 - http.server's name
        srv = self.server
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with srv.lock:
            srv.creates += 1
            refuse = srv.creates <= srv.refusals
            if not refuse:
                srv.posts.append(body)
                ident = str(len(srv.posts))
        if refuse:
            self._answer(429, {"error": "slow down"}, {"Retry-After": srv.retry_after})
        else:
            self._answer(201, {"id": ident, **body})

    def do_GET(self):  # noqa: N802
        ident = self.path.rsplit("/", 1)[-1]
        with self.server.lock:
            found = (
                self.server.posts[int(ident) - 1]
                if ident.isdigit() and 0 < int(ident) <= len(self.server.posts)
                else None
            )
        self._answer(200, {"id": ident, **found}) if found is not None else self._answer(404, {})

    def _answer(self, status, doc, headers=None):
        answer_json(self, status, json.dumps(doc).encode(), (headers or {}).items())

    def log_message(self, *args):
        pass


@pytest.fixture
def rate_limited():
    with http_platform(_RateLimited, creates=0, refusals=1, posts=[], retry_after="45") as srv:
        yield srv


def test_a_429_with_retry_after_on_a_real_socket_is_not_sent_and_retried_once_after_the_pause(sql_store, rate_limited):
    from atmostonce_http import HttpPlatformConfig, HttpTransport

    cfg = HttpPlatformConfig(
        base_url=f"http://127.0.0.1:{rate_limited.server_address[1]}",
        create_path="/posts",
        id_pointer="/id",
        read_back_path="/posts/{id}",
    )
    from atmostonce_sql.testing import age_leases

    with HttpTransport(cfg) as transport:
        dispatcher = Dispatcher(sql_store, transport, UNSPACED)
        key = submit(sql_store, text="rate limited").key
        assert dispatcher.dispatch(key) == "send.not_sent"
        (row,) = [h for h in sql_store.history(key) if h.event == "record_not_sent"]
        assert row.detail["retry_after"] == 45 and "Retry-After=45" in row.detail["reason"]
        sweeper = Sweeper(sql_store, UNSPACED)
        assert sweeper.retry_failed()["waiting"] == 1  # asked again at once, the platform would refuse again
        age_leases(sql_store, 46)
        assert sweeper.retry_failed()["retried"] == 1
        assert dispatcher.dispatch(key) == "read_back.match"
    assert sql_store.get(key).state == "published"
    assert (rate_limited.creates, len(rate_limited.posts)) == (2, 1)  # refused once, stored once


_INTENT = dict(
    key="k" * 64,
    account="acct",
    action_kind="post",
    target="room-1",
    request={"text": "hello"},
    request_digest="d" * 64,
    state="failed",
    attempt_count=1,
    max_attempts=3,
    attempt_token=None,
    generation=1,
    lease_expires_at=None,
    remote_id=None,
    reconcile_count=0,
    max_reconciles=3,
    resend_epoch=0,
    descriptor=None,
    normalizer_version=1,
    created_at=0.0,
    updated_at=0.0,
)


def test_the_outbox_sends_a_rate_limited_post_once_after_the_pause_its_platform_asked_for(tmp_path, rate_limited):
    """The whole service (workers, sweeper) against a platform answering its first create with 429 and
    ``Retry-After: 1``: the post is stored once, and the store's own record shows the retry was not made before
    the pause (the re-queue's clock reading is at least a second after the not-sent's)."""
    import atmostonce
    from atmostonce.service import Outbox
    from atmostonce_http import HttpPlatformConfig, HttpTransport

    rate_limited.retry_after = "1"
    cfg = HttpPlatformConfig(
        base_url=f"http://127.0.0.1:{rate_limited.server_address[1]}",
        create_path="/posts",
        id_pointer="/id",
        read_back_path="/posts/{id}",
    )
    with atmostonce.open_store(f"sqlite:///{tmp_path / 'outbox.sqlite3'}") as store:
        outbox = Outbox(store, HttpTransport(cfg), config=UNSPACED, sweep_every=0.05)
        try:
            key = outbox.submit("acct", "post", "room-1", {"text": "rate limited"}).key
            report = outbox.run(until_idle=True, timeout=60)
        finally:
            outbox.close()
        assert report.idle and store.get(key).state == "published"
        history = {h.event: h for h in store.history(key)}
    assert history["record_not_sent"].detail["retry_after"] == 1
    assert history["retry"].recorded_at - history["record_not_sent"].recorded_at >= 1
    assert (rate_limited.creates, len(rate_limited.posts)) == (2, 1)


def test_by_default_a_machine_failure_waits_and_a_person_resolving_not_sent_does_not(any_store):
    s = any_store.store
    sweeper = Sweeper(s)  # the defaults: a backoff of 5 s doubling
    machine = fail(s)
    parked, _ = to_state(s, "parked", text="a person looked")
    s.resolve_not_sent(parked.key, operator="alice")
    assert sweeper.retry_failed() == {"retried": 1, "exhausted": 0, "waiting": 1, "skipped": 0}
    assert (s.get(machine).state, s.get(parked.key).state) == ("failed", "pending")
    any_store.advance(6)
    assert sweeper.retry_failed()["retried"] == 1
    assert s.get(machine).state == "pending"
