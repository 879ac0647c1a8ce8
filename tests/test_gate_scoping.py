"""Each policy row and fence applies to the intent it is about, and only to it; the positive cases.

The existing gate tests show that each condition, when it holds against the intent, stops the send.
These show the other half, on every store: a condition about *another* account, platform or source does
not stop this intent, a released kill switch no longer stops anything, a matching version passes, and a
fence compares every part the worker presents (token and generation; generation and reconcile count).
"""

from __future__ import annotations

import dataclasses

import pytest

from atmostonce.errors import GuardRefused

URL = "https://example.test/page"


def _leased(s, account="acct", text="hello"):
    it = s.submit(account, "post", "room", {"text": text})
    return it, s.begin(it.key)


def _authorize(s, it, lease, **kw):
    return s.authorize_dispatch(lease, request_digest=it.request_digest, **kw)


def test_a_released_kill_switch_stops_nothing(any_store):
    s = any_store.store
    s.set_kill_switch("global", True, operator="ops")
    s.set_kill_switch("global", False, operator="ops")
    s.set_kill_switch("account:acct", True, operator="ops")
    s.set_kill_switch("account:acct", False, operator="ops")
    it, lease = _leased(s)
    assert _authorize(s, it, lease).state == "authorized"


def test_another_accounts_kill_switch_does_not_stop_this_account(any_store):
    s = any_store.store
    s.set_kill_switch("account:someone-else", True, operator="ops")
    it, lease = _leased(s)
    assert _authorize(s, it, lease).state == "authorized"
    other, other_lease = _leased(s, account="someone-else", text="theirs")
    with pytest.raises(GuardRefused) as e:
        _authorize(s, other, other_lease)
    assert e.value.guard == "kill_switch_off"


def test_a_matching_contract_version_passes_and_other_platforms_versions_do_not_count(any_store):
    s = any_store.store
    s.set_contract_version("platform-a", "v2")
    s.set_contract_version("platform-b", "v9")
    it, lease = _leased(s)
    assert _authorize(s, it, lease, platform="platform-a", contract_version="v2").state == "authorized"


def test_a_contract_version_mismatch_on_the_workers_platform_stops_it(any_store):
    s = any_store.store
    s.set_contract_version("platform-a", "v2")
    it, lease = _leased(s)
    with pytest.raises(GuardRefused) as e:
        _authorize(s, it, lease, platform="platform-a", contract_version="v1")
    assert e.value.guard == "contract_supported"


def test_a_matching_credential_passes_and_other_accounts_credentials_do_not_count(any_store):
    s = any_store.store
    s.set_credential_version("acct", "c2")
    s.set_credential_version("someone-else", "c7")
    it, lease = _leased(s)
    assert _authorize(s, it, lease, credential_version="c2").state == "authorized"


def test_a_lease_with_the_right_token_but_another_generation_is_refused(any_store):
    s = any_store.store
    it, lease = _leased(s)
    forged = dataclasses.replace(lease, generation=lease.generation + 1)
    with pytest.raises(GuardRefused) as e:
        _authorize(s, it, forged)
    assert e.value.guard == "lease_holder"
    assert _authorize(s, it, lease).state == "authorized"  # the real lease still works


def test_an_intent_resting_on_the_current_head_is_authorized(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    s.capture_source("https://example.test/other", "unrelated")  # another source's head does not count
    it = s.submit("acct", "post", "room", {"text": "about one"}, source=(URL, v1.version))
    lease = s.begin(it.key)
    assert _authorize(s, it, lease).state == "authorized"


def test_another_sources_new_head_does_not_stop_an_intent(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    it = s.submit("acct", "post", "room", {"text": "about one"}, source=(URL, v1.version))
    lease = s.begin(it.key)
    s.capture_source("https://example.test/other", "moved")
    assert _authorize(s, it, lease).state == "authorized"


def test_a_one_character_operator_name_is_a_named_operator(any_store):
    s = any_store.store
    it = s.submit("acct", "post", "room", {"text": "hi"})
    assert s.park(it.key, operator="z").state == "parked"


def _indeterminate(s):
    it, lease = _leased(s)
    _authorize(s, it, lease)
    s.record_unknown(lease, reason="connection reset after write")
    return s.get(it.key)


def test_a_plan_with_a_stale_generation_moves_nothing(any_store):
    s = any_store.store
    intent = _indeterminate(s)
    plan = intent.plan
    stale = dataclasses.replace(plan, generation=(plan.generation or 0) + 1)
    with pytest.raises(GuardRefused) as e:
        s.reconcile_not_found(stale)
    assert e.value.guard == "plan_unchanged"
    assert s.get(intent.key).state == "indeterminate"
    s.reconcile_not_found(plan)  # the plan as taken still applies
    assert s.get(intent.key).reconcile_count == intent.reconcile_count + 1
