"""Approvals a database writer cannot forge (docs/design.md#signed-approvals): with signing on for an
account, a send is authorized only under an approval signed by its approver's registered Ed25519 key,
verified by the worker before bytes and held to the verified row by the authorizing write."""

from __future__ import annotations

import json
import os
import stat

import pytest
import sqlalchemy as sa

from atmostonce import GuardRefused, IntakeError
from atmostonce.runtime import Dispatcher, RuntimeConfig
from atmostonce.signing import (
    SignedApproval,
    approval_payload,
    key_id,
    new_private_key,
    public_key_hex,
    public_key_pem,
    verify_approval,
)
from tests.test_claims import TARGET, approve, gated, reserve

CONFIG = RuntimeConfig(lease_seconds=30, send_lease_seconds=30, reconcile_interval=0)
ALICE, BOB = new_private_key(), new_private_key()


def signing_on(s):
    s.add_operator_key("alice", public_key_pem(ALICE), added_by="admin")
    s.add_operator_key("bob", public_key_pem(BOB), added_by="admin")
    s.set_signing_required("acct", True)


def authorize_under(s, it, apv):
    claim = reserve(s, it, apv)
    lease = s.begin(it.key, lease_seconds=30)
    return lambda: s.authorize_dispatch(lease, request_digest=it.request_digest, claim=claim)


def refused_at_authorization(s, it, apv):
    go = authorize_under(s, it, apv)
    with pytest.raises(GuardRefused) as info:
        go()
    e = info.value
    assert (e.event, e.key, e.guard, e.state) == ("start_sending", TARGET, "approval_signature_verified", "reserved")
    assert s.get(it.key).state == "pending"  # nothing authorized, nothing sent
    assert s.approval(apv.approval_id).state == "approved"


def _raw_approval(s, it, approval_id, **cols):
    """An approval row written by someone with write access to the table, not through approve()."""
    from atmostonce_sql.schema import approvals

    now = s.now()
    row = {
        "approval_id": approval_id,
        "key": it.key,
        "request_digest": it.request_digest,
        "account": it.account,
        "target": it.target,
        "target_version": 0,
        "approver": "alice",
        "expires_at": float(int(now + 600)),
        "state": "approved",
        "approved_at": now,
        "updated_at": now,
    } | cols
    with s.engine.begin() as conn:
        conn.execute(sa.insert(approvals).values(**row))
    return s.approval(approval_id)


# ---------------------------------------------------------------- rows a database writer made
def test_a_directly_inserted_unsigned_approval_is_refused_at_authorization(sql_store):
    s = sql_store
    signing_on(s)
    it = gated(s)
    s.approve(it.key, approver="alice", expires_in=600)  # the claim row, as a first approval makes it
    for a in s.approvals(it.key):
        s.withdraw_approval(a.approval_id, operator="alice")
    refused_at_authorization(s, it, _raw_approval(s, it, "apv_raw_unsigned"))


def test_a_directly_inserted_forged_signature_is_refused_at_authorization(sql_store):
    s = sql_store
    signing_on(s)
    it = gated(s)
    kid = key_id(public_key_hex(ALICE))
    forged = _raw_approval(s, it, "apv_raw_forged", signature="ab" * 64, signing_key_id=kid)
    refused_at_authorization(s, it, forged)


def test_a_signed_row_whose_expiry_a_writer_extended_is_refused(sql_store):
    from atmostonce_sql.schema import approvals

    s = sql_store
    signing_on(s)
    it = gated(s)
    apv = s.approve_signed(it.key, approver="alice", expires_in=600, private_key=ALICE)
    with s.engine.begin() as conn:
        conn.execute(
            sa.update(approvals)
            .where(approvals.c.approval_id == apv.approval_id)
            .values(expires_at=apv.expires_at + 86400)
        )
    refused_at_authorization(s, it, s.approval(apv.approval_id))


# ---------------------------------------------------------------- every store alike
def test_an_unsigned_approval_is_refused_at_authorization_when_signing_is_required(any_store):
    s = any_store.store
    signing_on(s)
    it = gated(s)
    refused_at_authorization(s, it, approve(s, it))


def test_a_forged_signature_is_refused_at_authorization(any_store):
    s = any_store.store
    signing_on(s)
    it = gated(s)
    kid = key_id(public_key_hex(ALICE))
    fake = SignedApproval(kid, "cd" * 64, float(int(s.now() + 600)), 0)
    refused_at_authorization(s, it, s.approve(it.key, approver="alice", signed=fake))


def test_a_signature_by_another_operators_key_is_refused(any_store):
    s = any_store.store
    signing_on(s)
    it = gated(s)
    apv = s.approve_signed(it.key, approver="alice", expires_in=600, private_key=BOB)  # bob signs for alice
    assert apv.signing_key_id == key_id(public_key_hex(BOB))
    assert verify_approval(public_key_hex(BOB), apv)  # a valid signature, but not the approver's key
    refused_at_authorization(s, it, apv)


def test_a_signature_by_an_unregistered_key_is_refused(any_store):
    s = any_store.store
    signing_on(s)
    it = gated(s)
    refused_at_authorization(
        s, it, s.approve_signed(it.key, approver="alice", expires_in=600, private_key=new_private_key())
    )


def test_a_valid_signed_approval_dispatches_and_the_send_records_the_signature(any_store):
    from atmostonce_http import HttpTransport, PlatformSink, sink_config

    s = any_store.store
    signing_on(s)
    it = gated(s)
    apv = s.approve_signed(it.key, approver="alice", expires_in=600, private_key=ALICE)
    assert apv.signing_key_id == key_id(public_key_hex(ALICE)) and apv.expires_at == int(apv.expires_at)
    with PlatformSink() as sink, HttpTransport(sink_config(sink.url)) as transport:
        assert Dispatcher(s, transport, CONFIG, owner="w1").dispatch(it.key) == "read_back.match"
        assert sink.creates == 1
    assert s.get(it.key).state == "published"
    used = [h for h in s.claim_history(TARGET) if h.event in ("start_sending", "consume_approval")]
    assert [h.event for h in used] == ["start_sending", "consume_approval"]
    for h in used:  # which approval signature the authorization relied on
        assert h.detail["sig_key_id"] == apv.signing_key_id
        assert h.detail["sig_signature"] == apv.signature


def test_the_dispatcher_sends_nothing_under_an_unsigned_approval_when_signing_is_required(any_store):
    from atmostonce_http import HttpTransport, PlatformSink, sink_config

    s = any_store.store
    signing_on(s)
    it = gated(s)
    approve(s, it)
    with PlatformSink() as sink, HttpTransport(sink_config(sink.url)) as transport:
        assert Dispatcher(s, transport, CONFIG, owner="w1").dispatch(it.key) == "claim.refused"
        assert sink.creates == 0
    assert s.get(it.key).state == "pending"


def test_signing_off_leaves_unsigned_approvals_usable(any_store):
    s = any_store.store
    signing_on(s)
    s.set_signing_required("acct", False)
    assert s.signing_required("acct") is False
    it = gated(s)
    authorize_under(s, it, approve(s, it))()
    assert s.get(it.key).state == "authorized"


def test_operator_keys_are_registered_once_per_operator(any_store):
    s = any_store.store
    k = s.add_operator_key("alice", public_key_pem(ALICE), added_by="admin")
    assert (k.key_id, k.operator, k.public_key, k.added_by) == (
        key_id(public_key_hex(ALICE)),
        "alice",
        public_key_hex(ALICE),
        "admin",
    )
    assert s.add_operator_key("alice", public_key_hex(ALICE), added_by="admin") == k
    with pytest.raises(IntakeError):
        s.add_operator_key("bob", public_key_pem(ALICE), added_by="admin")
    with pytest.raises(IntakeError):
        s.add_operator_key("bob", "not a key", added_by="admin")
    assert s.operator_key(k.key_id) == k


def test_the_signed_bytes_are_the_canonical_json_of_the_approval_with_a_domain_tag():
    fields = {
        "key": "k" * 64,
        "request_digest": "d" * 64,
        "account": "acct",
        "target": "room",
        "target_version": 3,
        "expires_at": 1700000000.0,
        "approver": "alice",
    }
    assert approval_payload(fields, "ed25519:" + "0" * 32) == (
        b'{"account":"acct","approver":"alice","domain":"atmostonce.approval.v1","expires_at":1700000000,'
        b'"key":"'
        + b"k" * 64
        + b'","request_digest":"'
        + b"d" * 64
        + b'","signing_key_id":"ed25519:'
        + b"0" * 32
        + b'","target":"room","target_version":3}'
    )


# ---------------------------------------------------------------- the CLI
def test_the_cli_makes_registers_and_signs_with_an_operator_key(capsys, tmp_path):
    from atmostonce import open_store
    from atmostonce_cli.main import main as cli

    url = f"sqlite:///{tmp_path / 'cli.sqlite3'}"
    keyfile = tmp_path / "alice.key"
    assert cli(["operator-key", "new", "--out", str(keyfile)]) == 0
    pub = capsys.readouterr().out
    assert stat.S_IMODE(os.stat(keyfile).st_mode) == 0o600
    assert pub.startswith("-----BEGIN PUBLIC KEY-----")
    (tmp_path / "alice.pub").write_text(pub, "utf-8")
    assert (
        cli(["operator-key", "add", "alice", "--public-key", str(tmp_path / "alice.pub"), "--database-url", url]) == 0
    )
    assert cli(["policy", "signing", "acct", "on", "--operator", "ops", "--database-url", url]) == 0
    s = open_store(url)
    it = gated(s)
    capsys.readouterr()
    rc = cli(
        ["approve", it.key, "--approver", "alice", "--expires-in", "600", "--key", str(keyfile)]
        + ["--database-url", url, "--json"]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    apv = s.approval(out["approval_id"])
    assert s.signing_required("acct") is True
    assert apv.signing_key_id == s.operator_key(apv.signing_key_id).key_id
    assert s.verified_signature_args(apv)["sig_signature"] == apv.signature
    with s.engine.connect() as conn:  # the private key never enters the database
        private_pem = keyfile.read_text("utf-8")
        body = "".join(private_pem.splitlines()[1:-1])
        dump = "\n".join(
            str(r) for t in ("aom_operator_keys", "aom_approvals") for r in conn.exec_driver_sql(f"SELECT * FROM {t}")
        )
        assert body not in dump
    s.close()
