"""The audit chain's row texts and the reconciliation rule, exactly (issue 8: mutmut survivors of
``atmostonce.audit``, second round).

Every dialect hashes a history row from the same field texts (integers in decimal, a missing
generation as no text), so the texts are the format. ``reconciliation_step`` derives from the table what
each move writes into the reconciliation records; a person settles an unknown send only by a move out of
a human-owned state to a proven result, which the tests check on variants of the shipped table.
"""

from __future__ import annotations

import dataclasses
import hashlib
from types import MappingProxyType

import pytest

from atmostonce.audit import CHAIN_TAG, chain_hash, field_texts, float_text, history_hash, reconciliation_step
from atmostonce.table import table


def test_field_texts_writes_seq_and_generation_in_decimal():
    texts = field_texts(12, "k", "begin", "worker", "pending", "pending", "tok", 40, "{}", 2.5)
    assert texts == ("12", "k", "begin", "worker", "pending", "pending", "tok", "40", "{}", float_text(2.5))
    submitted = field_texts(1, "k", "submit", "client", None, "pending", None, None, "{}", 2.5)
    assert (submitted[0], submitted[4], submitted[6], submitted[7]) == ("1", None, None, None)


def test_history_hash_is_the_chain_hash_of_the_rows_texts():
    values = (3, "k", "begin", "worker", "pending", "pending", "tok", 9, '{"a":1}', 7.0)
    assert history_hash("p" * 64, *values) == chain_hash("p" * 64, field_texts(*values))
    # the texts are what is hashed: another seq or generation is another hash
    assert history_hash(None, *values) != history_hash(None, 4, *values[1:])
    assert history_hash(None, *values) != history_hash(None, *values[:7], 10, *values[8:])


def test_chain_hash_is_sha256_of_the_tag_the_previous_hash_and_length_prefixed_texts():
    fields = ("1", "k", "submit", "client", None, "pending", None, None, "{}", float_text(1.0))
    parts = ["~;", "1:1;", "1:k;", "6:submit;", "6:client;", "~;", "7:pending;", "~;", "~;", "2:{};"]
    payload = CHAIN_TAG + "\n" + "".join(parts) + f"16:{float_text(1.0)};"
    assert chain_hash(None, fields) == hashlib.sha256(payload.encode()).hexdigest()
    # a non-ASCII text is prefixed with its UTF-8 length and hashed as UTF-8
    accented = ("1", "é", *fields[2:])
    payload2 = payload.replace("1:k;", "2:é;")
    assert chain_hash(None, accented) == hashlib.sha256(payload2.encode("utf-8")).hexdigest()


@pytest.mark.parametrize("n", [0, 9, 11])
def test_chain_hash_refuses_a_row_with_the_wrong_number_of_fields(n):
    with pytest.raises(ValueError) as info:
        chain_hash(None, ("x",) * n)
    assert str(info.value) == f"a history row has 10 fields, got {n}"


# ---------------------------------------------------------------- reconciliation_step on table variants
def variant(**events):
    """The shipped table with some events replaced (name -> field changes)."""
    t = table()
    changed = dict(t.events)
    for name, fields in events.items():
        changed[name] = dataclasses.replace(t.events[name], **fields)
    return dataclasses.replace(t, events=MappingProxyType(changed))


def test_the_shipped_table_settles_only_a_persons_resolution_of_a_parked_intent():
    t = table()
    settles = {e: reconciliation_step(t, e) for e in t.events if (reconciliation_step(t, e) or ("",))[0] == "settle"}
    assert settles == {"resolve_published": ("settle", "confirmed"), "resolve_not_sent": ("settle", "failed")}
    assert reconciliation_step(t, "resend") is None  # back to pending: proves nothing


def test_a_machine_moving_a_parked_intent_to_a_result_settles_nothing():
    # a non-human actor resolving a human-owned intent is no settlement by a person
    t = variant(resolve_published={"actor": "reconciler"})
    assert t.actors["reconciler"].human is False
    assert reconciliation_step(t, "resolve_published") is None


def test_a_person_moving_an_intent_that_is_not_human_owned_to_a_result_settles_nothing():
    # an operator move from pending straight to published: human, a result, but not out of a human-owned state
    t = variant(resolve_published={"sources": ("pending",)})
    assert reconciliation_step(t, "resolve_published") is None


def test_a_person_moving_a_parked_intent_back_to_unknown_settles_nothing():
    # an operator re-opening a parked intent for reconciliation (already unknown, so no new record opens):
    # human and out of a human-owned state, but "unknown" is no settlement
    t = variant(resolve_published={"sources": ("parked", "indeterminate"), "target": "indeterminate"})
    assert reconciliation_step(t, "resolve_published") is None
    # the same move into a proven result does settle
    t2 = variant(resolve_published={"sources": ("parked", "indeterminate")})
    assert reconciliation_step(t2, "resolve_published") == ("settle", "confirmed")
