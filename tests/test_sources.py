"""Source-version chains with a freshness fence (docs/design.md#sources-and-the-freshness-fence), on every store."""

from __future__ import annotations

import pytest

from atmostonce import GuardRefused
from atmostonce.identity import source_version, visible_text
from atmostonce.runtime import Dispatcher, RuntimeConfig
from atmostonce_http import HttpTransport, PlatformSink, sink_config

PAGE = (
    "<html><head><script>var token='{token}';</script><title>t {stamp}</title></head><body><p>{body}</p></body></html>"
)
URL = "https://example.org/article/1"


def page(body: str, token: str, stamp: str = "12:00") -> str:
    return PAGE.format(body=body, token=token, stamp=stamp)


def test_page_chrome_that_changes_on_every_fetch_mints_no_new_version(any_store):
    s = any_store.store
    first = s.capture_source(URL, visible_text(page("The news.", "a1")), raw=page("The news.", "a1").encode())
    again = s.capture_source(URL, visible_text(page("The news. ", "b2", "12:01")), raw=page("The news.", "b2").encode())
    assert first.new_version and not again.new_version
    assert first.version == again.version and first.raw_hash != again.raw_hash  # raw hash: forensics only
    changed = s.capture_source(URL, visible_text(page("The news, updated.", "c3")))
    assert changed.new_version and changed.supersedes == first.version
    assert s.source_head(URL) == changed.version


def test_supersedes_resolves_to_the_stored_head_so_a_skipped_capture_self_heals(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    # version "two" was never captured (its extraction failed); "three" still chains to what is stored
    v3 = s.capture_source(URL, "three")
    assert v3.supersedes == v1.version and s.source_head(URL) == v3.version
    assert source_version(URL, "two") not in (v1.version, v3.version)


def test_the_freshness_fence_skips_a_stale_item_before_any_spend(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    stale = s.submit("acct", "post", "room", {"text": "about one"}, source=(URL, v1.version))
    assert s.claimable() == [stale.key]
    s.capture_source(URL, "two")
    assert s.claimable() == []  # not picked: nothing begun, nothing spent
    assert s.attempts(stale.key) == []


def test_the_publish_time_source_gate_refuses_after_the_head_moved(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    it = s.submit("acct", "post", "room", {"text": "about one"}, source=(URL, v1.version))
    lease = s.begin(it.key)
    s.capture_source(URL, "two")  # the source moved while the worker did its expensive step
    with pytest.raises(GuardRefused) as e:
        s.authorize_dispatch(lease, request_digest=it.request_digest)
    assert e.value.guard == "source_is_head"


def test_the_dispatcher_parks_a_send_whose_source_moved_and_sends_nothing(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    it = s.submit("acct", "post", "room", {"text": "about one"}, source=(URL, v1.version))
    with PlatformSink() as sink, HttpTransport(sink_config(sink.url)) as transport:
        d = Dispatcher(s, transport, RuntimeConfig(), work=lambda intent: s.capture_source(URL, "two"))
        assert d.dispatch(it.key) == "gate.blocked"
        assert sink.requests == 0
    assert s.get(it.key).state == "parked"


def test_a_source_flipping_back_reuses_its_version(any_store):
    s = any_store.store
    a = s.capture_source(URL, "A")
    s.capture_source(URL, "B")
    back = s.capture_source(URL, "A")
    assert back.version == a.version and not back.new_version and s.source_head(URL) == a.version


def test_dispatching_a_stale_item_directly_spends_nothing(any_store):
    s = any_store.store
    v1 = s.capture_source(URL, "one")
    it = s.submit("acct", "post", "room", {"text": "about one"}, source=(URL, v1.version))
    s.capture_source(URL, "two")
    spent = []
    with PlatformSink() as sink, HttpTransport(sink_config(sink.url)) as transport:
        d = Dispatcher(s, transport, RuntimeConfig(), work=lambda intent: spent.append(intent.key))
        assert d.dispatch(it.key) == "gate.stale_source"
        assert sink.requests == 0
    assert spent == [] and s.attempts(it.key) == [] and s.get(it.key).state == "pending"
