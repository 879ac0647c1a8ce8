"""A refusal names what was refused, by whom, in which state, in its message and in ``as_dict()``.

``as_dict()`` is what the CLI prints as ``{"refused": ...}`` (adapters/atmostonce_cli/main.py), so its keys are
a contract; the message is what an operator reads in a log line.
"""

from __future__ import annotations

import pytest

from atmostonce import MemoryStore
from atmostonce.errors import GuardRefused, IllegalMove, Rejected

KEY = "0123456789abcdef" * 4


def test_the_message_names_event_key_prefix_guard_and_state():
    msg = str(Rejected("retry", KEY, "source_state", "pending"))
    assert msg == "retry refused for 0123456789ab… by source_state (state pending)"


def test_a_refusal_without_state_or_detail_adds_nothing_after_the_guard():
    assert str(Rejected("begin", KEY, "intent_exists", None)) == "begin refused for 0123456789ab… by intent_exists"


def test_detail_follows_a_colon_only_when_given():
    assert str(Rejected("park", KEY, "operator_identified", "failed", "empty operator")).endswith(
        "by operator_identified (state failed): empty operator"
    )
    assert not str(Rejected("park", KEY, "operator_identified", "failed", "")).endswith(":")
    assert Rejected("park", KEY, "g", "failed").detail == ""


def test_as_dict_has_exactly_the_documented_keys():
    exc = GuardRefused("authorize_dispatch", KEY, "lease_live", "pending", "lease expired")
    assert exc.as_dict() == {"event": "authorize_dispatch", "key": KEY, "guard": "lease_live", "state": "pending"}


def test_a_real_refusal_from_the_model_carries_the_same_fields():
    store = MemoryStore()
    intent = store.submit("acct", "post", "room", {"text": "hi"})
    with pytest.raises(IllegalMove) as info:
        store.retry(intent.key)  # retry is a move from failed only
    d = info.value.as_dict()
    assert d == {"event": "retry", "key": intent.key, "guard": "source_state", "state": "pending"}
    assert str(info.value).startswith(f"retry refused for {intent.key[:12]}… by source_state (state pending)")
