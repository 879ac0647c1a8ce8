"""Retractions (docs/platforms.md): deleting or correcting a published object is its own delivery intent
against the recorded remote object id, with its own read-back; the original stays published. On every
store, through the real platform sink."""

from __future__ import annotations

import pytest

from atmostonce import IntakeError
from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig
from atmostonce_http import HttpTransport, PlatformSink, sink_config

CONFIG = RuntimeConfig(lease_seconds=10, send_lease_seconds=10, reconcile_interval=0)


@pytest.fixture
def platform():
    with PlatformSink(dedupe=False) as sink, HttpTransport(sink_config(sink.url, key_field="/delivery_key")) as t:
        yield sink, t


def published(s, transport, text="to be retracted"):
    it = s.submit("acct", "post", "room", {"text": text})
    assert Dispatcher(s, transport, CONFIG).dispatch(it.key) == "read_back.match"
    return s.get(it.key)


def test_a_deletion_is_its_own_intent_confirmed_by_read_back(any_store, platform):
    sink, transport = platform
    s = any_store.store
    orig = published(s, transport)
    assert orig.remote_id in sink.objects
    r = s.submit_retraction(orig.key)
    assert r.key != orig.key and r.action_kind == "retract.delete" and r.state == "pending"
    assert r.request["retracts"] == orig.key and r.request["remote_id"] == orig.remote_id
    assert s.submit_retraction(orig.key).key == r.key  # the same retraction: the same intent
    assert Dispatcher(s, transport, CONFIG).dispatch(r.key) == "read_back.match"
    assert s.get(r.key).state == "published" and s.get(r.key).remote_id == orig.remote_id
    assert orig.remote_id not in sink.objects and sink.deletes == 1
    assert s.get(orig.key).state == "published"  # local status never pretends to undo the remote effect
    assert sink.creates == 1  # the retraction created nothing


def test_a_correction_replaces_the_body_and_is_read_back(any_store, platform):
    sink, transport = platform
    s = any_store.store
    orig = published(s, transport, "with a typo")
    r = s.submit_retraction(orig.key, correction={"text": "without a typo"})
    assert r.action_kind == "retract.correct"
    assert Dispatcher(s, transport, CONFIG).dispatch(r.key) == "read_back.match"
    body = sink.objects[orig.remote_id]["body"]
    assert body["text"] == "without a typo" and sink.updates == 1 and sink.creates == 1


def test_a_lost_answer_to_a_deletion_is_settled_by_reading_the_object_not_by_resending(any_store, platform):
    sink, transport = platform
    s = any_store.store
    orig = published(s, transport)
    r = s.submit_retraction(orig.key)
    sink.plan_retraction_fault("drop_after_write")
    assert Dispatcher(s, transport, CONFIG).dispatch(r.key) == "send.unknown"
    assert s.get(r.key).state == "indeterminate" and sink.deletes == 1
    assert Reconciler(s, transport, CONFIG).run() == {"lookup.found": 1}  # the object is gone: that is the evidence
    assert s.get(r.key).state == "published" and sink.deletes == 1


def test_a_deletion_whose_object_still_exists_is_not_confirmed(any_store, platform):
    sink, transport = platform
    s = any_store.store
    orig = published(s, transport)
    r = s.submit_retraction(orig.key)
    sink.plan_retraction_fault("drop_before_write")  # nothing deleted, no answer
    assert Dispatcher(s, transport, CONFIG).dispatch(r.key) == "send.unknown"
    assert Reconciler(s, transport, CONFIG).run() == {"lookup.not_found": 1}  # still there: proves nothing
    assert s.get(r.key).state == "indeterminate" and orig.remote_id in sink.objects


def test_only_a_published_intent_can_be_retracted(any_store, platform):
    _, transport = platform
    s = any_store.store
    pending = s.submit("acct", "post", "room", {"text": "not yet"})
    with pytest.raises(IntakeError, match="only a published intent"):
        s.submit_retraction(pending.key)
    orig = published(s, transport)
    r = s.submit_retraction(orig.key)
    Dispatcher(s, transport, CONFIG).dispatch(r.key)
    with pytest.raises(IntakeError, match="not itself retracted"):
        s.submit_retraction(r.key)


def test_a_transport_that_cannot_retract_begins_nothing(any_store, platform):
    sink, transport = platform
    s = any_store.store
    orig = published(s, transport)
    r = s.submit_retraction(orig.key)
    with HttpTransport(sink_config(sink.url, delete_path=None, update_path=None)) as plain:
        assert Dispatcher(s, plain, CONFIG).dispatch(r.key) == "retract.unsupported"
    assert s.attempts(r.key) == [] and orig.remote_id in sink.objects
