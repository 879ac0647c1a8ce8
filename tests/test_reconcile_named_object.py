"""A platform that answers a create with the id of another object (a 201 naming the wrong thing): the read-back
of that id does not confirm the send, so it becomes unknown, and the reconciler then asks the platform by the
idempotency key before counting a miss (docs/design.md#response-is-not-proof). What the key finds is evidence
only when it holds what was approved; a miss after such an answer never proves absence, fenced or not, since
the answer said an object was made. Nothing is ever sent twice."""

from __future__ import annotations

import pytest

from atmostonce.runtime import Dispatcher, Reconciler, RuntimeConfig
from atmostonce.transport import Capabilities, Found, NotFound, Sent

CONFIG = RuntimeConfig(reconcile_interval=0)


class WrongId:
    """Stores each create under its idempotency key as ``real-<n>`` and answers with ``other-<n>``, whose
    read-back finds ``named`` (``None``: nothing; a mapping: that body). ``under_key`` decides the lookup:
    ``"real"`` (the object made), ``"named"`` (the id it answered with, no body), ``"edited"`` (the object
    made, with another text), ``None`` (nothing)."""

    name, protocol_version = "wrong-id-platform", 1

    def __init__(self, named=None, under_key="real", fenced=False):
        self.named, self.under_key, self.sends, self.objects = named, under_key, 0, {}
        self.capabilities = Capabilities(read_back=True, lookup_by_key=True, fenced_lookup=fenced)

    def send(self, wire):
        self.sends += 1
        self.objects[wire.idempotency_key] = (f"real-{self.sends}", dict(wire.body))
        return Sent(f"other-{self.sends}", response_digest="d")

    def read_back(self, remote_id):
        return NotFound() if self.named is None else Found(remote_id, self.named)

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
        made = self.objects.get(delivery_key)  # epochs 0: the bare delivery key
        if made is None or self.under_key is None:
            return NotFound()
        real, body = made
        if self.under_key == "named":
            return Found(real.replace("real", "other"))
        return Found(real, body if self.under_key == "real" else body | {"text": "edited"})

    def matches(self, request, found):
        return dict(found.body or {}) == dict(request.body)

    def close(self):
        pass


def _published_then_reconciled(store, platform):
    key, outcome = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "hello"})
    assert (outcome, store.get(key).state) == ("read_back.not_found", "indeterminate")
    counts = Reconciler(store, platform, CONFIG).run()
    return key, counts, store.get(key)


def test_the_key_lookup_finds_the_object_a_wrong_id_hid_and_publishes_it_once(any_store):
    platform = WrongId()
    key, counts, it = _published_then_reconciled(any_store.store, platform)
    assert counts == {"lookup.found": 1}
    assert (it.state, it.remote_id, platform.sends) == ("published", "real-1", 1)


@pytest.mark.parametrize("fenced", [False, True], ids=["unfenced", "fenced"])
def test_a_key_lookup_that_finds_nothing_after_an_answer_named_an_object_proves_no_absence(any_store, fenced):
    platform = WrongId(under_key=None, fenced=fenced)
    key, counts, it = _published_then_reconciled(any_store.store, platform)
    assert counts == {"lookup.not_found": 1}
    assert (it.state, it.remote_id, it.reconcile_count, platform.sends) == ("indeterminate", "other-1", 1, 1)
    assert any_store.store.list_intents(state="pending") == []  # nothing queued to be sent again


@pytest.mark.parametrize(
    "named, under_key, outcome",
    [
        (None, "named", "lookup.not_found"),  # the key names the object the read-back did not find
        ({"text": "something else"}, "named", "lookup.differs"),  # ... or the one whose text differs
        (None, "edited", "lookup.not_found"),  # the key's object does not hold what was approved
    ],
    ids=["same id, not found", "same id, differs", "key's object edited"],
)
def test_what_the_key_lookup_finds_confirms_the_send_only_if_it_holds_what_was_approved(
    any_store, named, under_key, outcome
):
    platform = WrongId(named=named, under_key=under_key)
    if named is not None:  # the read-back found the named object: the dispatch already recorded it as differing
        store = any_store.store
        key, first = Dispatcher(store, platform, CONFIG).publish("acct", "post", "room-1", {"text": "hello"})
        assert first == "read_back.differs"
        counts, it = Reconciler(store, platform, CONFIG).run(), store.get(key)
    else:
        key, counts, it = _published_then_reconciled(any_store.store, platform)
    assert counts == {outcome: 1}
    assert (it.state, it.remote_id, platform.sends) == ("indeterminate", "other-1", 1)


def test_a_transport_that_cannot_look_up_by_key_is_never_asked(any_store):
    class NoLookup(WrongId):
        def __init__(self):
            super().__init__()
            self.capabilities = Capabilities(read_back=True, lookup_by_key=False, fenced_lookup=False)

        def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):
            raise AssertionError("a transport without lookup_by_key was asked by key")

    platform = NoLookup()
    key, counts, it = _published_then_reconciled(any_store.store, platform)
    assert counts == {"lookup.not_found": 1}
    assert (it.state, it.remote_id, platform.sends) == ("indeterminate", "other-1", 1)
