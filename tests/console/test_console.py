"""The web console's logic through Starlette's TestClient: sign-in is required, every POST needs the session's
CSRF token, each action is the store's guarded move (a refusal is the typed refusal, never a crash), and the
action log names the operator (docs/console.md)."""

from __future__ import annotations

import re

import httpx
import pytest

from tests.console.conftest import TOKEN, csrf_of, make_client, seed_queue, sign_in
from tests.helpers import submit, to_state

pytestmark = pytest.mark.filterwarnings("ignore:Using `httpx` with `starlette.testclient`")


def actions(log) -> list[dict]:
    """The action log without the sign-in rows, newest first."""
    return [row for row in log.rows() if row["action"] != "sign-in"]


def flash(html: str) -> dict[str, str]:
    m = re.search(r'<div class="flash[^"]*" id="flash"([^>]*)>', html)
    assert m, "no flash box on the page"
    return dict(re.findall(r'data-([a-z]+)="([^"]*)"', m.group(1)))


def test_nothing_is_reachable_without_signing_in(console):
    keys = seed_queue(console.store)
    for path in ("/", f"/intents/{keys['parked']}", "/settle", "/policy", "/audit"):
        r = console.get(path, follow_redirects=False)
        assert r.status_code == 303 and r.headers["location"].startswith("/login"), path
    for path in (f"/intents/{keys['parked']}/resolve_not_sent", "/settle", "/policy/kill-switch", "/logout"):
        assert console.post(path, data={"reason": "x"}, follow_redirects=False).status_code == 401, path
    assert console.store.get(keys["parked"]).state == "parked"
    assert actions(console.log) == []


def test_a_wrong_token_does_not_sign_in(console):
    page = console.get("/login")
    r = console.post("/login", data={"csrf": csrf_of(page.text), "token": "nope", "operator": "mallory"})
    assert r.status_code == 401
    [row] = console.log.rows()
    assert (row["action"], row["operator"], next(iter(row["result"]))) == ("sign-in", "mallory", "error")
    assert console.get("/", follow_redirects=False).status_code == 303
    # a shared token needs a name to record
    r = console.post("/login", data={"csrf": csrf_of(page.text), "token": "shared-token", "operator": " "})
    assert r.status_code == 401


def test_the_session_cookie_is_httponly_and_samesite_strict(console):
    page = console.get("/login")
    r = console.post("/login", data={"csrf": csrf_of(page.text), "token": TOKEN}, follow_redirects=False)
    cookie = r.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie
    assert TOKEN not in r.headers["set-cookie"]
    [row] = console.log.rows()
    assert (row["action"], row["operator"], row["result"]) == ("sign-in", "alice", {"done": {"operator": "alice"}})
    assert TOKEN not in console.log.path.read_text("utf-8")


def test_a_post_without_the_csrf_token_is_refused_with_403(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console)
    url = f"/intents/{keys['parked']}/resolve_not_sent"
    assert console.post(url, data={"reason": "no token"}).status_code == 403
    assert console.post(url, data={"reason": "wrong token", "csrf": csrf + "x"}).status_code == 403
    assert (
        console.post("/policy/kill-switch", data={"scope": "global", "engaged": "on", "reason": "r"}).status_code == 403
    )
    assert console.store.get(keys["parked"]).state == "parked"
    assert console.store.policies()["kill_switches"].get("global") in (None, False)
    assert actions(console.log) == []


def test_sign_in_itself_needs_the_csrf_token(console):
    console.get("/login")
    assert console.post("/login", data={"token": TOKEN}).status_code == 403
    assert console.get("/", follow_redirects=False).status_code == 303


def test_the_queue_lists_what_needs_a_person_with_why_and_the_moves_the_table_allows(console):
    from atmostonce_console.queue import build_queue

    store = console.store
    keys = seed_queue(store)
    capped, _ = to_state(store, "failed", text="capped", account="acct-c", max_attempts=1)
    looked, _ = to_state(store, "indeterminate", text="looked at", account="acct-d")
    store.reconcile_not_found(store.get(looked.key).plan)
    not_yet, _ = to_state(store, "indeterminate", text="not looked at yet", account="acct-e")
    waiting = submit(store, text="needs approval", target="review-1", requires_approval=True)

    items, notes = build_queue(store)
    by_key = {q.intent.key: q for q in items}
    assert by_key[keys["parked"]].category == "parked"
    assert by_key[keys["parked"]].actions == ["resolve_published", "resolve_not_sent", "resend"]
    assert "park by operator:alice" in by_key[keys["parked"]].why
    assert by_key[capped.key].category == "failed at the attempt cap"
    assert "park" in by_key[capped.key].actions and "retry" in by_key[capped.key].actions
    assert by_key[looked.key].category == "unknown after reconciliation"
    assert store.table.outcomes["send.unknown"].meaning in by_key[looked.key].why
    assert by_key[waiting.key].category == "approval waiting" and by_key[waiting.key].actions == ["approve"]
    assert keys["failed"] not in by_key and keys["published"] not in by_key and not_yet.key not in by_key
    assert notes["waiting_for_first_look"] == 1
    ages = [q.age for q in items]
    assert ages == sorted(ages, reverse=True)

    sign_in(console)
    html = console.get("/").text
    assert re.findall(r'class="queue-item" data-key="([0-9a-f]+)"', html) == [q.intent.key for q in items]


def test_a_gate_block_is_explained_by_the_guard_that_refused(console):
    from atmostonce_console.queue import why

    store = console.store
    it = submit(store, text="blocked")
    lease = store.begin(it.key)
    store.block_at_gate(lease, reason="gate.blocked:kill_switch_off")
    text = why(store, store.get(it.key))
    assert store.table.outcomes["gate.blocked"].meaning in text
    assert store.table.guards["kill_switch_off"].meaning in text


def test_a_refused_move_is_shown_as_the_typed_refusal_with_the_next_move(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console)
    r = console.post(f"/intents/{keys['failed']}/resolve_not_sent", data={"csrf": csrf, "reason": "checked"})
    assert r.status_code == 200
    assert flash(r.text) == {
        "result": "refused",
        "event": "resolve_not_sent",
        "guard": "source_state",
        "state": "failed",
    }
    row = actions(console.log)[0]
    assert row["operator"] == "alice" and row["subject"] == keys["failed"]
    assert row["result"]["refused"]["guard"] == "source_state"
    assert row["result"]["refused"]["next"] == [{"event": "park", "from": "failed", "to": "parked"}]
    assert console.store.get(keys["failed"]).state == "failed"


def test_an_unknown_key_is_a_refusal_not_a_crash(console):
    csrf = sign_in(console)
    r = console.post("/intents/" + "0" * 64 + "/park", data={"csrf": csrf, "reason": "r"})
    assert flash(r.text)["guard"] == "intent_exists"
    assert console.get("/intents/" + "0" * 64).status_code == 404


def test_park_then_resolve_not_sent_goes_through_the_store_under_the_operator(console):
    store = console.store
    keys = seed_queue(store)
    csrf = sign_in(console)
    r = console.post(f"/intents/{keys['failed']}/park", data={"csrf": csrf, "reason": "looking at it"})
    assert flash(r.text)["result"] == "done"
    r = console.post(
        f"/intents/{keys['failed']}/resolve_not_sent", data={"csrf": csrf, "reason": "not on the platform"}
    )
    assert flash(r.text)["result"] == "done"
    assert store.get(keys["failed"]).state == "failed"
    last = store.history(keys["failed"])[-1]
    assert last.event == "resolve_not_sent" and last.detail["operator"] == "alice"
    assert last.detail["reason"] == "not on the platform"
    done = [(row["action"], row["operator"], next(iter(row["result"]))) for row in actions(console.log)]
    assert done == [("resolve_not_sent", "alice", "done"), ("park", "alice", "done")]


def test_a_blank_reason_is_refused_and_moves_nothing(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console)
    r = console.post(f"/intents/{keys['parked']}/resend", data={"csrf": csrf, "reason": "  "})
    assert flash(r.text)["result"] == "error"
    assert console.store.get(keys["parked"]).state == "parked"


def test_a_shared_token_records_the_name_given_at_sign_in(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console, token="shared-token", operator="bob")
    console.post(f"/intents/{keys['parked']}/resend", data={"csrf": csrf, "reason": "gate fixed"})
    assert console.store.history(keys["parked"])[-1].detail["operator"] == "bob"
    assert actions(console.log)[0]["operator"] == "bob"


def test_resolve_published_is_recorded_as_asserted_when_nothing_can_read_it_back(console):
    store = console.store
    keys = seed_queue(store)
    csrf = sign_in(console)
    url = f"/intents/{keys['parked']}/resolve_published"
    r = console.post(url, data={"csrf": csrf, "reason": "seen", "remote_id": "p-1", "unverified": "no"})
    assert flash(r.text)["result"] == "error"  # no platform config: it cannot be read back
    assert store.get(keys["parked"]).state == "parked"
    r = console.post(url, data={"csrf": csrf, "reason": "seen it", "remote_id": "p-1", "unverified": "yes"})
    assert flash(r.text)["result"] == "done"
    it = store.get(keys["parked"])
    assert (it.state, it.remote_id) == ("published", "p-1")
    ev = store.history(it.key)[-1].detail["evidence"]
    assert ev["verified"] is False and ev["asserted_by"] == "alice"


def test_resolve_published_reads_the_object_back_before_it_is_accepted(sql_store, tmp_path):
    from atmostonce_http import HttpTransport, PlatformSink, sink_config

    store = sql_store
    parked, _ = to_state(store, "parked", text="on the platform")
    with (
        PlatformSink() as sink,
        make_client(store, tmp_path, platform=lambda: HttpTransport(sink_config(sink.url))) as c,
    ):
        created = httpx.post(f"{sink.url}/posts", json=dict(parked.request)).json()["id"]
        csrf = sign_in(c)
        url = f"/intents/{parked.key}/resolve_published"
        r = c.post(url, data={"csrf": csrf, "reason": "seen", "remote_id": "99999", "unverified": "no"})
        assert flash(r.text) == {"result": "not_verified", "outcome": "read_back.not_found"}
        assert store.get(parked.key).state == "parked"
        r = c.post(url, data={"csrf": csrf, "reason": "seen", "remote_id": created, "unverified": "no"})
        assert flash(r.text)["result"] == "done"
        assert store.get(parked.key).state == "published"
        assert store.history(parked.key)[-1].detail["evidence"]["verified"] is True
        assert [next(iter(row["result"])) for row in actions(c.log)] == ["done", "not_verified"]


def test_bulk_settle_needs_the_confirmation_step(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console)
    preview = console.get("/settle", params={"state": "parked", "as": "not-sent"}).text
    assert re.findall(r'class="settle-row" data-key="([0-9a-f]+)"', preview) == [keys["parked"]]
    r = console.post("/settle", data={"csrf": csrf, "as": "not-sent", "keys": keys["parked"], "reason": "r"})
    assert r.status_code == 400
    assert console.store.get(keys["parked"]).state == "parked"


def test_bulk_settle_applies_each_guard_per_intent_and_reports_each_key(console):
    store = console.store
    a, _ = to_state(store, "parked", text="one", account="acct-x")
    b, _ = to_state(store, "parked", text="two", account="acct-x")
    c, _ = to_state(store, "parked", text="three", account="acct-x")
    other, _ = to_state(store, "parked", text="four", account="acct-y")
    csrf = sign_in(console)
    preview = console.get("/settle", params={"state": "parked", "account": "acct-x", "as": "not-sent"}).text
    keys = re.search(r'name="keys" value="([^"]*)"', preview).group(1).split()
    assert sorted(keys) == sorted([a.key, b.key, c.key])
    store.resend(c.key, operator="carol")  # moved on after the selection was shown
    r = console.post(
        "/settle",
        data={
            "csrf": csrf,
            "as": "not-sent",
            "keys": " ".join(keys),
            "reason": "none on the platform",
            "confirm": "yes",
        },
    )
    results = dict(re.findall(r'class="settle-result" data-key="([0-9a-f]+)" data-result="(\w+)"', r.text))
    assert results == {a.key: "moved", b.key: "moved", c.key: "refused"}
    assert 'data-guard="source_state"' in r.text
    assert [store.get(k).state for k in (a.key, b.key, c.key, other.key)] == ["failed", "failed", "pending", "parked"]
    rows = {row["subject"]: row for row in actions(console.log)}
    assert {k: next(iter(rows[k]["result"])) for k in keys} == {a.key: "done", b.key: "done", c.key: "refused"}
    assert all(rows[k]["operator"] == "alice" and rows[k]["action"] == "settle:not-sent" for k in keys)


def test_policy_is_visible_and_editable_and_each_edit_is_audited(console):
    store = console.store
    seed_queue(store)
    csrf = sign_in(console)
    console.post("/policy/kill-switch", data={"csrf": csrf, "scope": "acct-a", "engaged": "on", "reason": "incident"})
    console.post(
        "/policy/rate-limit",
        data={"csrf": csrf, "account": "acct-a", "max_sends": "5", "window_seconds": "30", "reason": "r"},
    )
    console.post("/policy/credential", data={"csrf": csrf, "name": "acct-a", "version": "v2", "reason": "rotated"})
    console.post("/policy/contract", data={"csrf": csrf, "name": "http", "version": "2024-01", "reason": "r"})
    console.post("/policy/signing", data={"csrf": csrf, "account": "acct-a", "required": "on", "reason": "r"})
    r = console.post("/policy/rate-limit", data={"csrf": csrf, "account": "acct-a", "max_sends": "-1", "reason": "r"})
    assert flash(r.text)["result"] == "error"
    pol = store.policies()
    assert pol["kill_switches"]["account:acct-a"] is True
    assert (pol["rate_limits"]["acct-a"]["max_sends"], pol["rate_limits"]["acct-a"]["window_seconds"]) == (5, 30.0)
    assert pol["credentials"] == {"acct-a": "v2"} and pol["contracts"] == {"http": "2024-01"}
    assert store.signing_required("acct-a")
    html = console.get("/policy").text
    assert "account:acct-a" in html and "v2" in html and "2024-01" in html
    assert str(pol["text_window_seconds"]) in html
    rows = actions(console.log)
    assert [(x["action"], x["operator"], next(iter(x["result"]))) for x in rows] == [
        ("policy:rate-limit", "alice", "error"),
        ("policy:signing", "alice", "done"),
        ("policy:contract", "alice", "done"),
        ("policy:credential", "alice", "done"),
        ("policy:rate-limit", "alice", "done"),
        ("policy:kill-switch", "alice", "done"),
    ]


def test_a_console_policy_change_is_in_the_database_policy_log_with_the_operator(console):
    store = console.store
    csrf = sign_in(console)
    console.post("/policy/kill-switch", data={"csrf": csrf, "scope": "acct-a", "engaged": "on", "reason": "incident"})
    console.post("/policy/text-window", data={"csrf": csrf, "seconds": "600", "reason": "shorter"})
    r = console.post("/policy/text-window", data={"csrf": csrf, "seconds": "soon", "reason": "r"})
    assert flash(r.text)["result"] == "error"
    changes = [(c.kind, c.name, c.value, c.operator) for c in store.policy_changes()]
    assert changes == [
        ("text_window_seconds", "global", 600, "alice"),
        ("kill_switches", "account:acct-a", True, "alice"),
    ]
    assert store.policies()["text_window_seconds"] == 600
    table = console.get("/policy").text.split('id="policy-changes"')[1].split("</table>")[0]
    assert table.count("<td>alice</td>") == 2 and "text_window_seconds" in table and "account:acct-a" in table


def test_a_retry_from_the_console_names_the_operator_in_the_history(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console)
    console.post(f"/intents/{keys['failed']}/retry", data={"csrf": csrf, "reason": "platform back"})
    last = console.store.history(keys["failed"])[-1]
    assert (last.event, last.actor, last.detail["operator"]) == ("retry", "operator:alice", "alice")


def test_approve_and_withdraw_from_the_intent_page(console):
    store = console.store
    it = submit(store, text="please approve", target="review-9", requires_approval=True)
    csrf = sign_in(console)
    r = console.post(f"/intents/{it.key}/approve", data={"csrf": csrf, "reason": "read it", "expires_in": "600"})
    assert flash(r.text)["result"] == "done"
    (a,) = store.approvals(it.key)
    assert a.approver == "alice"
    r = console.post(f"/intents/{it.key}/withdraw", data={"csrf": csrf, "approval_id": a.approval_id, "reason": "typo"})
    assert flash(r.text)["result"] == "done"
    assert store.approval(a.approval_id).state == "withdrawn"
    r = console.post(
        f"/intents/{it.key}/withdraw", data={"csrf": csrf, "approval_id": a.approval_id, "reason": "again"}
    )
    assert flash(r.text)["result"] == "refused"


def test_the_intent_page_shows_what_is_needed_to_find_the_post(console):
    from atmostonce.identity import platform_idempotency_key

    store = console.store
    keys = seed_queue(store)
    sign_in(console)
    it = store.get(keys["parked"])
    html = console.get(f"/intents/{it.key}").text
    assert platform_idempotency_key(it.key, it.resend_epoch, it.fence_epoch) in html
    assert "parked one" in html  # the request body
    events = re.findall(r'class="history-row" data-event="(\w+)"', html)
    assert events == [h.event for h in store.history(it.key)]
    assert "record_unknown" in html and "unknown" in html  # the reconciliation record of the unknown send


def test_an_uncertain_claim_is_in_the_queue_and_settled_by_a_person(console):
    from atmostonce_console.queue import build_queue

    s = console.store
    it = submit(s, text="gated", target="review-3", requires_approval=True)
    apv = s.approve(it.key, approver="bob", expires_in=600)
    claim = s.reserve_claim(it.key, approval_id=apv.approval_id, request_digest=it.request_digest, owner="w1")
    lease = s.begin(it.key, lease_seconds=30)
    s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)
    s.record_unknown(lease, reason="connection reset")
    assert s.claim("review-3").state == "uncertain"
    items, notes = build_queue(s)
    [q] = [q for q in items if q.category == "uncertain claim"]
    assert q.intent.key == it.key and q.detail["claim"] == "uncertain"
    assert notes["waiting_for_first_look"] == 1  # the intent itself waits for the reconciler's first look
    csrf = sign_in(console)
    html = console.get(f"/intents/{it.key}").text
    assert "bound to this intent" in html
    console.post(f"/intents/{it.key}/park", data={"csrf": csrf, "reason": "looking"})
    r = console.post(f"/intents/{it.key}/resolve_not_sent", data={"csrf": csrf, "reason": "not there"})
    assert flash(r.text)["result"] == "done"
    assert s.claim("review-3").state == "free"


def test_retract_queues_a_retraction_of_a_published_intent(console):
    keys = seed_queue(console.store)
    csrf = sign_in(console)
    r = console.post(f"/intents/{keys['published']}/retract", data={"csrf": csrf, "reason": "wrong price"})
    assert flash(r.text)["result"] == "done"
    row = actions(console.log)[0]
    assert (row["action"], row["operator"]) == ("retract", "alice")
    retraction = console.store.get(row["result"]["done"]["retraction"])
    assert retraction.state == console.store.table.initial and retraction.request["remote_id"] == "r-1"
    r = console.post(f"/intents/{keys['parked']}/retract", data={"csrf": csrf, "reason": "not published"})
    assert flash(r.text)["result"] == "error"


def test_signing_out_ends_the_session(console):
    csrf = sign_in(console)
    assert console.post("/logout", data={"csrf": csrf}, follow_redirects=False).status_code == 303
    assert console.get("/", follow_redirects=False).status_code == 303


class _DownStore:
    """The store, with reads failing as when its database is unreachable."""

    def __init__(self, store):
        self._store = store

    def __getattr__(self, name):
        if name in ("list_intents", "find"):
            from atmostonce.errors import StoreError

            def down(*a, **kw):
                raise StoreError("database unreachable")

            return down
        return getattr(self._store, name)


def test_a_store_error_is_a_503_page_not_a_crash(sql_store, tmp_path):
    with make_client(_DownStore(sql_store), tmp_path) as c:
        page = c.get("/login")
        c.post("/login", data={"csrf": csrf_of(page.text), "token": TOKEN}, follow_redirects=False)
        r = c.get("/")
        assert r.status_code == 503 and r.text.startswith("store error:")


@pytest.mark.parametrize("action", ["resend", "resolve_not_sent"])
def test_sending_again_from_the_console_is_refused_when_the_platform_holds_the_post(sql_store, tmp_path, action):
    from atmostonce.identity import platform_idempotency_key
    from atmostonce.runtime import wire_request
    from atmostonce_http import HttpTransport
    from tests.http.jsonserver import JsonServer, profile

    store = sql_store
    parked, _ = to_state(store, "parked", text="landed late")
    other, _ = to_state(store, "parked", text="never landed")
    (tmp_path / "js").mkdir()
    with (
        JsonServer(tmp_path / "js") as server,  # a REST server nobody here wrote; it does not deduplicate
        make_client(store, tmp_path, platform=lambda: HttpTransport(profile(server.url))) as c,
    ):
        with HttpTransport(profile(server.url)) as t:
            landed = t.send(wire_request(store.get(parked.key))).remote_id
        csrf = sign_in(c)
        r = c.post(f"/intents/{parked.key}/{action}", data={"csrf": csrf, "reason": "looked"})
        assert flash(r.text) == {"result": "found_on_platform", "remote": landed}
        assert store.get(parked.key).state == "parked"
        r = c.post(f"/intents/{other.key}/{action}", data={"csrf": csrf, "reason": "looked"})
        assert flash(r.text)["result"] == "done"
        assert store.get(other.key).state in ("pending", "failed")
        done = actions(c.log)[0]["result"]["done"]
        assert done["looked_up"] == [platform_idempotency_key(other.key, 0, 0)]
