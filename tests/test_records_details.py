"""The record value checks, exactly (docs/mutmut.md: mutmut survivors of ``atmostonce.records``): each refusal
names the argument, and a size limit is checked at N and N+1."""

from __future__ import annotations

import datetime

import pytest

from atmostonce import IntakeError
from atmostonce.identity import canonical_json
from atmostonce.records import check_json_object, check_limit


def refusal(fn, *args, **kw):
    with pytest.raises(IntakeError) as info:
        fn(*args, **kw)
    return str(info.value)


def test_a_json_object_must_be_a_mapping_and_is_named():
    assert refusal(check_json_object, "descriptor", [1]) == "descriptor must be a JSON object, got list"


def test_a_datetime_inside_a_json_object_is_refused_by_its_path():
    at = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)
    assert refusal(check_json_object, "descriptor", {"at": at}) == (
        "descriptor.at: datetimes are not JSON; send an ISO 8601 string"
    )


def test_a_value_without_canonical_json_is_refused_with_the_name():
    assert refusal(check_json_object, "descriptor", {"x": float("nan")}) == (
        "descriptor: $.x: NaN and infinities have no canonical JSON form"
    )


def test_a_json_object_of_exactly_max_bytes_is_taken_and_one_byte_more_is_not():
    size = len(canonical_json({"a": "b"}))
    assert check_json_object("descriptor", {"a": "b"}, max_bytes=size) == {"a": "b"}
    assert refusal(check_json_object, "descriptor", {"a": "b"}, max_bytes=size - 1) == (
        f"descriptor is larger than {size - 1} bytes"
    )


def test_a_limit_of_zero_is_taken_and_a_negative_one_is_named():
    assert check_limit(0) == 0
    assert refusal(check_limit, -1) == "limit must be a non-negative integer, got -1"
