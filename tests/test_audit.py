"""The audit history (docs/design.md#the-audit-order-tamper-evidence-the-role-reconciliation-records): ordered by the store's sequence, and tamper-evident through a
per-intent hash chain, on the model, SQLite and PostgreSQL."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import sqlalchemy as sa

from atmostonce import MemoryStore
from atmostonce.audit import AuditChain, AuditRow, chain_hash, float_text, verify_chain, verify_store
from atmostonce_cli.main import main
from tests.helpers import empty_database_url, submit, to_state

# ---------------------------------------------------------------- the chain function itself


def test_chain_hash_is_pinned_and_covers_every_field_and_the_link():
    fields = ("1", "k", "submit", "client", None, "pending", None, None, "{}", float_text(300.0))
    h = chain_hash(None, fields)
    # a stored chain must keep verifying: this value may only change with a new CHAIN_TAG
    assert h == chain_hash(None, list(fields))
    assert h == "2eb4220211dd2380d3a46f3332d18827b09fa594603fccef44809d8061199ed6"
    for i in range(len(fields)):
        changed = list(fields)
        changed[i] = "x" if fields[i] is None else None
        assert chain_hash(None, changed) != h, f"field {i} is not covered"
    assert chain_hash("0" * 64, fields) != h
    # length-prefixed: moving a boundary between two fields changes the hash
    assert chain_hash(None, ("1", "ab", "c", *fields[3:])) != chain_hash(None, ("1", "a", "bc", *fields[3:]))


def test_float_text_is_the_exact_double():
    assert float_text(300.0) == "4072c00000000000"
    assert float_text(0.1) != float_text(math.nextafter(0.1, 1.0))  # one ulp apart: different text
    assert float_text(1764572400.123456) == float_text(float("1764572400.123456"))


# ---------------------------------------------------------------- order is the store's sequence


def test_history_is_ordered_by_the_store_sequence_even_when_wall_time_runs_backwards(set_clock_store):
    store, set_clock = set_clock_store
    set_clock(300.0)
    it = submit(store)
    set_clock(200.0)
    lease = store.begin(it.key, lease_seconds=30)
    set_clock(100.0)
    store.authorize_dispatch(lease, request_digest=it.request_digest, send_lease_seconds=30)
    hist = store.history(it.key)
    assert [h.recorded_at for h in hist] == [300.0, 200.0, 100.0]  # the skew is really there
    assert [h.event for h in hist] == ["submit", "begin", "authorize_dispatch"]  # causal order
    seqs = [h.seq for h in hist]
    assert seqs == sorted(seqs) and len(set(seqs)) == 3
    by_wall_time = [h.event for h in sorted(hist, key=lambda h: h.recorded_at)]
    assert by_wall_time == ["authorize_dispatch", "begin", "submit"]  # what a timestamp sort would claim
    # the chain covers the recorded times and verifies with them
    assert verify_store(store, [it.key]).intact


# ---------------------------------------------------------------- chains on every store


def _busy(store):
    keys = []
    for state in ("published", "failed", "indeterminate", "parked", "pending"):
        it, _ = to_state(store, state, text=f"text {state}")
        keys.append(it.key)
    it, _ = to_state(store, "indeterminate", text="reconciled")
    store.reconcile_found(store.get(it.key).plan, remote_id="r-9")
    keys.append(it.key)
    return keys


def test_every_chain_verifies_and_links_each_row_to_the_one_before(any_store):
    s = any_store.store
    keys = _busy(s)
    report = verify_store(s)
    assert report.intact and report.intents == len(keys)
    assert report.rows == sum(len(s.history(k)) for k in keys)
    for k in keys:
        chain = s.audit_chain(k)
        assert [r.seq for r in chain.rows] == [h.seq for h in s.history(k)]
        assert chain.rows[0].prev_hash is None
        assert all(b.prev_hash == a.row_hash for a, b in zip(chain.rows, chain.rows[1:], strict=False))
        assert chain.recorded_rows == len(chain.rows)
    assert len({r.row_hash for k in keys for r in s.audit_chain(k).rows}) == report.rows


def test_the_model_detects_a_rewritten_and_a_removed_row():
    s = MemoryStore()
    it, _ = to_state(s, "published")
    rows = s.history(it.key)
    i = next(n for n, h in enumerate(s._history) if h.seq == rows[2].seq)
    s._history[i] = dataclasses.replace(s._history[i], actor="mallory")
    broken = verify_store(s).breaks
    assert [(b.key, b.seq, b.reason) for b in broken] == [(it.key, rows[2].seq, "content")]
    del s._history[i]
    broken = verify_store(s).breaks
    assert [(b.seq, b.reason) for b in broken] == [(rows[3].seq, "link")]


def test_verify_chain_reports_the_first_break_only():
    fields = ("1", "k", "submit", "client", None, "pending", None, None, "{}", float_text(1.0))
    h1 = chain_hash(None, fields)
    f2 = ("2", *fields[1:])
    h2 = chain_hash(h1, f2)
    good = (AuditRow(1, fields, None, h1), AuditRow(2, f2, h1, h2))
    assert verify_chain(AuditChain("k", good, 2)) is None
    assert verify_chain(AuditChain("k", good, 3)).reason == "count"
    assert verify_chain(AuditChain("k", good[:1], 2)).seq is None
    bad = (AuditRow(1, ("1", "k", "x", *fields[3:]), None, h1), AuditRow(2, f2, "f" * 64, h2))
    assert verify_chain(AuditChain("k", bad, 2)).seq == 1
    assert verify_chain(AuditChain("k", (AuditRow(1, fields, None, None),), 1)).reason == "unhashed"


# ---------------------------------------------------------------- tampering on real databases


def _as_attacker(store, sql: str, params: dict | None = None) -> None:
    """Change history as someone with the database's owner (PostgreSQL superuser, SQLite file) rights:
    the append-only triggers are switched off first."""
    with store.engine.begin() as conn:
        if store.dialect == "postgresql":
            conn.exec_driver_sql("SET LOCAL session_replication_role = replica")  # no triggers fire
            conn.execute(sa.text(sql), params or {})
        else:
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS aom_history_no_update")
            conn.exec_driver_sql("DROP TRIGGER IF EXISTS aom_history_no_delete")
            conn.execute(sa.text(sql), params or {})


def _verify_cli(capsys, url, *extra):
    rc = main(["audit", "verify", "--database-url", url, "--json", *extra])
    out, _ = capsys.readouterr()
    return rc, json.loads(out)


def _url(store):
    return store.engine.url.render_as_string(hide_password=False)


def test_verify_names_the_first_altered_row(sql_store, capsys):
    s = sql_store
    keys = _busy(s)
    rc, doc = _verify_cli(capsys, _url(s))
    assert rc == 0 and doc["intact"] and doc["intents"] == len(keys)
    victim = keys[0]
    seqs = [h.seq for h in s.history(victim)]
    _as_attacker(s, "UPDATE aom_history SET actor = 'operator:mallory' WHERE seq = :s", {"s": seqs[2]})
    assert s.history(victim)[2].actor == "operator:mallory"
    rc, doc = _verify_cli(capsys, _url(s))
    assert rc == 1 and not doc["intact"]
    assert [(b["key"], b["seq"], b["reason"]) for b in doc["breaks"]] == [(victim, seqs[2], "content")]
    # the other chains are intact: only this intent is reported
    rc, doc = _verify_cli(capsys, _url(s), "--key", keys[1])
    assert rc == 0 and doc["intents"] == 1


def test_verify_detects_a_rewritten_time_and_a_rewritten_detail(sql_store):
    s = sql_store
    it, _ = to_state(s, "failed")
    seqs = [h.seq for h in s.history(it.key)]
    _as_attacker(s, "UPDATE aom_history SET recorded_at = recorded_at + 1e-6 WHERE seq = :s", {"s": seqs[1]})
    [b] = verify_store(s).breaks
    assert (b.seq, b.reason) == (seqs[1], "content")
    other, _ = to_state(s, "failed", text="other")
    oseqs = [h.seq for h in s.history(other.key)]
    detail = '\'{"reason": "it was sent"}\'' + ("::jsonb" if s.dialect == "postgresql" else "")
    _as_attacker(s, f"UPDATE aom_history SET detail = {detail} WHERE seq = :s", {"s": oseqs[-1]})
    assert {(b.key, b.seq, b.reason) for b in verify_store(s).breaks} == {
        (it.key, seqs[1], "content"),
        (other.key, oseqs[-1], "content"),
    }


def test_verify_detects_a_removed_row_and_a_removed_newest_row(sql_store, capsys):
    s = sql_store
    a, _ = to_state(s, "published", text="a")
    b, _ = to_state(s, "published", text="b")
    sa_, sb = [h.seq for h in s.history(a.key)], [h.seq for h in s.history(b.key)]
    _as_attacker(s, "DELETE FROM aom_history WHERE seq = :s", {"s": sa_[1]})  # the middle of a's chain
    _as_attacker(s, "DELETE FROM aom_history WHERE seq = :s", {"s": sb[-1]})  # the newest row of b's chain
    rc, doc = _verify_cli(capsys, _url(s))
    assert rc == 1
    found = {x["key"]: (x["seq"], x["reason"]) for x in doc["breaks"]}
    assert found == {a.key: (sa_[2], "link"), b.key: (None, "count")}


def test_a_row_inserted_outside_the_store_is_detected_on_sqlite(sqlite_store):
    s = sqlite_store
    it, _ = to_state(s, "indeterminate")
    with s.engine.begin() as conn:  # an INSERT is allowed, but whoever writes it gets no valid hash
        conn.exec_driver_sql(
            "INSERT INTO aom_history (key, event, actor, from_state, to_state, detail, recorded_at) "
            f"VALUES ('{it.key}', 'reconcile_absent', 'reconciler', 'indeterminate', 'failed', '{{}}', 1.0)"
        )
    [b] = verify_store(s).breaks
    assert b.reason == "unhashed"


# ---------------------------------------------------------------- migration 0002 chains what was there


@pytest.mark.parametrize("dialect", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def test_migration_0002_chains_rows_written_before_it(request, dialect, tmp_path):
    from atmostonce_sql import make_engine, open_store, upgrade

    url, cleanup = empty_database_url(request, dialect, tmp_path)
    engine = make_engine(url)
    try:
        upgrade(engine, "0001")
        cols = (
            "key, account, action_kind, target, request, request_digest, state, attempt_count, max_attempts, "
            "reconcile_count, max_reconciles, resend_epoch, normalizer_version, created_at, updated_at, generation"
        )
        with engine.begin() as conn:  # two intents as revision 0001 wrote them (as the history below derives)
            for key, state, attempts, gen in (("k-old-1", "indeterminate", 1, "7"), ("k-old-2", "pending", 0, "NULL")):
                conn.exec_driver_sql(
                    f"INSERT INTO aom_intents ({cols}) VALUES "
                    f"('{key}', 'a', 'post', 't', '{{}}', 'd', '{state}', {attempts}, 3, 0, 3, 0, 1, 10.5, 12.25, {gen})"
                )
            moves = [
                ("k-old-1", "submit", None, "pending", "{}"),
                ("k-old-2", "submit", None, "pending", "{}"),
                ("k-old-1", "begin", "pending", "pending", "{}"),
                ("k-old-1", "authorize_dispatch", "pending", "authorized", '{"descriptor": {"v": 1.5}}'),
                ("k-old-1", "record_unknown", "authorized", "indeterminate", '{"reason": "read timeout"}'),
            ]
            for i, (key, event, frm, to, detail) in enumerate(moves):
                conn.execute(
                    sa.text(
                        "INSERT INTO aom_history (key, event, actor, from_state, to_state, generation, detail, "
                        "recorded_at) VALUES (:k, :e, 'worker', :f, :t, 7, "
                        + ("CAST(:d AS jsonb)" if dialect == "postgresql" else ":d")
                        + ", :r)"
                    ),
                    {"k": key, "e": event, "f": frm, "t": to, "d": detail, "r": 1764572400.1 + i / 3},
                )
        upgrade(engine)
    finally:
        engine.dispose()
    store = open_store(url, migrate=False)
    try:
        report = verify_store(store)
        assert report.intact and report.rows == 5 and report.intents == 2
        assert store.audit_chain("k-old-1").recorded_rows == 4
        # the indeterminate intent's unknown send has its opening reconciliation record
        [rec] = store.reconciliations("k-old-1")
        assert (rec.result, rec.event) == ("unknown", "record_unknown")
        assert rec.send_seq == store.history("k-old-1")[-1].seq
        assert store.reconciliations("k-old-2") == []
        # and the store chains on from the migrated head
        store.park("k-old-1", operator="alice")
        assert verify_store(store).intact
    finally:
        store.close()
        if cleanup:
            cleanup()
