"""A person's ``resend`` and ``resolve --not-sent`` present the plan of the read they decided on, and are refused
(``plan_unchanged``) when the intent has had another attempt or lookup since (docs/design.md#a-lookup-must-answer-for-its-key).

Before, the look at the store and the platform was about one read and the move about whatever the row was by
then: a whole resend cycle by someone else (their resend, a send whose answer was lost, parked again) that came
between the two left the intent ``parked`` as the look saw it, with a key the look never asked about, and the
second person's move sent it a third time. On every store; end to end with the CLI, the console's settle and
json-server (a REST server nobody here wrote, which does not deduplicate)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from atmostonce import GuardRefused, IllegalMove, IntakeError, Rejected
from atmostonce.errors import IntakeCode
from atmostonce.names import EVENT, GUARD, STATE
from atmostonce.runtime import check_before_sending_again
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED
from tests.helpers import begin_authorize, run_cli, settle_parked, submit, to_state

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
def cycle_before_the_move(monkeypatch):
    """Patch the checks before a person's move so that, once they have checked and looked, someone else's whole
    resend cycle runs before the move's conditional write."""
    import atmostonce.runtime as runtime

    real = runtime.check_before_sending_again

    def check_then_cycle(store, transport, key, event, despite=None):
        checked = real(store, transport, key, event, despite)
        _someone_elses_cycle(store, key)
        return checked

    monkeypatch.setattr(runtime, "check_before_sending_again", check_then_cycle)


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
def test_the_cli_refuses_a_move_whose_look_another_attempt_overtook(
    capsys, cli_on_json_server, cycle_before_the_move, monkeypatch, command
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
    monkeypatch.undo()  # nobody else acts now
    # run again: the person looks under every key sent so far and decides on the current read
    rc, out, _ = run_cli(
        capsys, "--json", "resend", it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url
    )
    assert rc == EXIT_OK and json.loads(out)["state"] == STATE.pending
    assert len(json.loads(out)["lookup"]["looked_up"]) == 2  # the first attempt's key and the other one's
    assert server.posts() == []


def test_bulk_settle_refuses_the_keys_whose_look_another_attempt_overtook(
    capsys, cli_on_json_server, cycle_before_the_move
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
    sql_store, tmp_path, cycle_before_the_move, action
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


# -- from the adversarial review of the change ---------------------------------------------------------------------


def _indeterminate_with_object(store, text):
    it = submit(store, text=text)
    lease = begin_authorize(store, it.key)
    store.record_success(lease, remote_id="r-on-record")
    store.read_back_failed(lease, reason="read back timed out")  # unknown again, its object's id on record
    return store.get(it.key)


@pytest.mark.parametrize("event", sorted(MOVES))
def test_no_plan_is_given_for_a_read_the_checks_did_not_cover(store, event):
    # not parked yet: nothing is checked, so no plan comes back; the reconciler could park it next without
    # another attempt or lookup, and a plan of this read would let the move through with an object on record
    it = _indeterminate_with_object(store, f"not checked {event}")
    with pytest.raises(IllegalMove) as refused:
        check_before_sending_again(store, None, it.key, event)
    assert (refused.value.guard, refused.value.state) == ("source_state", STATE.indeterminate)


def test_the_cli_sends_nothing_again_when_the_reconciler_parks_between_its_read_and_its_move(
    capsys, cli_db, monkeypatch
):
    import atmostonce.runtime as runtime

    url, store = cli_db
    it = _indeterminate_with_object(store, "parked by the reconciler meanwhile")
    real = runtime.refuse_if_object_on_record

    def check_then_the_reconciler_parks(st, key, event, despite=None):
        try:
            return real(st, key, event, despite)
        finally:
            if st.get(key).state == STATE.indeterminate:
                st.park_unreconcilable(st.get(key).plan, reason="lookup.unsupported")

    monkeypatch.setattr(runtime, "refuse_if_object_on_record", check_then_the_reconciler_parks)
    rc, out, _ = run_cli(capsys, "--json", "resend", it.key, "--operator", "alice", "--database-url", url)
    assert rc == EXIT_REFUSED
    assert json.loads(out)["refused"]["guard"] == "source_state"
    assert store.get(it.key).state == STATE.parked  # as the reconciler left it, with its object on record


@pytest.mark.parametrize("command", [("resend",), ("resolve", "--not-sent")], ids=["resend", "resolve-not-sent"])
def test_a_late_answer_recorded_during_the_look_refuses_the_move(capsys, cli_on_json_server, monkeypatch, command):
    import atmostonce.runtime as runtime

    store, url, _, cfg = cli_on_json_server
    it, lease = to_state(store, STATE.parked, text="answered during the look")
    real = runtime.look_before_sending_again

    def look_while_the_answer_arrives(st, transport, key, event=None, despite=None):
        looked = real(st, transport, key, event, despite)
        with pytest.raises(Rejected) as lapsed:  # the worker's lease lapsed: its answer is kept as evidence
            st.record_success(lease, remote_id="r-late")
        st.record_late_outcome(lease, outcome="send.success", refused=lapsed.value, remote_id="r-late")
        return looked

    monkeypatch.setattr(runtime, "look_before_sending_again", look_while_the_answer_arrives)
    rc, out, _ = run_cli(
        capsys, "--json", *command, it.key, "--operator", "alice", "--platform-config", cfg, "--database-url", url
    )
    assert rc == EXIT_REFUSED
    assert json.loads(out)["on_record"] == {"key": it.key, "remote_id": "r-late", "recorded_as": "late_outcome"}
    assert store.get(it.key).state == STATE.parked


@pytest.mark.parametrize("count", [-(2**40), -(2**31) - 1, 2**31, 2**40])
def test_a_plan_reconcile_count_outside_its_32_bit_column_is_bad_input_on_every_store(store, count):
    it, _ = to_state(store, STATE.parked, text=f"count {count}")
    plan = replace(store.get(it.key).plan, reconcile_count=count)
    with pytest.raises(IntakeError) as bad:
        store.resend(it.key, operator="alice", plan=plan)
    assert (bad.value.field, bad.value.code) == ("plan reconcile count", IntakeCode.OUT_OF_RANGE)
    assert store.get(it.key).state == STATE.parked


def test_a_null_plan_in_a_conformance_step_is_no_plan_in_both_drivers():
    from atmostonce import MemoryStore
    from atmostonce.conformance.drivers import _STORE_CALLS
    from tests.conformance.jsonl_driver import Server

    s = MemoryStore()
    it, _ = to_state(s, STATE.parked)
    assert _STORE_CALLS["resend"](s, {"key": it.key, "operator": "alice", "plan": None}).state == STATE.pending
    srv = Server()
    it2 = srv.handle("submit", {"account": "a", "action_kind": "post", "target": "t", "request": {"text": "x"}})
    srv.handle("park", {"key": it2["key"], "operator": "ops"})
    assert srv.handle("resend", {"key": it2["key"], "operator": "alice", "plan": None})["state"] == STATE.pending
