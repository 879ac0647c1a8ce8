"""Adversarial review of bulk settle looking first (git diff 5dc4f7a..d1e98ac): ``atmostonce settle --as
resend|not-sent --platform-config`` and the console's settle page call ``look_before_sending_again`` for each
selected intent before moving it (``atmostonce_console.settle.settle(..., look=...)``); ``reconcile`` exits 3
and names ``lookup_failed``; SQL history rows take ``recorded_at`` from the moved row's ``updated_at``.

What each test protects: an intent the platform may hold is never moved by a bulk settle on an answer that
proves nothing; a settle that stops part-way still reports (CLI) and logs (console) every move it made; the
audit chain and history order survive a settle on both SQL dialects. Real sockets and json-server, real SQL
stores; nothing in httpx is mocked."""

from __future__ import annotations

import concurrent.futures
import http.server
import json
import re

import pytest

from atmostonce.audit import verify_store
from atmostonce.identity import platform_idempotency_key
from atmostonce.runtime import wire_request
from atmostonce.transport import NotFound
from atmostonce_cli.main import EXIT_OK, EXIT_REFUSED, EXIT_STORE
from atmostonce_http import HttpTransport
from tests.console.conftest import make_client
from tests.helpers import answer_json, begin_authorize, http_platform, landed_late, run_cli, settle_parked, to_state
from tests.http.jsonserver import JsonServer, profile


class Interrupted(BaseException):
    """What a transport's thread may raise that is not an ``Exception``: a KeyboardInterrupt-like signal, a
    cancellation (``asyncio.CancelledError``), a green-thread timeout (gevent's ``Timeout``)."""


def _console_settle(c, keys, as_="resend"):
    from tests.console.conftest import sign_in

    csrf = sign_in(c)
    return c.post(
        "/settle", data={"csrf": csrf, "as": as_, "keys": " ".join(keys), "reason": "looked", "confirm": "yes"}
    )


def _page_results(html: str) -> dict[str, str]:
    return dict(re.findall(r'class="settle-result" data-key="([0-9a-f]+)" data-result="(\w+)"', html))


def _logged(c, as_="resend") -> dict[str, dict]:
    return {row["subject"]: row["result"] for row in c.log.rows() if row["action"] == f"settle:{as_}"}


# ---------------------------------------------------------------- an answer that proves nothing


class _Garbage(http.server.BaseHTTPRequestHandler):
    """A platform whose lookup answers 200 with ``self.server.body`` (creates and reads are never reached)."""

    def do_GET(self):  # noqa: N802
        with self.server.lock:
            self.server.asked.append(self.path)
        answer_json(self, 200, self.server.body)

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("body", [b"null", b"[null]"], ids=["null", "array-of-null"])
def test_a_lookup_answered_with_a_200_that_names_no_object_settles_nothing(capsys, cli_on_json_server, tmp_path, body):
    """The HTTP transport documents NotFound for a 404 or an empty array only, and an error for "a 200 without
    an id". A 200 whose body is ``null`` (or an array holding ``null``) is neither: it says nothing about the key,
    so a bulk resend must leave the intent where it is (result ``error``), as for any platform error."""
    store, url, _, _ = cli_on_json_server
    it, _ = to_state(store, "parked", text="the platform answers nonsense")
    before = [h.event for h in store.history(it.key)]
    with http_platform(_Garbage, body=body, asked=[]) as srv:
        cfg = tmp_path / "garbage.json"
        cfg.write_text(json.dumps(profile(f"http://127.0.0.1:{srv.server_address[1]}")))
        rc, results = settle_parked(capsys, url, "--as", "resend", "--platform-config", str(cfg))
        assert srv.asked  # the lookup was made
    assert (results[it.key]["result"], results[it.key]["lookup_failed"]) == ("error", True)
    assert rc == EXIT_STORE
    assert store.get(it.key).state == "parked" and [h.event for h in store.history(it.key)] == before


class _AnswersNothingUsable(HttpTransport):
    """A transport (a plugin, an async transport handed to a sync caller) whose lookup returns something that is
    neither ``Found``, ``NotFound`` nor ``Unsupported``."""

    answer: object = None

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        return type(self).answer


class _AnswersNone(_AnswersNothingUsable):
    answer = None


class _AnswersAMapping(_AnswersNothingUsable):
    answer = {"found": True, "remote_id": "123"}


class _AnswersNotFound(_AnswersNothingUsable):
    answer = NotFound("HTTP 200, empty list")


@pytest.mark.parametrize(
    ("transport", "outcome"),
    [(_AnswersNone, "error"), (_AnswersAMapping, "error"), (_AnswersNotFound, "moved")],
    ids=["none", "a-mapping", "not-found"],
)
def test_only_a_not_found_lets_a_console_settle_send_an_intent_again(sql_store, tmp_path, transport, outcome):
    """``look_before_sending_again`` took anything but ``Found`` and ``Unsupported`` as "nothing there", while the
    reconciler asserted ``NotFound``. A bulk settle must not send an intent again on an answer that is not a
    not-found: the key's result is ``error`` and nothing is written; a real ``NotFound`` lets the move through,
    with what was looked up."""
    from tests.console.conftest import console_on_json_server

    it, _ = to_state(sql_store, "parked", text="answered")
    with console_on_json_server(sql_store, tmp_path, transport) as (server, c):
        r = _console_settle(c, [it.key])
        logged = _logged(c)
    assert _page_results(r.text) == {it.key: outcome}
    if outcome == "error":
        assert sql_store.get(it.key).state == "parked"
        assert set(logged[it.key]) == {"error"}
    else:
        assert logged[it.key] == {"done": {"state": "pending", "looked_up": [platform_idempotency_key(it.key, 0, 0)]}}


# ---------------------------------------------------------------- a settle that stops part-way


class _InterruptedOnSecondLookup(HttpTransport):
    """Looks the first intent up on json-server, then raises :class:`Interrupted` (shared count: the console
    makes one transport per request, the CLI one per command)."""

    calls = [0]

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        self.calls[0] += 1
        if self.calls[0] >= 2:
            raise Interrupted("stop")
        return super().lookup(delivery_key, resend_epoch, fence_epoch)


def test_an_interrupt_during_a_console_settle_leaves_every_move_it_made_in_the_action_log(sql_store, tmp_path):
    """The first key is looked up and moved, the second's lookup is interrupted. Whatever the request then
    answers, the action log (the console's audit of what a person did) must hold the first key's move: a move
    the log does not show is a resend nobody can account for."""

    first, _ = to_state(sql_store, "parked", text="looked up and moved")
    second, _ = to_state(sql_store, "parked", text="interrupted")
    _InterruptedOnSecondLookup.calls[0] = 0
    (tmp_path / "js").mkdir()
    with JsonServer(tmp_path / "js") as server:
        c = make_client(sql_store, tmp_path, platform=lambda: _InterruptedOnSecondLookup(profile(server.url)))
        try:  # the interrupt may leave the request (and the test client's event loop) with no answer
            with c:
                _console_settle(c, [first.key, second.key])
        except (Interrupted, RuntimeError, concurrent.futures.CancelledError):
            pass
    logged = _logged(c)
    assert sql_store.get(second.key).state == "parked"  # its lookup gave no answer: untouched
    assert sql_store.get(first.key).state == "pending"  # moved before the interrupt
    assert logged.get(first.key) == {
        "done": {"state": "pending", "looked_up": [platform_idempotency_key(first.key, 0, 0)]}
    }


def test_an_interrupt_during_a_cli_settle_still_reports_the_moves_it_made(capsys, cli_on_json_server, monkeypatch):
    """The CLI's counterpart: a settle interrupted at the second lookup has already moved the first intent;
    what it prints (``--json``: ``results``) must name that move, or the person re-runs the selection blind."""
    import atmostonce_cli.main as cli

    store, url, server, cfg = cli_on_json_server
    first, _ = to_state(store, "parked", text="looked up and moved")
    second, _ = to_state(store, "parked", text="interrupted")
    _InterruptedOnSecondLookup.calls[0] = 0
    monkeypatch.setattr(cli, "_platform", lambda args: _InterruptedOnSecondLookup(profile(server.url)))
    argv = ["--json", "settle", "--state", "parked", "--as", "resend", "--operator", "alice", "--reason", "r"]
    try:
        cli.main([*argv, "--yes", "--platform-config", cfg, "--database-url", url])
    except Interrupted:
        pass
    out, _ = capsys.readouterr()
    assert store.get(first.key).state == "pending" and store.get(second.key).state == "parked"
    assert first.key in out


def test_a_key_the_store_cannot_read_does_not_hide_the_moves_made_before_it(sql_store, tmp_path):
    """The console's settle form takes keys as typed. A key the store refuses to read (over 256 characters:
    ``IntakeError`` from ``store.find``) came after a good key, which was looked up and moved already; the page
    must not answer as if nothing was settled (the preview with an error, one log row for "2 keys"): the good
    key's move is logged as done and the bad key gets its own error."""
    from tests.console.conftest import console_on_json_server

    good, _ = to_state(sql_store, "parked", text="a good key first")
    bad = "a" * 300
    with console_on_json_server(sql_store, tmp_path) as (server, c):
        _console_settle(c, [good.key, bad])
        logged = _logged(c)
    assert sql_store.get(good.key).state == "pending"
    assert logged.get(good.key) == {
        "done": {"state": "pending", "looked_up": [platform_idempotency_key(good.key, 0, 0)]}
    }
    assert set(logged.get(bad, {})) == {"error"}


# ---------------------------------------------------------------- what works and is worth keeping


def test_a_large_mixed_selection_moves_each_intent_once_and_leaves_each_landed_one(capsys, cli_on_json_server):
    """120 parked intents, every tenth of which landed late (some under the first attempt's key after a resend
    cycle, so only an earlier key holds them): exactly those are ``found`` under the key they landed under, the
    rest move, and the worker then posts each of those once: one post per intent in all."""
    store, url, server, cfg = cli_on_json_server
    landed: dict[str, str] = {}
    keys = []
    for i in range(120):
        it, _ = to_state(store, "parked", text=f"intent {i}")
        keys.append(it.key)
        if i % 10 == 0:
            first = wire_request(store.get(it.key))
            if i % 20 == 0:  # resent once, that attempt unknown and parked again: the first send lands now
                store.resend(it.key, operator="bob")
                lease = begin_authorize(store, it.key)
                store.record_unknown(lease, reason="read timeout")
                store.park(it.key, operator="bob")
            with HttpTransport(profile(server.url)) as t:
                t.send(first)
            landed[it.key] = platform_idempotency_key(it.key, 0, 0)
    rc, results = settle_parked(capsys, url, "--as", "resend", "--platform-config", cfg)
    assert rc == EXIT_REFUSED
    assert {k for k, r in results.items() if r["result"] == "found"} == set(landed)
    assert {k: results[k]["found"]["platform_key"] for k in landed} == landed
    assert {r["result"] for k, r in results.items() if k not in landed} == {"moved"}
    assert all(store.get(k).state == "parked" for k in landed)
    rc, _, _ = run_cli(capsys, "--json", "work", "--limit", "1000", "--platform-config", cfg, "--database-url", url)
    assert sorted(p["text"] for p in server.posts()) == sorted(f"intent {i}" for i in range(120))


def test_a_console_settle_of_mixed_states_reports_and_logs_each_key_once(sql_store, tmp_path):
    """Keys in every state a form can carry, plus one the store does not know: the parked ones are looked up
    (one found, one moved), the others are refused by their source state without a lookup; one log row each."""
    from tests.console.conftest import console_on_json_server

    late, _ = to_state(sql_store, "parked", text="landed late")
    lost, _ = to_state(sql_store, "parked", text="never landed")
    pending, _ = to_state(sql_store, "pending", text="queued")
    unknown, _ = to_state(sql_store, "indeterminate", text="unknown")
    published, _ = to_state(sql_store, "published", text="done")
    missing = "f" * 64
    keys = [late.key, lost.key, pending.key, unknown.key, published.key, missing]
    with console_on_json_server(sql_store, tmp_path) as (server, c):
        landed_late(server, sql_store, late.key)
        r = _console_settle(c, keys)
        rows = [row for row in c.log.rows() if row["action"] == "settle:resend"]
    assert _page_results(r.text) == {
        late.key: "found",
        lost.key: "moved",
        pending.key: "refused",
        unknown.key: "refused",
        published.key: "refused",
        missing: "refused",
    }
    assert sorted(row["subject"] for row in rows) == sorted(keys)
    assert [sql_store.get(k).state for k in keys[:5]] == ["parked", "pending", "pending", "indeterminate", "published"]


def test_a_settle_keeps_every_audit_chain_intact_and_its_history_rows_carry_the_moves_time(sql_store, tmp_path):
    """On both dialects: after a bulk settle (found, moved, refused) every chain verifies, each settled
    intent's newest history row is the settle's move, timed at the ``updated_at`` it set, and the rows read
    back in sequence order."""
    from tests.console.conftest import console_on_json_server

    late, _ = to_state(sql_store, "parked", text="landed late")
    lost, _ = to_state(sql_store, "parked", text="never landed")
    failed, _ = to_state(sql_store, "failed", text="failed")
    with console_on_json_server(sql_store, tmp_path) as (server, c):
        landed_late(server, sql_store, late.key)
        _console_settle(c, [late.key, lost.key, failed.key], as_="not-sent")
    report = verify_store(sql_store)
    assert report.intact, report.as_dict()
    h = sql_store.history(lost.key)
    assert h[-1].event == "resolve_not_sent" and h[-1].recorded_at == sql_store.get(lost.key).updated_at
    assert [e.seq for e in h] == sorted(e.seq for e in h)
    assert [e.event for e in sql_store.history(late.key)][-1] == "park"


# ---------------------------------------------------------------- reconcile's exit code


def test_a_reconcile_whose_lookup_is_answered_with_nonsense_names_it_and_exits_3(capsys, cli_on_json_server, tmp_path):
    """A platform that answers the lookup with a 200 naming no usable object (an array of objects without the
    key, which the platform evidently did not filter by) gave no answer: the pass names the send under
    ``lookup_failed`` with its error and exits 3; nothing is written and no lookup is spent."""
    store, url, _, _ = cli_on_json_server
    it, _ = to_state(store, "indeterminate", text="unknown")
    with http_platform(_Garbage, body=b'[{"id": 1, "key": "someone-else"}]', asked=[]) as srv:
        cfg = tmp_path / "garbage.json"
        cfg.write_text(json.dumps(profile(f"http://127.0.0.1:{srv.server_address[1]}")))
        rc, out, _ = run_cli(capsys, "--json", "reconcile", "--platform-config", str(cfg), "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_STORE
    assert [(f["key"], f["state"]) for f in doc["lookup_failed"]] == [(it.key, "indeterminate")]
    assert "did not filter" in doc["lookup_failed"][0]["error"]
    assert store.get(it.key).reconcile_count == 0


def test_a_reconcile_whose_lookups_all_answer_exits_0_without_lookup_failed(capsys, cli_on_json_server):
    store, url, _, cfg = cli_on_json_server
    to_state(store, "indeterminate", text="unknown")
    rc, out, _ = run_cli(capsys, "--json", "reconcile", "--platform-config", cfg, "--database-url", url)
    doc = json.loads(out)
    assert rc == EXIT_OK and "lookup_failed" not in doc and "parked" not in doc


def test_without_a_platform_a_console_settle_moves_and_says_it_was_not_looked_up(sql_store, tmp_path):

    it, _ = to_state(sql_store, "parked", text="no platform")
    with make_client(sql_store, tmp_path) as c:
        r = _console_settle(c, [it.key], as_="not-sent")
        logged = _logged(c, "not-sent")
    assert _page_results(r.text) == {it.key: "moved"}
    assert logged[it.key] == {
        "done": {"state": "failed", "looked_up": [], "not_looked_up": "no platform to look it up"}
    }


class _RaisesValueError(HttpTransport):
    """A transport whose lookup raises an ordinary ``ValueError`` for one intent (its text says which)."""

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        if delivery_key == self.bad[0]:
            raise ValueError("the platform's answer could not be parsed")
        return super().lookup(delivery_key, resend_epoch, fence_epoch)

    bad = [""]


def test_a_lookup_raising_an_ordinary_error_settles_nothing_for_that_key_and_the_others_go_on(sql_store, tmp_path):
    from tests.console.conftest import console_on_json_server

    before, _ = to_state(sql_store, "parked", text="before")
    bad, _ = to_state(sql_store, "parked", text="its lookup raises")
    after, _ = to_state(sql_store, "parked", text="after")
    _RaisesValueError.bad[0] = bad.key
    with console_on_json_server(sql_store, tmp_path, _RaisesValueError) as (server, c):
        r = _console_settle(c, [before.key, bad.key, after.key], as_="not-sent")
        logged = _logged(c, "not-sent")
    assert _page_results(r.text) == {before.key: "moved", bad.key: "error", after.key: "moved"}
    assert logged[bad.key] == {"error": "lookup failed: ValueError: the platform's answer could not be parsed"}
    assert [sql_store.get(k).state for k in (before.key, bad.key, after.key)] == ["failed", "parked", "failed"]


class _ResentDuringEachLookup(HttpTransport):
    """Each lookup finds nothing, but meanwhile another person resends the intent and its send is parked again:
    the look never sees the same attempts twice."""

    store = None

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        res = super().lookup(delivery_key, resend_epoch, fence_epoch)
        s = type(self).store
        s.resend(delivery_key, operator="bob")
        lease = begin_authorize(s, delivery_key)
        s.record_unknown(lease, reason="read timeout")
        s.park(delivery_key, operator="bob")
        return res


def test_an_intent_resent_again_and_again_during_its_look_is_refused_as_a_lost_race(sql_store, tmp_path):
    from tests.console.conftest import console_on_json_server

    it, _ = to_state(sql_store, "parked", text="raced during the look")
    _ResentDuringEachLookup.store = sql_store
    with console_on_json_server(sql_store, tmp_path, _ResentDuringEachLookup) as (server, c):
        r = _console_settle(c, [it.key])
        logged = _logged(c)
    assert _page_results(r.text) == {it.key: "refused"}
    assert logged[it.key]["refused"]["guard"] == "lost_race"
    assert sql_store.get(it.key).state == "parked"
    ours = [h for h in sql_store.history(it.key) if h.event == "resend" and "alice" in (h.actor or "")]
    assert ours == []  # every resend in the history is the other person's


def test_the_reconciliation_record_a_move_opens_carries_the_time_of_its_history_row(sql_store):
    """``record_unknown`` writes its history row and opens the send's reconciliation record (``send_seq``: that
    row). The history row now carries the move's one clock reading (``updated_at``); the record still takes a
    second reading, so ``intents show`` prints one move at two wall times (the model records both at one
    ``now``). The record opened by the move is timed as the move is."""
    it, _ = to_state(sql_store, "indeterminate", text="unknown")
    (row,) = [h for h in sql_store.history(it.key) if h.event == "record_unknown"]
    (rec,) = sql_store.reconciliations(it.key)
    assert rec.send_seq == row.seq and rec.result == "unknown"
    assert rec.recorded_at == row.recorded_at == sql_store.get(it.key).updated_at
