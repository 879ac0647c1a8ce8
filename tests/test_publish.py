"""Submit and dispatch as one call (``Dispatcher.publish``): the intent and its authorization committed together
before the bytes, the outcome after (docs/design.md#two-durable-points-per-send). Wherever the store cannot
do both in one transaction, or a gate refuses, it ends exactly where ``submit`` then ``dispatch`` ends."""

from __future__ import annotations

import pytest

from atmostonce import IntakeError, Rejected
from atmostonce.errors import SOURCE_STATE
from atmostonce.runtime import Dispatcher
from tests.helpers import submit
from tests.test_fused_dispatch import CONFIG, Marked, Platform, Statements, events

PLATFORMS = [
    pytest.param(dict(), id="match"),
    pytest.param(dict(edit={"text": "edited"}), id="mismatch"),
    pytest.param(dict(read_back=False), id="no-read-back"),
    pytest.param(dict(answer="not_sent"), id="not-sent"),
    pytest.param(dict(answer="unknown"), id="unknown"),
]


def _ends(store, key):
    it = store.get(key)
    return it.state, it.attempt_count, it.remote_id is None, events(store, key)


@pytest.mark.parametrize("platform", PLATFORMS)
def test_publish_ends_where_submit_then_dispatch_ends(any_store, platform):
    store = any_store.store
    published, sent = Platform(**platform), Platform(**platform)
    key, outcome = Dispatcher(store, published, CONFIG).publish("acct", "post", "room-1", {"text": "one call"})
    it = store.submit("acct", "post", "room-2", {"text": "two calls"})
    assert outcome == Dispatcher(store, sent, CONFIG).dispatch(it)
    assert _ends(store, key) == _ends(store, it.key)
    assert published.sends == sent.sends == 1


def test_publish_returns_the_key_submit_gives_the_same_delivery(any_store):
    store = any_store.store
    key, _ = Dispatcher(store, Platform(), CONFIG).publish("acct", "post", "room-1", {"text": "keyed"})
    assert store.submit("acct", "post", "room-1", {"text": "keyed"}).key == key


def test_publishing_a_settled_delivery_again_is_refused_and_sends_nothing(any_store):
    store = any_store.store
    platform = Platform()
    d = Dispatcher(store, platform, CONFIG)
    key, outcome = d.publish("acct", "post", "room-1", {"text": "once"})
    assert outcome == "read_back.match"
    with pytest.raises(Rejected) as e:
        d.publish("acct", "post", "room-1", {"text": "once"})
    assert (e.value.event, e.value.guard, e.value.state) == ("begin", SOURCE_STATE, "published")
    assert platform.sends == 1
    assert len(store.attempts(key)) == 1


def test_publishing_a_queued_delivery_dispatches_that_intent_without_a_second_one(any_store):
    store = any_store.store
    it = store.submit("acct", "post", "room-1", {"text": "queued first"})
    platform = Platform()
    key, outcome = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "queued first"})
    assert (key, outcome) == (it.key, "read_back.match")
    assert events(store, key) == ["submit", "begin", "authorize_dispatch", "record_success", "confirm_read_back"]
    assert platform.sends == 1
    # the connection that refused the one-transaction form goes on working for the next delivery
    assert (
        Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-2", {"text": "next"})[1] == "read_back.match"
    )


def test_publishing_a_delivery_an_operator_requeued_sends_it_under_its_new_epoch(any_store):
    # the operator's resend bumps the resend epoch: the request goes out under a new platform key, once
    store = any_store.store
    it = store.submit("acct", "post", "room-1", {"text": "again"})
    store.park(it.key, operator="ops")
    store.resend(it.key, operator="ops")
    platform = Platform()
    ends = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "again"})
    assert ends == (it.key, "read_back.match")
    after = store.get(it.key)
    assert (after.state, after.resend_epoch, after.attempt_count, platform.sends) == ("published", 1, 1, 1)
    assert store.attempts(it.key)[-1].resend_epoch == 1


def test_a_kill_switch_leaves_the_published_delivery_queued_and_sends_nothing(any_store):
    store = any_store.store
    store.set_kill_switch("account:acct", True, operator="ops")
    platform = Platform()
    key, outcome = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "paused"})
    assert outcome == "gate.paused"
    assert platform.sends == 0
    assert (store.get(key).state, events(store, key)) == ("pending", ["submit"])


def test_a_duplicate_text_ends_where_submit_then_dispatch_ends(any_store):
    # the duplicate-text gate refuses the second send of one text in the account's window; on PostgreSQL it is
    # the database's exclusion constraint that refuses, which rolls the one transaction back (intent and all)
    store = any_store.store
    ends = []
    for account, together in (("acct-a", True), ("acct-b", False)):
        platform = Platform()
        d = Dispatcher(store, platform, CONFIG)
        d.publish(account, "post", "room-1", {"text": "said once"})
        if together:
            key, outcome = d.publish(account, "post", "room-2", {"text": "said once"})
        else:
            it = store.submit(account, "post", "room-2", {"text": "said once"})
            key, outcome = it.key, d.dispatch(it)
        ends.append((outcome, platform.sends, _ends(store, key)))
    assert ends[0] == ends[1]
    assert ends[0][1] == 1  # the duplicate was not sent


def test_publish_refuses_bad_input_and_stores_nothing(any_store):
    store = any_store.store
    platform = Platform()
    with pytest.raises(IntakeError) as e:
        Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", ["not", "an", "object"])
    assert e.value.field == "request"
    assert store.list_intents() == []
    assert platform.sends == 0


def test_publish_never_drops_an_approval_requirement(any_store):
    store = any_store.store
    submit(store, text="needs approval", requires_approval=True)
    platform = Platform()
    with pytest.raises(IntakeError) as e:
        Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "needs approval"})
    assert e.value.field == "requires_approval"
    assert platform.sends == 0


def test_a_dispatcher_that_goes_step_by_step_publishes_step_by_step(any_store):
    store = any_store.store
    platform = Platform()
    key, outcome = Dispatcher(store, platform, CONFIG, fused=False).publish("acct", "post", "room-1", {"text": "s"})
    assert outcome == "read_back.match"
    assert events(store, key) == ["submit", "begin", "authorize_dispatch", "record_success", "confirm_read_back"]


@pytest.mark.postgres
def test_publish_is_one_statement_before_the_bytes_and_one_after(pg_store, monkeypatch):
    """Before the bytes: one statement in autocommit that creates the intent as the two moves leave it, with
    the creation's and both moves' rows (one round trip, one commit that waits for the disk); after: the
    outcome's one statement. The submit's and the authorization's history rows were written by one
    transaction."""
    Dispatcher(pg_store, Platform(), CONFIG).publish("acct", "post", "room-0", {"text": "w"})  # connections made
    seen = Statements(monkeypatch)
    key, outcome = Dispatcher(pg_store, Marked(seen.sent), CONFIG).publish("acct", "post", "room-1", {"text": "x"})
    assert outcome == "read_back.match"
    cut = seen.sent.index("<the bytes>")
    before, after = seen.sent[:cut], seen.sent[cut:]
    assert seen.transactions() == []  # no BEGIN ... COMMIT: each statement is its own transaction
    (authorization,) = before
    assert "INSERT INTO aom_intents" in authorization and "UPDATE aom_intents" not in authorization
    # its one set_config is the lock_timeout that keeps it from waiting (CTE nowait); the outcome's turns the
    # wait for the disk off (CTE cfg), which the authorization never does
    assert authorization.count("set_config") == 1 and "nowait AS" in authorization and "cfg AS" not in authorization
    (outcome_statement,) = after[1:]
    assert "UPDATE aom_intents" in outcome_statement and "cfg AS" in outcome_statement
    with pg_store.engine.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT event, xmin::text FROM aom_history WHERE key = %(k)s ORDER BY seq", {"k": key}
        ).all()
    assert [event for event, _ in rows] == [
        "submit",
        "begin",
        "authorize_dispatch",
        "record_success",
        "confirm_read_back",
    ]
    assert len({xmin for _, xmin in rows[:3]}) == 1
    assert rows[3][1] != rows[0][1]


@pytest.mark.postgres
def test_a_text_claimed_by_a_transaction_still_open_rolls_the_whole_publish_back(pg_store):
    """Another transaction holds an uncommitted claim on the same text: the authorization's guard cannot see
    it, so the claim insert waits on the duplicate-text exclusion constraint, and fails once that transaction
    commits. The one transaction rolls back whole (no intent half made, nothing sent), and publish goes the
    usual way: submit, then a dispatch that meets the committed claim at the gate."""
    import psycopg

    from tests.test_fused_dispatch import _dsn, _in_thread, _until_waiting

    first = pg_store.submit("acct", "post", "room-1", {"text": "raced"})  # queued, holds no claim
    admin = psycopg.connect(_dsn(pg_store.engine.url.render_as_string(hide_password=False)), autocommit=True)
    try:
        admin.execute("BEGIN")
        admin.execute(
            "INSERT INTO aom_text_claims (key, account, text_hash, start_at, end_at, released) "
            "VALUES (%s, %s, %s, 0, 1e12, false)",
            (first.key, first.account, first.text_hash),
        )
        platform, results = Platform(), {}
        d = Dispatcher(pg_store, platform, CONFIG)
        t = _in_thread(results, "publish", lambda: d.publish("acct", "post", "room-2", {"text": "raced"}))
        _until_waiting(admin, 1)
        admin.execute("COMMIT")
        t.join(30)
    finally:
        admin.close()
    key, outcome = results["publish"]
    assert platform.sends == 0
    assert outcome == "gate.blocked"
    assert events(pg_store, key) == ["submit", "begin", "block_at_gate"]  # one submit: the first was rolled back
