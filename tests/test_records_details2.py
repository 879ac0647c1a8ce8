"""Intake validation of ``atmostonce.records``, exactly (mutmut survivors, second round): each refusal is an
``IntakeError`` that names the argument (or the path inside the request), each limit is checked on both
sides of its boundary, and a refused submission leaves nothing in the store."""

from __future__ import annotations

import datetime

import pytest

from atmostonce import IntakeError
from atmostonce.records import (
    MAX_CAP,
    MAX_LEASE_SECONDS,
    check_json_object,
    prepare_submission,
    validate_lease_seconds,
)

AWARE = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)


def refusal(fn, *args, **kw):
    with pytest.raises(IntakeError) as info:
        fn(*args, **kw)
    return str(info.value)


def nested_dicts(levels: int):
    """A value whose leaf sits ``levels`` objects deep: {"a": {"a": ... 1}}."""
    v = 1
    for _ in range(levels):
        v = {"a": v}
    return v


def nested_lists(levels: int):
    """A value whose leaf sits ``levels`` arrays deep: [[... 1]]."""
    v = 1
    for _ in range(levels):
        v = [v]
    return v


# -- datetimes anywhere in a request or a JSON object ---------------------------------------------


def test_a_naive_datetime_is_refused_as_naive_by_its_path():
    naive = datetime.datetime(2020, 1, 1)
    assert refusal(check_json_object, "descriptor", {"at": naive}) == (
        "descriptor.at: naive datetime; give a timezone-aware one"
    )


class _NoOffset(datetime.tzinfo):
    """A tzinfo that knows no offset: Python counts such a datetime as naive."""

    def utcoffset(self, dt):
        return None

    def dst(self, dt):
        return None

    def tzname(self, dt):
        return None


def test_a_datetime_whose_tzinfo_gives_no_offset_counts_as_naive():
    at = datetime.datetime(2020, 1, 1, tzinfo=_NoOffset())
    assert at.tzinfo is not None and at.utcoffset() is None
    assert refusal(check_json_object, "descriptor", {"at": at}) == (
        "descriptor.at: naive datetime; give a timezone-aware one"
    )


@pytest.mark.parametrize("container", [list, tuple])
def test_a_datetime_inside_an_array_is_refused_by_its_index(container):
    assert refusal(check_json_object, "descriptor", {"at": container([1, AWARE])}) == (
        "descriptor.at[1]: datetimes are not JSON; send an ISO 8601 string"
    )


def test_a_datetime_in_an_array_in_an_object_in_an_array_names_the_whole_path():
    value = {"items": [{"when": [AWARE]}]}
    assert refusal(check_json_object, "descriptor", value) == (
        "descriptor.items[0].when[0]: datetimes are not JSON; send an ISO 8601 string"
    )


def test_a_datetime_in_a_request_is_refused_by_prepare_submission():
    assert refusal(prepare_submission, "acct", "post", "room-1", {"text": "hi", "at": [AWARE]}) == (
        "request.at[0]: datetimes are not JSON; send an ISO 8601 string"
    )


# -- nesting depth: 100 levels are taken, 101 are not ----------------------------------------------


def test_objects_nested_100_levels_deep_are_taken_and_101_are_refused_by_path():
    assert check_json_object("descriptor", nested_dicts(100)) == nested_dicts(100)
    assert refusal(check_json_object, "descriptor", nested_dicts(101)) == (
        "descriptor" + ".a" * 101 + ": nested deeper than 100 levels"
    )


def test_arrays_nested_100_levels_deep_are_taken_and_101_are_refused_by_path():
    # the outer object is one level, so 99 arrays put the leaf 100 levels deep
    assert check_json_object("descriptor", {"a": nested_lists(99)}) == {"a": nested_lists(99)}
    assert refusal(check_json_object, "descriptor", {"a": nested_lists(100)}) == (
        "descriptor.a" + "[0]" * 100 + ": nested deeper than 100 levels"
    )


def test_mixed_nesting_counts_objects_and_arrays_alike():
    ok = {"a": [{"a": nested_lists(97)}]}  # 1 + 1 + 1 + 97 = 100 levels
    deep = {"a": [{"a": nested_lists(98)}]}  # 101 levels
    assert check_json_object("descriptor", ok) == ok
    assert refusal(check_json_object, "descriptor", deep) == (
        "descriptor.a[0].a" + "[0]" * 98 + ": nested deeper than 100 levels"
    )


def test_a_request_nested_101_levels_deep_is_refused_by_submit_and_nothing_is_stored(any_store):
    store = any_store.store
    assert refusal(store.submit, "acct", "post", "room-1", {"text": "hi", "deep": nested_dicts(100)}) == (
        "request.deep" + ".a" * 100 + ": nested deeper than 100 levels"
    )
    assert store.list_intents() == []
    it = store.submit("acct", "post", "room-1", {"text": "hi", "deep": nested_dicts(99)})
    assert store.get(it.key).request["deep"] == nested_dicts(99)


# -- names, flags and caps --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("", "post", "room-1"), "account must not be empty"),
        ((7, "post", "room-1"), "account must be a string, got int"),
        (("acct", " ", "room-1"), "action_kind must not be empty"),
        (("acct", b"post", "room-1"), "action_kind must be a string, got bytes"),
        (("acct", "post", "\t"), "target must not be empty"),
        (("acct", "post", "room\x00"), "target contains a NUL byte"),
    ],
)
def test_a_bad_account_action_kind_or_target_is_refused_by_name(args, message):
    assert refusal(prepare_submission, *args, {"text": "hi"}) == message


@pytest.mark.parametrize("name", ["account", "action_kind", "target"])
def test_names_of_1024_characters_are_taken_and_1025_are_refused(name):
    args = {"account": "acct", "action_kind": "post", "target": "room-1"}
    sub = prepare_submission(**{**args, name: "x" * 1024}, request={"text": "hi"})
    assert getattr(sub, name) == "x" * 1024
    assert refusal(prepare_submission, **{**args, name: "x" * 1025}, request={"text": "hi"}) == (
        f"{name} is longer than 1024 characters"
    )


def test_a_submission_needs_no_approval_unless_asked():
    assert prepare_submission("acct", "post", "room-1", {"text": "hi"}).requires_approval is False
    assert prepare_submission("acct", "post", "room-1", {"text": "hi"}, requires_approval=True).requires_approval is True


@pytest.mark.parametrize("flag", [1, 0, "yes", None])
def test_requires_approval_must_be_a_bool_and_is_named(any_store, flag):
    store = any_store.store
    assert refusal(store.submit, "acct", "post", "room-1", {"text": "hi"}, requires_approval=flag) == (
        f"requires_approval must be true or false, got {flag!r}"
    )
    assert store.list_intents() == []


@pytest.mark.parametrize("cap", ["max_attempts", "max_reconciles"])
def test_caps_run_from_1_to_max_cap(cap):
    assert MAX_CAP == 10_000
    low = prepare_submission("acct", "post", "room-1", {"text": "hi"}, **{cap: 1})
    high = prepare_submission("acct", "post", "room-1", {"text": "hi"}, **{cap: MAX_CAP})
    assert getattr(low, cap) == 1 and getattr(high, cap) == MAX_CAP
    for bad in (0, -1, MAX_CAP + 1):
        assert refusal(prepare_submission, "acct", "post", "room-1", {"text": "hi"}, **{cap: bad}) == (
            f"{cap} must be an integer from 1 to 10000, got {bad!r}"
        )


@pytest.mark.parametrize("cap", ["max_attempts", "max_reconciles"])
@pytest.mark.parametrize("bad", [True, 2.0, "3", None])
def test_a_cap_that_is_not_an_int_is_refused_and_nothing_is_stored(any_store, cap, bad):
    # True == 1 and 2.0 == 2, but neither is an integer count
    store = any_store.store
    assert refusal(store.submit, "acct", "post", "room-1", {"text": "hi"}, **{cap: bad}) == (
        f"{cap} must be an integer from 1 to 10000, got {bad!r}"
    )
    assert store.list_intents() == []


# -- lease lengths ------------------------------------------------------------------------------------


def test_a_lease_may_be_shorter_than_a_second():
    assert validate_lease_seconds("lease_seconds", 0.5) == 0.5
    assert validate_lease_seconds("lease_seconds", 1) == 1.0
    assert validate_lease_seconds("lease_seconds", 1e-9) == 1e-9


def test_a_lease_of_exactly_a_year_is_taken_and_a_longer_one_is_not():
    assert MAX_LEASE_SECONDS == 366 * 86_400
    assert validate_lease_seconds("lease_seconds", MAX_LEASE_SECONDS) == MAX_LEASE_SECONDS
    assert validate_lease_seconds("lease_seconds", 366 * 86_400) == MAX_LEASE_SECONDS
    for bad in (MAX_LEASE_SECONDS + 1, 366 * 86_400 + 1, 0, 0.0, -1.0, float("inf"), float("nan")):
        assert refusal(validate_lease_seconds, "lease_seconds", bad) == (
            "lease_seconds must be a positive, finite number of seconds up to 31622400"
        )


def test_an_integer_too_large_for_a_float_is_refused_as_too_large():
    assert refusal(validate_lease_seconds, "window_seconds", 10**400) == "window_seconds is too large"


@pytest.mark.parametrize("bad", [True, "30", None])
def test_a_lease_that_is_not_a_number_is_refused_by_name(bad):
    assert refusal(validate_lease_seconds, "send_lease_seconds", bad) == (
        f"send_lease_seconds must be a number of seconds, got {bad!r}"
    )


def test_begin_refuses_a_huge_lease_and_leaves_the_intent_pending(any_store):
    store = any_store.store
    it = store.submit("acct", "post", "room-1", {"text": "hi"})
    assert refusal(store.begin, it.key, lease_seconds=10**400) == "lease_seconds is too large"
    assert refusal(store.begin, it.key, lease_seconds=MAX_LEASE_SECONDS + 1) == (
        "lease_seconds must be a positive, finite number of seconds up to 31622400"
    )
    after = store.get(it.key)
    assert after.state == "pending" and after.attempt_count == 0 and after.attempt_token is None
    lease = store.begin(it.key, lease_seconds=MAX_LEASE_SECONDS)
    assert lease.expires_at > store.get(it.key).created_at + MAX_LEASE_SECONDS - 60
