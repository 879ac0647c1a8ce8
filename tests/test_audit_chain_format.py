"""The audit chain's format: the row texts every dialect hashes and how they are hashed.

Every dialect hashes a history row from the same field texts (integers in decimal, a missing
generation as no text), so the texts are the format.
"""

from __future__ import annotations

import hashlib

import pytest

from atmostonce.audit import CHAIN_TAG, chain_hash, field_texts, float_text, history_hash


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
    with pytest.raises(ValueError):
        chain_hash(None, ("x",) * n)
