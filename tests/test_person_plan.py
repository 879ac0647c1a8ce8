"""A person's ``resend`` and ``resolve --not-sent`` present the plan of the read they decided on, and are refused
(``plan_unchanged``) when the intent has had another attempt or lookup since (docs/design.md#a-lookup-must-answer-for-its-key).

Before, the look at the store and the platform was about one read and the move about whatever the row was by
then: a whole resend cycle by someone else (their resend, a send whose answer was lost, parked again) that came
between the two left the intent ``parked`` as the look saw it, with a key the look never asked about, and the
second person's move sent it a third time. On every store; end to end with the CLI, the console's settle and
json-server (a REST server nobody here wrote, which does not deduplicate)."""

from __future__ import annotations

import json

import pytest

from atmostonce import GuardRefused, IntakeError
from atmostonce.names import EVENT, GUARD, STATE
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED
from tests.helpers import begin_authorize, run_cli, settle_parked, to_state

MOVES = {
    "resend": lambda s, key, plan: s.resend(key, operator="alice", plan=plan),
    "resolve_not_sent": lambda s, key, plan: s.resolve_not_sent(key, operator="alice", reason="checked", plan=plan),
}


@pytest.fixture
def store(any_store):
    return any_store.store


def _someone_elses_cycle(store, key):
    """Bob resends the parked intent, its send's answer is lost, and it is parked again: ``parked`` as before,
    under a new attempt."""
    store.resend(key, operator="bob")
    lease = begin_authorize(store, key)
    store.record_unknown(lease, reason="read timeout")
    store.park(key, operator="bob")


@pytest.mark.parametrize("event", sorted(MOVES))
def test_a_move_on_a_read_made_before_another_attempt_is_refused_and_recorded(store, event):
    it, _ = to_state(store, STATE.parked, text="looked at once")
    plan = store.get(it.key).plan  # what the person read, looked up and decided on
    _someone_elses_cycle(store, it.key)
    before = store.get(it.key)
    assert before.state == STATE.parked and before.generation != plan.generation
    with pytest.raises(GuardRefused) as refused:
        MOVES[event](store, it.key, plan)
    assert (refused.value.event, refused.value.guard) == (event, GUARD.plan_unchanged)
    assert store.get(it.key) == before  # nothing written
    (record,) = [r for r in store.refusals(it.key) if r.event == event]
    assert record.guard == GUARD.plan_unchanged
    assert record.presented["plan_generation"] == plan.generation


@pytest.mark.parametrize("event", sorted(MOVES))
def test_a_move_on_the_current_read_goes_through(store, event):
    it, _ = to_state(store, STATE.parked, text="looked at now")
    _someone_elses_cycle(store, it.key)
    after = MOVES[event](store, it.key, store.get(it.key).plan)
    assert after.state == store.table.event(event).target


@pytest.mark.parametrize("event", sorted(MOVES))
def test_without_a_plan_the_move_is_about_the_row_as_the_call_reads_it(store, event):
    it, _ = to_state(store, STATE.parked, text="no look")
    _someone_elses_cycle(store, it.key)
    assert MOVES[event](store, it.key, None).state == store.table.event(event).target


def test_a_parking_and_nothing_else_since_the_read_does_not_void_the_plan(store):
    # resent and parked again before any attempt: no send was made that the look did not cover
    it, _ = to_state(store, STATE.parked, text="resent, parked, no attempt")
    plan = store.get(it.key).plan
    store.resend(it.key, operator="bob")
    store.park(it.key, operator="bob")
    assert store.resend(it.key, operator="alice", plan=plan).state == STATE.pending


def test_a_plan_for_another_intent_is_bad_input_and_writes_nothing(store):
    one, _ = to_state(store, STATE.parked, text="one")
    other, _ = to_state(store, STATE.parked, text="other")
    with pytest.raises(IntakeError) as bad:
        store.resend(one.key, operator="alice", plan=store.get(other.key).plan)
    assert bad.value.field == "plan"
    assert store.get(one.key).state == STATE.parked


def test_a_plan_that_is_not_a_plan_is_bad_input(store):
    it, _ = to_state(store, STATE.parked, text="not a plan")
    with pytest.raises(IntakeError) as bad:
        store.resend(it.key, operator="alice", plan={"generation": 1})
    assert bad.value.field == "plan"


def test_a_plan_read_before_a_restore_is_refused_after_it(sql_store):
    it, _ = to_state(sql_store, STATE.parked, text="read before the restore")
    plan = sql_store.get(it.key).plan
    sql_store.declare_restore(operator="ops")  # the intent may have been sent after the backup: unknown again
    sql_store.park(it.key, operator="ops")  # parked again, same attempt, same lookups: only the epoch moved
    now = sql_store.get(it.key)
    assert (now.generation, now.reconcile_count) == (plan.generation, plan.reconcile_count)
    with pytest.raises(GuardRefused) as refused:
        sql_store.resend(it.key, operator="alice", plan=plan)
    assert refused.value.guard == GUARD.plan_unchanged
    assert sql_store.get(it.key) == now
    assert sql_store.resend(it.key, operator="alice", plan=now.plan).state == STATE.pending


# -- end to end: the cycle comes between the person's look and their move ------------------------------------------


@pytest.fixture
def cycle_during_the_look(monkeypatch):
    """Patch the look-first so that, once it has looked, someone else's whole resend cycle runs before the move."""
    import atmostonce.runtime as runtime

    real = runtime.look_before_sending_again

    def look_then_cycle(store, transport, key, event=None):
        looked = real(store, transport, key, event)
        _someone_elses_cycle(store, key)
        return looked

    monkeypatch.setattr(runtime, "look_before_sending_again", look_then_cycle)


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
def test_the_cli_refuses_a_move_whose_look_another_attempt_overtook(
    capsys, cli_on_json_server, cycle_during_the_look, command
):
    store, url, server, cfg = cli_on_json_server
    it, _ = to_state(store, STATE.parked, text="overtaken look")
    rc, out, _ = run_cli(
        capsys, "--json", *command, it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url
    )
    assert rc == EXIT_REFUSED
    doc = json.loads(out)
    event = EVENT.resend if command == ("resend",) else EVENT.resolve_not_sent
    assert (doc["refused"]["guard"], doc["refused"]["event"]) == (GUARD.plan_unchanged, event)
    assert store.get(it.key).state == STATE.parked
    # run again, the person looks under every key sent so far and decides on the current read
    rc, out, _ = run_cli(capsys, "--json", "resend", it.key, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_OK and json.loads(out)["state"] == STATE.pending
    assert server.posts() == []


def test_bulk_settle_refuses_the_keys_whose_look_another_attempt_overtook(
    capsys, cli_on_json_server, cycle_during_the_look
):
    store, url, server, cfg = cli_on_json_server
    keys = [to_state(store, STATE.parked, text=f"settled in bulk {i}")[0].key for i in range(3)]
    rc, results = settle_parked(capsys, url, "--as", "resend", "--platform-config", cfg)
    assert rc == EXIT_REFUSED
    assert {k: (r["result"], r["refused"]["guard"]) for k, r in results.items()} == {
        k: ("refused", GUARD.plan_unchanged) for k in keys
    }
    assert {store.get(k).state for k in keys} == {STATE.parked}
    assert server.posts() == []


@pytest.mark.parametrize("action", ["resend", "resolve_not_sent"])
def test_the_console_refuses_a_move_whose_look_another_attempt_overtook(
    sql_store, tmp_path, cycle_during_the_look, action
):
    from tests.console.conftest import console_on_json_server, sign_in
    from tests.console.test_console import flash

    it, _ = to_state(sql_store, STATE.parked, text="overtaken in the console")
    with console_on_json_server(sql_store, tmp_path) as (server, c):
        csrf = sign_in(c)
        r = c.post(f"/intents/{it.key}/{action}", data={"csrf": csrf, "reason": "looked"})
        posts = server.posts()
    shown = flash(r.text)
    assert (shown["result"], shown["guard"]) == ("refused", GUARD.plan_unchanged)
    assert sql_store.get(it.key).state == STATE.parked and posts == []
