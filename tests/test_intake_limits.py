"""Intake limits: what ``submit``, ``begin`` and the record checks of ``atmostonce.records`` take and refuse.

Each refusal is an ``IntakeError`` whose structured fields say which argument (or which path inside the
request) was refused, why (``code``, an ``IntakeCode``) and the bound it crossed (``limit``); each limit is
checked on both sides of its boundary, and a refused submission leaves nothing in the store. The messages
are for a person and are not pinned here."""

from __future__ import annotations

import datetime

import pytest

from atmostonce import IntakeCode, IntakeError, identity
from atmostonce.identity import (
    NORMALIZER_VERSION,
    canonical_json,
    delivery_key,
    load_canonical,
    request_digest,
    text_digest,
)
from atmostonce.records import (
    DEFAULT_MAX_ATTEMPTS,
    DEFAULT_MAX_RECONCILES,
    MAX_CAP,
    MAX_DEPTH,
    MAX_DETAIL_BYTES,
    MAX_LEASE_SECONDS,
    MAX_NAME_BYTES,
    MAX_TEXT_CHARS,
    check_json_object,
    check_limit,
    check_text,
    person_name,
    prepare_submission,
    validate_lease_seconds,
)

AWARE = datetime.datetime(2020, 1, 1, tzinfo=datetime.UTC)


def refusal(fn, *args, **kw):
    """``(field, code, limit)`` of the ``IntakeError`` that ``fn(*args, **kw)`` raises."""
    with pytest.raises(IntakeError) as info:
        fn(*args, **kw)
    e = info.value
    return (e.field, e.code, e.limit)


NOT_JSON = IntakeCode.DATETIME


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
    assert refusal(check_json_object, "descriptor", {"at": naive}) == ("descriptor.at", IntakeCode.NAIVE_DATETIME, None)


def test_an_aware_datetime_inside_a_json_object_is_refused_by_its_path():
    assert refusal(check_json_object, "descriptor", {"at": AWARE}) == ("descriptor.at", NOT_JSON, None)


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
    assert refusal(check_json_object, "descriptor", {"at": at}) == ("descriptor.at", IntakeCode.NAIVE_DATETIME, None)


@pytest.mark.parametrize("container", [list, tuple])
def test_a_datetime_inside_an_array_is_refused_by_its_index(container):
    assert refusal(check_json_object, "descriptor", {"at": container([1, AWARE])}) == (
        "descriptor.at[1]",
        NOT_JSON,
        None,
    )


def test_a_datetime_in_an_array_in_an_object_in_an_array_names_the_whole_path():
    value = {"items": [{"when": [AWARE]}]}
    assert refusal(check_json_object, "descriptor", value) == ("descriptor.items[0].when[0]", NOT_JSON, None)


def test_a_datetime_in_a_request_is_refused_by_prepare_submission():
    assert refusal(prepare_submission, "acct", "post", "room-1", {"text": "hi", "at": [AWARE]}) == (
        "request.at[0]",
        NOT_JSON,
        None,
    )


# -- nesting depth: 100 levels are taken, 101 are not ----------------------------------------------


def deeper(path):
    return (path, IntakeCode.TOO_DEEP, 100)


def test_objects_nested_100_levels_deep_are_taken_and_101_are_refused_by_path():
    assert MAX_DEPTH == 100
    assert check_json_object("descriptor", nested_dicts(100)) == nested_dicts(100)
    assert refusal(check_json_object, "descriptor", nested_dicts(101)) == deeper("descriptor" + ".a" * 101)


def test_arrays_nested_100_levels_deep_are_taken_and_101_are_refused_by_path():
    # the outer object is one level, so 99 arrays put the leaf 100 levels deep
    assert check_json_object("descriptor", {"a": nested_lists(99)}) == {"a": nested_lists(99)}
    assert refusal(check_json_object, "descriptor", {"a": nested_lists(100)}) == deeper("descriptor.a" + "[0]" * 100)


def test_mixed_nesting_counts_objects_and_arrays_alike():
    ok = {"a": [{"a": nested_lists(97)}]}  # 1 + 1 + 1 + 97 = 100 levels
    deep = {"a": [{"a": nested_lists(98)}]}  # 101 levels
    assert check_json_object("descriptor", ok) == ok
    assert refusal(check_json_object, "descriptor", deep) == deeper("descriptor.a[0].a" + "[0]" * 98)


def test_a_request_nested_101_levels_deep_is_refused_by_submit_and_nothing_is_stored(any_store):
    store = any_store.store
    assert refusal(store.submit, "acct", "post", "room-1", {"text": "hi", "deep": nested_dicts(100)}) == deeper(
        "request.deep" + ".a" * 100
    )
    assert store.list_intents() == []
    it = store.submit("acct", "post", "room-1", {"text": "hi", "deep": nested_dicts(99)})
    assert store.get(it.key).request["deep"] == nested_dicts(99)


# -- names, flags and caps --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "field", "code"),
    [
        (("", "post", "room-1"), "account", IntakeCode.EMPTY),
        ((7, "post", "room-1"), "account", IntakeCode.NOT_STRING),
        (("acct", " ", "room-1"), "action_kind", IntakeCode.EMPTY),
        (("acct", b"post", "room-1"), "action_kind", IntakeCode.NOT_STRING),
        (("acct", "post", "\t"), "target", IntakeCode.EMPTY),
        (("acct", "post", "room\x00"), "target", IntakeCode.NUL_BYTE),
    ],
)
def test_a_bad_account_action_kind_or_target_is_refused_by_name(args, field, code):
    assert refusal(prepare_submission, *args, {"text": "hi"}) == (field, code, None)


@pytest.mark.parametrize("name", ["account", "action_kind", "target"])
def test_names_of_1024_characters_are_taken_and_1025_are_refused(name):
    args = {"account": "acct", "action_kind": "post", "target": "room-1"}
    sub = prepare_submission(**{**args, name: "x" * 1024}, request={"text": "hi"})
    assert getattr(sub, name) == "x" * 1024
    assert refusal(prepare_submission, **{**args, name: "x" * 1025}, request={"text": "hi"}) == (
        name,
        IntakeCode.TOO_LONG,
        1024,
    )


def test_a_submission_needs_no_approval_unless_asked():
    assert prepare_submission("acct", "post", "room-1", {"text": "hi"}).requires_approval is False
    assert (
        prepare_submission("acct", "post", "room-1", {"text": "hi"}, requires_approval=True).requires_approval is True
    )


@pytest.mark.parametrize("flag", [1, 0, "yes", None])
def test_requires_approval_must_be_a_bool_and_is_named(any_store, flag):
    store = any_store.store
    assert refusal(store.submit, "acct", "post", "room-1", {"text": "hi"}, requires_approval=flag) == (
        "requires_approval",
        IntakeCode.NOT_BOOL,
        None,
    )
    assert store.list_intents() == []


@pytest.mark.parametrize("cap", ["max_attempts", "max_reconciles"])
def test_caps_run_from_1_to_max_cap(cap):
    assert MAX_CAP == 10_000
    low = prepare_submission("acct", "post", "room-1", {"text": "hi"}, **{cap: 1})
    high = prepare_submission("acct", "post", "room-1", {"text": "hi"}, **{cap: MAX_CAP})
    assert getattr(low, cap) == 1 and getattr(high, cap) == MAX_CAP
    for bad, bound in ((0, 1), (-1, 1), (MAX_CAP + 1, MAX_CAP)):
        assert refusal(prepare_submission, "acct", "post", "room-1", {"text": "hi"}, **{cap: bad}) == (
            cap,
            IntakeCode.OUT_OF_RANGE,
            bound,
        )


@pytest.mark.parametrize("cap", ["max_attempts", "max_reconciles"])
@pytest.mark.parametrize("bad", [True, 2.0, "3", None])
def test_a_cap_that_is_not_an_int_is_refused_and_nothing_is_stored(any_store, cap, bad):
    # True == 1 and 2.0 == 2, but neither is an integer count
    store = any_store.store
    assert refusal(store.submit, "acct", "post", "room-1", {"text": "hi"}, **{cap: bad}) == (
        cap,
        IntakeCode.NOT_INTEGER,
        None,
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
            "lease_seconds",
            IntakeCode.OUT_OF_RANGE,
            MAX_LEASE_SECONDS,
        )


def test_an_integer_too_large_for_a_float_is_refused_as_too_large():
    assert refusal(validate_lease_seconds, "window_seconds", 10**400) == (
        "window_seconds",
        IntakeCode.OUT_OF_RANGE,
        MAX_LEASE_SECONDS,
    )


@pytest.mark.parametrize("bad", [True, "30", None])
def test_a_lease_that_is_not_a_number_is_refused_by_name(bad):
    assert refusal(validate_lease_seconds, "send_lease_seconds", bad) == (
        "send_lease_seconds",
        IntakeCode.NOT_NUMBER,
        None,
    )


def test_begin_refuses_a_huge_lease_and_leaves_the_intent_pending(any_store):
    store = any_store.store
    it = store.submit("acct", "post", "room-1", {"text": "hi"})
    too_long = ("lease_seconds", IntakeCode.OUT_OF_RANGE, MAX_LEASE_SECONDS)
    assert refusal(store.begin, it.key, lease_seconds=10**400) == too_long
    assert refusal(store.begin, it.key, lease_seconds=MAX_LEASE_SECONDS + 1) == too_long
    after = store.get(it.key)
    assert after.state == "pending" and after.attempt_count == 0 and after.attempt_token is None
    lease = store.begin(it.key, lease_seconds=MAX_LEASE_SECONDS)
    assert lease.expires_at > store.get(it.key).created_at + MAX_LEASE_SECONDS - 60


# -- the request itself ----------------------------------------------------------------------------


@pytest.mark.parametrize("request_", [[1], "text", None])
def test_a_request_that_is_not_an_object_is_refused(request_):
    assert refusal(prepare_submission, "acct", "post", "room-1", request_) == ("request", IntakeCode.NOT_OBJECT, None)


@pytest.mark.parametrize("request_", [{"x": float("nan")}, {"x": {1: "a"}}, {"x": {1, 2}}])
def test_a_request_without_canonical_json_is_refused_as_intake(any_store, request_):
    store = any_store.store
    want = ("request", IntakeCode.NOT_CANONICAL, None)
    assert refusal(prepare_submission, "acct", "post", "room-1", request_) == want
    assert refusal(store.submit, "acct", "post", "room-1", request_) == want
    assert store.list_intents() == []


def test_a_json_argument_without_canonical_json_is_refused_by_its_name():
    assert refusal(check_json_object, "descriptor", {"x": float("nan")}) == (
        "descriptor",
        IntakeCode.NOT_CANONICAL,
        None,
    )


def test_a_json_argument_must_be_an_object():
    assert refusal(check_json_object, "descriptor", [1]) == ("descriptor", IntakeCode.NOT_OBJECT, None)


def test_a_json_argument_of_exactly_max_bytes_is_taken_and_one_byte_more_is_not():
    size = len(canonical_json({"a": "b"}))
    assert check_json_object("descriptor", {"a": "b"}, max_bytes=size) == {"a": "b"}
    assert refusal(check_json_object, "descriptor", {"a": "b"}, max_bytes=size - 1) == (
        "descriptor",
        IntakeCode.TOO_LARGE,
        size - 1,
    )


def test_a_json_argument_takes_64_kib_by_default():
    assert MAX_DETAIL_BYTES == 64 * 1024
    text = "x" * (MAX_DETAIL_BYTES - len(canonical_json({"a": ""})))
    assert check_json_object("descriptor", {"a": text}) == {"a": text}
    assert refusal(check_json_object, "descriptor", {"a": text + "x"}) == (
        "descriptor",
        IntakeCode.TOO_LARGE,
        MAX_DETAIL_BYTES,
    )


def test_a_request_of_exactly_the_payload_limit_is_taken_and_one_byte_more_is_not():
    request = {"text": "hi"}
    size = len(canonical_json(request))
    sub = prepare_submission("acct", "post", "room-1", request, max_payload_bytes=size)
    assert sub.request_json.encode() == canonical_json(request)
    assert refusal(prepare_submission, "acct", "post", "room-1", request, max_payload_bytes=size - 1) == (
        "request",
        IntakeCode.TOO_LARGE,
        size - 1,
    )


def test_the_default_payload_limit_is_one_mebibyte():
    text = "x" * ((1 << 20) - len(canonical_json({"text": ""})))
    assert len(prepare_submission("acct", "post", "room-1", {"text": text}).request_json) == 1 << 20
    assert refusal(prepare_submission, "acct", "post", "room-1", {"text": text + "x"}) == (
        "request",
        IntakeCode.TOO_LARGE,
        1 << 20,
    )


def test_a_submission_carries_the_canonical_request_its_bytes_digest_and_key():
    request = {"text": "caf\u00e9", "tags": ("a", "b"), "n": 1.0, "z": None}
    sub = prepare_submission("acct", "post", "room-1", request)
    raw = canonical_json(request)
    assert sub.request_json == raw.decode("utf-8")
    assert sub.request == load_canonical(raw) == {"n": 1, "tags": ["a", "b"], "text": "caf\u00e9", "z": None}
    assert sub.request_digest == request_digest(sub.request)
    assert sub.key == delivery_key("acct", "post", "room-1", request)
    assert (sub.account, sub.action_kind, sub.target) == ("acct", "post", "room-1")
    assert sub.normalizer_version == NORMALIZER_VERSION
    assert (sub.max_attempts, sub.max_reconciles) == (DEFAULT_MAX_ATTEMPTS, DEFAULT_MAX_RECONCILES) == (3, 3)
    assert sub.source_id is None and sub.source_version is None


def test_the_text_hash_is_of_the_text_field_when_it_is_a_string():
    sub = prepare_submission("acct", "post", "room-1", {"text": "Hello  world\r\n"})
    assert sub.text_hash == text_digest("Hello world")
    assert prepare_submission("acct", "post", "room-1", {"body": "Hello"}).text_hash is None
    assert prepare_submission("acct", "post", "room-1", {"text": 5}).text_hash is None
    other = prepare_submission("acct", "post", "room-1", {"body": "Hello", "text": "x"}, text_field="body")
    assert other.text_hash == text_digest("Hello")


def test_a_source_is_checked_and_carried():
    sub = prepare_submission("acct", "post", "room-1", {"text": "hi"}, source=("s" * 2048, "v" * 128))
    assert (sub.source_id, sub.source_version) == ("s" * 2048, "v" * 128)
    for source, want in (
        (("s" * 2049, "v"), ("source id", IntakeCode.TOO_LONG, 2048)),
        (("s", "v" * 129), ("source version", IntakeCode.TOO_LONG, 128)),
        ((" ", "v"), ("source id", IntakeCode.EMPTY, None)),
        (("s", 3), ("source version", IntakeCode.NOT_STRING, None)),
        ("ab", ("source", IntakeCode.WRONG_TYPE, None)),  # never read as the pair ("a", "b")
        (("s", "v", "x"), ("source", IntakeCode.WRONG_TYPE, None)),
        ({"s": "v"}, ("source", IntakeCode.WRONG_TYPE, None)),
    ):
        assert refusal(prepare_submission, "acct", "post", "room-1", {"text": "hi"}, source=source) == want


def test_with_one_normalizer_there_are_no_earlier_keys():
    assert sorted(identity.NORMALIZERS) == [NORMALIZER_VERSION]
    assert prepare_submission("acct", "post", "room-1", {"text": "hi"}).earlier_keys == ()


def test_each_older_normalizer_gives_an_earlier_key_oldest_first(monkeypatch):
    monkeypatch.setitem(identity.NORMALIZERS, -1, str.upper)
    monkeypatch.setitem(identity.NORMALIZERS, 0, str.lower)
    monkeypatch.setitem(identity.NORMALIZERS, NORMALIZER_VERSION + 1, str.title)  # newer: not an earlier key
    request = {"text": "Hi There"}
    sub = prepare_submission("acct", "post", "room-1", request)
    assert sub.key == delivery_key("acct", "post", "room-1", request)
    assert sub.earlier_keys == (
        delivery_key("acct", "post", "room-1", request, version=-1),
        delivery_key("acct", "post", "room-1", request, version=0),
    )
    assert len(set(sub.earlier_keys) | {sub.key}) == 3


# -- check_text ------------------------------------------------------------------------------------


def test_check_text_returns_the_text_unchanged():
    assert check_text("reason", "  spaced\ttext  ") == "  spaced\ttext  "


@pytest.mark.parametrize("value", [None, b"x", 3])
def test_check_text_refuses_a_non_string(value):
    assert refusal(check_text, "reason", value) == ("reason", IntakeCode.NOT_STRING, None)


def test_check_text_refuses_blank_text_unless_blank_is_allowed():
    for blank in ("", " ", "\n\t", "\u3000"):
        assert refusal(check_text, "reason", blank) == ("reason", IntakeCode.EMPTY, None)
        assert check_text("reason", blank, allow_blank=True) == blank


def test_check_text_takes_max_text_chars_and_not_one_more():
    assert MAX_TEXT_CHARS == 4096
    assert check_text("reason", "x" * 4096) == "x" * 4096
    assert refusal(check_text, "reason", "x" * 4097) == ("reason", IntakeCode.TOO_LONG, 4096)
    assert check_text("reason", "x" * 10, max_chars=10) == "x" * 10
    assert refusal(check_text, "reason", "x" * 11, max_chars=10) == ("reason", IntakeCode.TOO_LONG, 10)


def test_check_text_refuses_nul_and_lone_surrogates_by_name():
    assert refusal(check_text, "reason", "a\x00b") == ("reason", IntakeCode.NUL_BYTE, None)
    assert refusal(check_text, "reason", "a\ud800b") == ("reason", IntakeCode.LONE_SURROGATE, None)
    assert refusal(check_text, "reason", "\x00", allow_blank=True) == ("reason", IntakeCode.NUL_BYTE, None)
    with pytest.raises(IntakeError) as info:
        check_text("reason", "\udfff")
    assert isinstance(info.value.__cause__, UnicodeEncodeError)


# -- person names and limits -----------------------------------------------------------------------


def test_a_person_name_is_kept_as_given_and_a_blank_one_becomes_empty():
    assert person_name("operator", " alice ") == " alice "
    for blank in ("", "   ", "\t\n", "\u2003"):
        assert person_name("operator", blank) == ""


def test_a_person_name_takes_256_characters_and_not_257():
    assert person_name("approver", "a" * 256) == "a" * 256
    assert refusal(person_name, "approver", "a" * 257) == ("approver", IntakeCode.TOO_LONG, 256)


def test_a_bad_person_name_is_refused_by_what_it_names():
    assert refusal(person_name, "operator", None) == ("operator", IntakeCode.NOT_STRING, None)
    assert refusal(person_name, "approver", "al\x00ice") == ("approver", IntakeCode.NUL_BYTE, None)
    assert refusal(person_name, "approver", "\ud800") == ("approver", IntakeCode.LONE_SURROGATE, None)


@pytest.mark.parametrize("bad", [True, False, 1.0, "5", None])
def test_a_limit_must_be_a_plain_integer(bad):
    assert refusal(check_limit, bad) == ("limit", IntakeCode.NOT_INTEGER, None)


def test_a_limit_of_zero_or_more_is_returned_as_is_and_a_negative_one_is_refused():
    assert check_limit(0) == 0
    assert check_limit(1) == 1
    assert check_limit(10**6) == 10**6
    assert refusal(check_limit, -1) == ("limit", IntakeCode.OUT_OF_RANGE, 0)


def test_a_name_longer_than_the_indexes_hold_is_refused_in_bytes_not_only_in_characters():
    four = "\U0001f600"  # four bytes of UTF-8
    fits = four * (MAX_NAME_BYTES // 4)
    assert prepare_submission(fits, fits, fits, {"text": "hi"}, source=(fits, "v")).account == fits
    over = fits + "a"  # 513 characters, under the 1024 the characters allow
    for field, args, kw in (
        ("account", (over, "post", "room-1"), {}),
        ("action_kind", ("acct", over, "room-1"), {}),
        ("target", ("acct", "post", over), {}),
        ("source id", ("acct", "post", "room-1"), {"source": (over, "v")}),
    ):
        assert refusal(prepare_submission, *args, {"text": "hi"}, **kw) == (field, IntakeCode.TOO_LONG, MAX_NAME_BYTES)
