"""The peers, told apart (docs/conformance.md, "The peers"): agent-once 0.1.0 and exactly-once 0.2.1
run the suite through their public APIs (``tests/conformance/peers.py``), unsupported operations
reported not applicable, and each semantic finding the docs publish is a probe here.

The bounded CI slice of the peers: the whole suite once per peer (a few seconds) and the probes."""

from __future__ import annotations

from pathlib import Path

import pytest

from atmostonce.conformance import load_cases
from atmostonce.conformance.runner import ERROR
from tests.conformance.peers import PEERS, PEERS_BEGIN, PEERS_END, measure, peer_driver, peers_markdown

pytestmark = pytest.mark.slow

CASES = load_cases()
DOCS = Path(__file__).resolve().parents[2] / "docs" / "conformance.md"
BOTH = list(PEERS)


@pytest.fixture(scope="module")
def reports():
    return measure(CASES)


@pytest.fixture(params=BOTH)
def peer(request):
    d = peer_driver(request.param)
    d.reset()
    yield d
    d.close()


def _submit(d, text="hello", **request):
    it = d.call(
        "submit", {"account": "acct", "action_kind": "post", "target": "room-1", "request": {"text": text, **request}}
    )
    return it["key"]


def test_the_peers_never_error_and_what_they_lack_is_not_applicable(reports):
    for name, report in reports.items():
        assert [r.case.id for r in report.results if r.status == ERROR] == [], name
        assert report.passed, f"{name} passes nothing: the adapter is broken"
        na = report.not_applicable
        assert len(na) > len(CASES) // 2
        assert all(r.message.startswith("not applicable: ") for r in na)
        assert {r.case.id for r in na} >= {c.id for c in CASES if "claims" in c.requires}


def test_the_published_peer_table_is_the_measured_one(reports):
    text = DOCS.read_text("utf-8")
    start, end = text.index(PEERS_BEGIN), text.index(PEERS_END) + len(PEERS_END)
    assert text[start:end] == peers_markdown(reports), (
        "docs/conformance.md's peer table is stale: run python -m tests.conformance.peers"
    )


def test_a_lookup_that_proves_nothing_lets_the_effect_run_again(peer):
    """Both peers: an unknown send whose unfenced lookup misses is run again at once (a retry from an
    unknown outcome). The reference model keeps it indeterminate and sends nothing more."""
    peer.call("configure_platform", {"lookup": "unfenced"})
    key = _submit(peer)
    assert peer.call("dispatch", {"key": key, "fault": {"kind": "error_before_write"}}) == {"outcome": "send.unknown"}
    assert peer.call("get", {"key": key})["state"] == "indeterminate"
    assert peer.call("reconcile", {}) == {"lookup.not_found": 1}
    assert peer.call("platform", {"key": key}) == {"sends": 2, "objects": 1}


def test_a_proven_absence_reruns_the_effect_immediately_under_the_same_key(peer):
    """Both peers: a fenced miss re-runs the effect inside the same reconciliation, under the key the
    lookup just tombstoned, so the platform refuses it: a send is spent and nothing is published. The
    reference model moves to failed and retries later under a fresh fence epoch."""
    peer.call("configure_platform", {"lookup": "fenced"})
    key = _submit(peer)
    peer.call("dispatch", {"key": key, "fault": {"kind": "error_before_write"}})
    assert peer.call("reconcile", {}) == {"lookup.not_found_fenced": 1}
    assert peer.call("platform", {"key": key}) == {"sends": 2, "objects": 0}
    assert peer.call("get", {"key": key})["state"] != "published"


@pytest.mark.parametrize("fault", ["read_lag", "read_back_differs"])
def test_the_platforms_answer_is_taken_as_proof(peer, fault):
    """Both peers: a success answer is stored as the result; nothing is read back before it counts."""
    key = _submit(peer)
    assert peer.call("dispatch", {"key": key, "fault": {"kind": fault}}) == {"outcome": "send.success"}
    assert peer.call("get", {"key": key})["state"] == "published"


def test_no_last_check_before_the_bytes(peer):
    """Both peers: the effect runs right after the key is claimed; there is no authorization step
    between (kill switch, credential, lease deadline), and a worker lost before any byte left is
    indistinguishable from one lost after: the key stays unsettled, and nothing frees it."""
    key = _submit(peer)
    out = peer.call("authorize_dispatch", {"lease": {"key": key}, "request_digest": "x"})
    assert out["error"]["type"] == "unsupported"
    assert peer.call("dispatch", {"key": key, "fault": {"kind": "worker_dies", "at": "after_begin"}}) == {
        "crashed": "after_begin"
    }
    assert peer.call("platform", {"key": key}) == {"sends": 0, "objects": 0}
    assert peer.call("get", {"key": key})["state"] == "indeterminate"
    assert peer.call("sweep", {})["retried"] == 0


def test_agent_once_never_retries_a_proven_not_sent():
    """agent-once: a refused connection is recorded failed and every later call raises EffectFailed;
    the reference model retries a failed intent up to its attempt cap."""
    d = peer_driver("agent-once")
    d.reset()
    try:
        key = _submit(d)
        assert d.call("dispatch", {"key": key, "fault": {"kind": "connect_refused"}}) == {"outcome": "send.not_sent"}
        assert d.call("get", {"key": key})["state"] == "failed"
        assert d.call("sweep", {})["retried"] == 0
        assert d.call("dispatch", {"key": key}) == {"outcome": "refused:EffectFailed"}
    finally:
        d.close()


def test_exactly_once_keeps_a_proven_not_sent_unknown():
    """exactly-once: an effect that raised leaves its key in flight (quarantined), a refused connection
    too: a definitive not-sent is kept exactly like an unknown outcome."""
    d = peer_driver("exactly-once")
    d.reset()
    try:
        key = _submit(d)
        assert d.call("dispatch", {"key": key, "fault": {"kind": "connect_refused"}}) == {"outcome": "send.not_sent"}
        assert d.call("get", {"key": key})["state"] == "indeterminate"
        assert d.call("dispatch", {"key": key}) == {"outcome": "refused:QuarantinedError"}
    finally:
        d.close()


def test_agent_once_keys_number_spellings_apart():
    """agent-once: its key hashes the arguments as written, so the same request with 1.0 written as 1
    is a second call and runs the effect twice (the delivery key hashes canonical JSON)."""
    d = peer_driver("agent-once")
    d.reset()
    try:
        a, b = _submit(d, n=1.0), _submit(d, n=1)
        assert a != b
        d.call("dispatch", {"key": a})
        d.call("dispatch", {"key": b})
        assert d.call("platform", {"key": a})["objects"] + d.call("platform", {"key": b})["objects"] == 2
    finally:
        d.close()
