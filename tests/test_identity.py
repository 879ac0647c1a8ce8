"""The named identities: stable across clocks, normalized, canonical, refusing what has no canonical form."""

from __future__ import annotations

import math
import time
import unicodedata

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from atmostonce.errors import IdentityCode
from atmostonce.identity import (
    NORMALIZER_VERSION,
    IdentityError,
    attempt_token,
    canonical_json,
    claim_id,
    delivery_key,
    normalize_text,
    raw_digest,
    request_digest,
    source_version,
)


def test_two_zero_text_action_kinds_on_one_target_get_distinct_keys():
    like = delivery_key("acct", "like", "post-9", {})
    share = delivery_key("acct", "reshare", "post-9", {})
    assert like != share


def test_account_target_and_projection_all_enter_the_key():
    base = delivery_key("a", "post", "t", {"text": "x"})
    assert base != delivery_key("b", "post", "t", {"text": "x"})
    assert base != delivery_key("a", "post", "u", {"text": "x"})
    assert base != delivery_key("a", "post", "t", {"text": "y"})


@pytest.mark.parametrize("skew", [1, 86_400, 365 * 86_400])
def test_same_work_same_ids_whatever_the_clock(monkeypatch, skew):
    before = (
        delivery_key("a", "post", "t", {"text": "x"}),
        source_version("https://x/1", "body"),
        claim_id(source_version("https://x/1", "body"), {"c": 1}),
    )
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + skew)
    after = (
        delivery_key("a", "post", "t", {"text": "x"}),
        source_version("https://x/1", "body"),
        claim_id(source_version("https://x/1", "body"), {"c": 1}),
    )
    assert before == after


def test_spellings_a_reader_cannot_tell_apart_share_a_key():
    nfc = unicodedata.normalize("NFC", "café\r\nline  two  ")
    nfd = unicodedata.normalize("NFD", "café\nline two")
    assert nfc != nfd
    assert delivery_key("a", "post", "t", {"text": nfc}) == delivery_key("a", "post", "t", {"text": nfd})


def test_request_digest_binds_exact_bytes_not_normalized_text():
    assert request_digest({"text": "a "}) != request_digest({"text": "a"})
    assert request_digest({"b": 1, "a": 2}) == request_digest({"a": 2, "b": 1})


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, {1: "x"}, {"s": {1}}, "a\x00", "\udc80"])
def test_values_without_canonical_form_are_refused(bad):
    with pytest.raises(IdentityError):
        canonical_json({"v": bad} if not isinstance(bad, dict) else bad)


def test_normalizer_is_versioned_and_rules_are_documented():
    assert NORMALIZER_VERSION == 1
    assert normalize_text("  a\t b  \n\n\n\nc \r\n") == "a b\n\nc"
    with pytest.raises(IdentityError) as e:
        normalize_text("x", version=2)
    assert e.value.code == IdentityCode.UNKNOWN_VERSION


def test_raw_digest_is_forensic_only_and_differs_from_source_version():
    raw = b"<html><script>token=1</script>body</html>"
    assert raw_digest(raw) != source_version("https://x/1", "body")


def test_attempt_tokens_are_random():
    assert len({attempt_token() for _ in range(1000)}) == 1000


@settings(max_examples=300)
@given(st.text(), st.text(alphabet="abcdefgh-_", min_size=1))
def test_normalization_is_idempotent_and_keys_are_stable(text, account):
    try:
        once = normalize_text(text)
    except IdentityError:
        return
    assert normalize_text(once) == once
    assert delivery_key(account, "post", "t", {"text": text}) == delivery_key(account, "post", "t", {"text": once})


def _normalize_v2(text: str) -> str:
    """A stand-in for a future normalizer: v1 plus case folding (it merges spellings v1 keeps apart)."""
    from atmostonce.identity import _normalize_v1

    return _normalize_v1(text).casefold()


@pytest.fixture
def normalizer_v2(monkeypatch):
    import atmostonce.identity as ident

    monkeypatch.setitem(ident.NORMALIZERS, 2, _normalize_v2)
    monkeypatch.setattr(ident, "NORMALIZER_VERSION", 2)


def test_a_new_normalizer_mints_new_keys_visibly():
    v1 = delivery_key("a", "post", "t", {"text": "Hello"}, version=1)
    assert v1 == delivery_key("a", "post", "t", {"text": "Hello"})
    with pytest.raises(IdentityError):
        delivery_key("a", "post", "t", {"text": "Hello"}, version=99)


def test_a_normalizer_change_neither_splits_nor_merges_history(any_store, normalizer_v2):
    import atmostonce.identity as ident

    s = any_store.store
    # an intent submitted under v1 (as if before the upgrade)
    ident.NORMALIZER_VERSION = 1
    old = s.submit("acct", "post", "t", {"text": "Hello"})
    other = s.submit("acct", "post", "t", {"text": "HELLO"})  # v1 keeps these apart: two deliveries
    assert old.normalizer_version == 1 and old.key != other.key
    # after the upgrade to v2 the same request finds the v1 intent: no split
    ident.NORMALIZER_VERSION = 2
    again = s.submit("acct", "post", "t", {"text": "Hello"})
    assert again.key == old.key and again.normalizer_version == 1
    # and v2's merging of "HELLO" with "Hello" does not merge the two existing intents
    assert s.submit("acct", "post", "t", {"text": "HELLO"}).key in (old.key, other.key)
    assert len(s.list_intents()) == 2
    # a genuinely new request is keyed under v2 and records it
    fresh = s.submit("acct", "post", "t", {"text": "New words"})
    assert fresh.normalizer_version == 2
    assert fresh.key == delivery_key("acct", "post", "t", {"text": "New words"}, version=2)


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(alphabet="abcxyz", max_size=5), inner, max_size=4)
    ),
    max_leaves=12,
)


@pytest.mark.postgres
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    account=st.text(alphabet="abcdef-", min_size=1, max_size=8),
    kind=st.sampled_from(["post", "like", "reply"]),
    request=st.dictionaries(st.text(alphabet="abctext", min_size=1, max_size=6), json_values, max_size=5),
)
def test_model_and_both_sql_stores_compute_the_same_identities_on_a_generated_corpus(
    corpus_stores, account, kind, request
):
    from atmostonce import MemoryStore

    a = MemoryStore().submit(account, kind, "target", request)
    for store in corpus_stores:
        b = store.submit(account, kind, "target", request)
        assert (a.key, a.request_digest, a.text_hash, dict(a.request)) == (
            b.key,
            b.request_digest,
            b.text_hash,
            dict(b.request),
        ), store.dialect
        assert store.get(b.key).request_digest == request_digest(dict(store.get(b.key).request))


@pytest.fixture(scope="module")
def corpus_stores(sqlite_databases, pg_databases):
    from atmostonce_sql import open_store

    urls = [sqlite_databases.fresh(), pg_databases.fresh()]
    stores = [open_store(u, migrate=False, pool_size=1) for u in urls]
    yield stores
    for st_, dbs, u in zip(stores, (sqlite_databases, pg_databases), urls, strict=True):
        st_.close()
        dbs.drop(u)


@pytest.mark.parametrize("resend,fence", [(0, 0), (0, 1), (2, 0), (3, 4)])
def test_a_platform_key_splits_back_into_its_delivery_key_and_epochs(resend, fence):
    """A platform (the sink, the email census) tells a delivery's retry under the next fence epoch from a
    duplicate by splitting the key it received; the split is the exact inverse of the composition."""
    from atmostonce.identity import platform_idempotency_key, split_platform_idempotency_key

    dk = "d" * 64
    assert split_platform_idempotency_key(platform_idempotency_key(dk, resend, fence)) == (dk, resend, fence)


def test_a_first_send_carries_the_bare_delivery_key():
    """Without a resend or a fence the platform sees the delivery key itself (docs/design.md#a-fence-is-a-tombstone)."""
    from atmostonce.identity import platform_idempotency_key

    assert platform_idempotency_key("d" * 64) == "d" * 64


@pytest.mark.parametrize("epoch", [-1, 1.5, "1", True, None])
@pytest.mark.parametrize("which", ["resend_epoch", "fence_epoch"])
def test_a_platform_key_refuses_an_epoch_that_is_not_a_non_negative_integer(which, epoch):
    from atmostonce.errors import IdentityCode
    from atmostonce.identity import IdentityError, platform_idempotency_key

    with pytest.raises(IdentityError) as e:
        platform_idempotency_key("d" * 64, **{which: epoch})
    assert (e.value.code, e.value.field) == (IdentityCode.NOT_EPOCH, which)
