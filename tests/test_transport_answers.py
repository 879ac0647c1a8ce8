"""Whatever a transport answers a send with, its outcome is recorded (docs/design.md#late-outcomes-are-evidence):
a transport someone wrote may put an exception's whole text in a reason, or hand back an id the store cannot
keep, or return something that is no send result at all. The bytes may have left; an answer the store then
refused would leave the attempt unrecorded, so a proven not-sent would cost a lookup instead of a retry, and a
send that happened would be told to nobody. Every store, through ``Dispatcher.dispatch`` and ``publish``."""

from __future__ import annotations

import pytest

from atmostonce.records import MAX_TEXT_CHARS
from atmostonce.runtime import Dispatcher, storable_send_result
from atmostonce.transport import Capabilities, NotSent, Sent, Unknown
from tests.helpers import submit


class Answering:
    """A hand-written transport whose send answers ``answer`` (no read-back, no lookup)."""

    name, protocol_version = "hand", 1
    capabilities = Capabilities(read_back=False, lookup_by_key=False)

    def __init__(self, answer):
        self.answer, self.sends = answer, 0

    def send(self, request):
        self.sends += 1
        return self.answer

    def read_back(self, remote_id):  # pragma: no cover - not a capability
        raise AssertionError("no read-back")

    def lookup(self, delivery_key, resend_epoch=0, fence_epoch=0):  # pragma: no cover - not a capability
        raise AssertionError("no lookup")

    def matches(self, request, found):  # pragma: no cover
        return False

    def close(self):
        pass


ANSWERS = {
    "not-sent-long": (NotSent("refused " + "x" * 10_000), "send.not_sent", "failed"),
    "not-sent-nul": (NotSent("refused\x00 by the host"), "send.not_sent", "failed"),
    "not-sent-blank": (NotSent("   "), "send.not_sent", "failed"),
    "unknown-surrogate": (Unknown("bad \udcff bytes"), "send.unknown", "indeterminate"),
    "sent-empty-id": (Sent(""), "send.unknown", "indeterminate"),
    "sent-nul-id": (Sent("id\x00"), "send.unknown", "indeterminate"),
    "sent-long-id": (Sent("9" * (MAX_TEXT_CHARS + 1)), "send.unknown", "indeterminate"),
    "none": (None, "send.unknown", "indeterminate"),
    "a-dict": ({"id": "7"}, "send.unknown", "indeterminate"),
}


@pytest.mark.parametrize(("answer", "outcome", "state"), list(ANSWERS.values()), ids=list(ANSWERS))
def test_every_send_answer_is_recorded_with_its_outcome(any_store, answer, outcome, state):
    store = any_store.store
    it = submit(store)
    transport = Answering(answer)
    assert Dispatcher(store, transport).dispatch(it.key) == outcome
    after = store.get(it.key)
    assert after.state == state and transport.sends == 1
    reason = store.history(it.key)[-1].detail["reason"]
    assert isinstance(reason, str) and reason.strip() and len(reason) <= MAX_TEXT_CHARS


def test_publish_records_a_sent_with_an_int_id_as_its_decimal_string(any_store):
    store = any_store.store
    key, outcome = Dispatcher(store, Answering(Sent(42))).publish("acct", "post", "t", {"text": "hi"})
    assert outcome == "read_back.unavailable"
    assert store.get(key).remote_id == "42"


def test_a_fitted_reason_keeps_what_a_person_needs_to_read():
    """The escape keeps the offending characters visible, and the cut is marked."""
    assert storable_send_result(NotSent("refused\x00")).reason == "refused\\x00"
    assert storable_send_result(Unknown("a \udcff b")).reason == "a \\udcff b"
    cut = storable_send_result(NotSent("r" * 5000)).reason
    assert len(cut) == MAX_TEXT_CHARS and cut.endswith("...")
    kept = NotSent("refused", retry_after=3.0)
    assert storable_send_result(kept) is kept
