"""The identities' exact construction, the error messages that name the bad part, and HTML visible text.

A delivery key, source version or claim id is stored in every database and compared across releases and
implementations (the conformance cases), so its construction is a format: SHA-256 of the RFC 8785 bytes
of ``[domain tag, normalizer version, *parts]`` (the module docstring of atmostonce.identity). These tests
rebuild each identity from that definition with ``hashlib`` and ``rfc8785`` directly, independently of
the helpers under test.
"""

from __future__ import annotations

import hashlib
import json
import re

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st

import atmostonce.identity as ident
from atmostonce.canonical import canonical_bytes
from atmostonce.errors import IdentityCode
from atmostonce.identity import (
    IdentityError,
    attempt_token,
    canonical_json,
    claim_id,
    delivery_key,
    load_canonical,
    source_version,
    text_digest,
    visible_text,
)


def _sha(parts) -> str:
    return hashlib.sha256(rfc8785.dumps(parts)).hexdigest()


def test_delivery_key_is_the_digest_of_the_tagged_tuple_with_normalized_strings():
    projection = {"text": "caf\u0065\u0301  ", "tags": ["x\r\ny", 3], "n": None}
    normalized = {"text": "caf\u00e9", "tags": ["x\ny", 3], "n": None}
    want = _sha(["atmostonce/delivery-key", 1, "acct", "post", "room", normalized])
    assert delivery_key("acct", "post", "room", projection) == want


def test_source_version_claim_id_and_text_digest_follow_the_same_construction():
    sv = source_version("https://x/1", "Body\u00a0text \r\n")
    assert sv == _sha(["atmostonce/source-version", 1, "https://x/1", "Body text"])
    assert claim_id(sv, {"c": ["a  b", "c"]}) == _sha(["atmostonce/claim", 1, sv, {"c": ["a b", "c"]}])
    assert text_digest(" Hi\u200b there ") == _sha(["atmostonce/text", 1, "Hi there"])


def test_the_domain_tag_keeps_identities_of_different_kinds_apart():
    sv = source_version("s", "same")
    assert text_digest("same") != sv
    assert claim_id(sv, "same") != claim_id(source_version("s", "other"), "same")


@pytest.fixture
def normalizer_v2(monkeypatch):
    """A future normalizer beside v1 (v1 plus case folding); v1 stays the default."""
    monkeypatch.setitem(ident.NORMALIZERS, 2, lambda t: ident._normalize_v1(t).casefold())


def test_an_explicit_normalizer_version_reaches_every_string_inside_a_projection(normalizer_v2):
    projection = {"outer": "ABC", "list": ["DEF", {"deep": "GHI"}]}
    folded = {"outer": "abc", "list": ["def", {"deep": "ghi"}]}
    assert delivery_key("a", "post", "t", projection, version=2) == _sha(
        ["atmostonce/delivery-key", 2, "a", "post", "t", folded]
    )
    assert claim_id("sv", ["X", ["Y"]], version=2) == _sha(["atmostonce/claim", 2, "sv", ["x", ["y"]]])


def test_text_digest_and_source_version_use_the_version_they_are_given(normalizer_v2):
    assert text_digest("AbC", version=2) == _sha(["atmostonce/text", 2, "abc"])
    assert source_version("s", "AbC", version=2) == _sha(["atmostonce/source-version", 2, "s", "abc"])
    assert text_digest("AbC") == _sha(["atmostonce/text", 1, "AbC"])


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: delivery_key(" ", "post", "t", {}), "account"),
        (lambda: delivery_key("a", "", "t", {}), "action_kind"),
        (lambda: delivery_key("a", "post", "\t", {}), "target"),
        (lambda: source_version("", "body"), "source_id"),
        (lambda: claim_id("", {}), "source version"),
        (lambda: ident.platform_idempotency_key(""), "delivery_key"),
        (lambda: ident.split_platform_idempotency_key(""), "key"),
    ],
)
def test_an_empty_part_is_refused_with_its_name(call, name):
    with pytest.raises(IdentityError) as e:
        call()
    assert (e.value.code, e.value.field) == (IdentityCode.EMPTY, name)


def test_a_part_that_is_not_text_is_refused_naming_the_part():
    with pytest.raises(IdentityError) as e:
        delivery_key("a", "post", 7, {})  # type: ignore[arg-type]
    assert (e.value.code, e.value.field) == (IdentityCode.NOT_STRING, "target")


def test_a_nul_byte_in_a_part_is_refused_naming_the_part():
    with pytest.raises(IdentityError) as e:
        source_version("s\x00", "body")
    assert e.value.as_dict() == {"code": IdentityCode.NUL_BYTE, "field": "source_id"}


def test_canonical_json_round_trips_integers_as_integers():
    for value in (0, 7, -3, 2**53 - 1):
        back = load_canonical(canonical_json({"n": value}))["n"]
        assert back == value and type(back) is int


def test_a_float_at_or_beyond_two_to_the_53_round_trips_as_a_float():
    # RFC 8785 writes 2**53 as a float without an exponent ("9007199254740992"); it must come back a float,
    # the value it was made from, not an integer the canonicalizer would refuse
    for value in (float(2**53), -float(2**53), 1e16):
        raw = canonical_json([value])
        assert json.loads(raw) == [int(value)]  # the bytes carry no decimal point
        back = load_canonical(raw)[0]
        assert back == value and type(back) is float


def test_attempt_tokens_are_128_bits_of_hex():
    token = attempt_token()
    assert re.fullmatch(r"[0-9a-f]{32}", token)


def test_visible_text_drops_script_style_head_and_keeps_paragraph_breaks():
    html = (
        "<html><head><title>Tab title</title><style>p{}</style></head><body>"
        "<script>var t=1</script><p>first</p><div>second</div><noscript>x</noscript>"
        "<template><b>t</b></template>third</body></html>"
    )
    assert visible_text(html) == "\nfirst\nsecondthird"


def test_visible_text_handles_nested_skipped_tags_and_stray_end_tags():
    assert visible_text("</script>a<script><style>x</style>y</script>b") == "ab"
    assert visible_text("<li>one<li>two<br>three<h1>h</h1><h2>i</h2><h3>j</h3><tr>k") == "\none\ntwo\nthree\nh\ni\nj\nk"


def test_visible_text_decodes_character_references():
    assert visible_text("<p>fish &amp; chips &#8212; &lt;ok&gt;</p>") == "\nfish & chips \u2014 <ok>"


@pytest.mark.parametrize(
    ("call", "code", "field"),
    [
        (lambda: ident.normalize_text("a\x00b"), IdentityCode.NUL_BYTE, "text"),
        (lambda: ident.normalize_text("ab\udc80"), IdentityCode.LONE_SURROGATE, "text"),
        (lambda: ident.normalize_text(12), IdentityCode.NOT_STRING, "text"),
        (lambda: ident.normalize_text("x", version=7), IdentityCode.UNKNOWN_VERSION, "version"),
        (lambda: text_digest("x", version=7), IdentityCode.UNKNOWN_VERSION, "version"),
        (lambda: canonical_json({"v": float("nan")}), IdentityCode.NOT_FINITE, "$.v"),
        (lambda: canonical_json([float("-inf")]), IdentityCode.NOT_FINITE, "$[0]"),
    ],
)
def test_refusals_say_what_is_wrong_and_where(call, code, field):
    with pytest.raises(IdentityError) as e:
        call()
    assert (e.value.code, e.value.field) == (code, field)


def test_a_registered_normalizer_checks_its_input_itself():
    # NORMALIZERS is public (``prepare_submission`` calls every version); each entry refuses what
    # normalize_text would, when called directly
    v1 = ident.NORMALIZERS[1]
    with pytest.raises(IdentityError) as e:
        v1(b"x")
    assert (e.value.code, e.value.field) == (IdentityCode.NOT_STRING, "text")
    with pytest.raises(IdentityError) as e:
        v1("\x00")
    assert (e.value.code, e.value.field) == (IdentityCode.NUL_BYTE, "text")


def test_a_lone_carriage_return_becomes_a_line_feed():
    assert ident.normalize_text("one\rtwo\r\nthree") == "one\ntwo\nthree"


def _deep(n):
    v: list = []
    for _ in range(n):
        v = [v]
    return v


@pytest.mark.parametrize(
    ("value", "code", "field"),
    [
        ({1: "x"}, IdentityCode.KEY_NOT_STRING, "$"),
        ({"a": {"b\x00": 1}}, IdentityCode.NUL_BYTE, "$.a key"),
        ({"a": ["ok", "no\x00"]}, IdentityCode.NUL_BYTE, "$.a[1]"),
        ({"a": [{"s": {1, 2}}]}, IdentityCode.NOT_JSON, "$.a[0].s"),
        ({"f": [1.5, float("inf")]}, IdentityCode.NOT_FINITE, "$.f[1]"),
    ],
)
def test_canonical_json_refusals_name_the_path_to_the_bad_value(value, code, field):
    with pytest.raises(IdentityError) as e:
        canonical_json(value)
    assert (e.value.code, e.value.field) == (code, field)


def test_too_deep_and_out_of_range_values_are_refused_with_their_reason():
    with pytest.raises(IdentityError) as e:
        canonical_json(_deep(100_000))
    assert (e.value.code, e.value.field) == (IdentityCode.TOO_DEEP, None)
    with pytest.raises(IdentityError) as e:
        canonical_json({"n": 2**64})  # RFC 8785 numbers are IEEE doubles; this integer has no exact form
    assert (e.value.code, e.value.field) == (IdentityCode.NOT_CANONICAL, None)


_TEXT = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12)
_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | _TEXT,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_TEXT, inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(_JSON)
def test_the_intakes_canonical_bytes_are_the_bytes_rfc8785_writes(value):
    # the intake's encoder writes the common case with the json module's C encoder; whatever it takes, the bytes
    # are RFC 8785's and canonical_json's (keys beyond the Basic Multilingual Plane sort by UTF-16 unit, floats
    # are written as ECMAScript does)
    assert canonical_bytes(value) == rfc8785.dumps(value) == canonical_json(value)


def test_keys_outside_the_basic_plane_sort_by_utf16_unit():
    value = {"\U0001f600": 1, "\uff01": 2}  # by code point U+FF01 sorts first; by UTF-16 unit, the emoji does
    assert canonical_bytes(value) == rfc8785.dumps(value) == '{"\U0001f600":1,"\uff01":2}'.encode()


def test_a_value_nested_deeper_than_the_fast_path_goes_is_written_and_refused_as_rfc8785_would():
    # the C encoder writes only values it has checked down to the bottom; below its depth the checked path writes
    # (a float there is written as ECMAScript does) or refuses (a set there has no JSON form), as before
    deep_float, deep_set = 1e16, {1}
    for _ in range(70):
        deep_float, deep_set = [deep_float], [deep_set]
    assert canonical_bytes(deep_float) == rfc8785.dumps(deep_float)
    with pytest.raises(IdentityError) as e:
        canonical_bytes(deep_set)
    assert e.value.code == IdentityCode.NOT_JSON
