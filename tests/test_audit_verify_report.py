"""What the audit verifier reports.

``atmostonce audit verify --json`` prints these dictionaries and an operator reads the first break of a
chain from them: its intent, row, reason and message, and each chain's head hash.
"""

from __future__ import annotations

from atmostonce import MemoryStore
from atmostonce.audit import (
    AuditChain,
    AuditReport,
    AuditRow,
    ChainBreak,
    chain_hash,
    float_text,
    model_detail_text,
    verify_chain,
    verify_store,
)
from tests.helpers import to_state

F1 = ("1", "k", "submit", "client", None, "pending", None, None, "{}", float_text(1.0))
F2 = ("2", *F1[1:])
H1 = chain_hash(None, F1)
H2 = chain_hash(H1, F2)


def test_each_kind_of_break_names_the_intent_the_row_and_what_went_wrong():
    unhashed = AuditChain("k", (AuditRow(1, F1, None, H1), AuditRow(2, F2, H1, None)), 2)
    assert verify_chain(unhashed) == ChainBreak("k", 2, "unhashed", "history row 2 carries no hash")
    link = AuditChain("k", (AuditRow(1, F1, None, H1), AuditRow(2, F2, "f" * 64, H2)), 2)
    assert verify_chain(link) == ChainBreak(
        "k",
        2,
        "link",
        "history row 2 does not link to the row before it: a row was removed, inserted or reordered, "
        "or the previous row was rewritten with its hash",
    )
    content = AuditChain("k", (AuditRow(1, F1, None, H1), AuditRow(2, ("2", "k", "x", *F1[3:]), H1, H2)), 2)
    assert verify_chain(content) == ChainBreak("k", 2, "content", "history row 2 differs from what was hashed")
    count = AuditChain("k", (AuditRow(1, F1, None, H1), AuditRow(2, F2, H1, H2)), 3)
    assert verify_chain(count) == ChainBreak("k", None, "count", "the intent recorded 3 history rows, 2 are present")
    assert verify_chain(AuditChain("k", count.rows, 2)) is None


def test_a_break_and_a_report_as_the_json_the_cli_prints():
    b = ChainBreak("k", 2, "content", "history row 2 differs from what was hashed")
    assert b.as_dict() == {
        "key": "k",
        "seq": 2,
        "reason": "content",
        "field": None,
        "message": "history row 2 differs from what was hashed",
    }
    report = AuditReport(3, 7, (b,), {"k": H2, "j": None})
    assert report.as_dict() == {
        "intact": False,
        "intents": 3,
        "rows": 7,
        "breaks": [b.as_dict()],
        "heads": {"k": H2, "j": None},
    }


def test_verify_store_reports_each_chains_head_and_none_for_an_empty_chain():
    s = MemoryStore()
    it, _ = to_state(s, "published")
    report = verify_store(s)
    chain = s.audit_chain(it.key)
    assert report.as_dict() == {
        "intact": True,
        "intents": 1,
        "rows": len(chain.rows),
        "breaks": [],
        "heads": {it.key: chain.rows[-1].row_hash},
    }

    class NoRows:
        def audit_chain(self, key):
            return AuditChain(key, (), 0)

    assert verify_store(NoRows(), ["gone"]).as_dict() == {
        "intact": True,
        "intents": 1,
        "rows": 0,
        "breaks": [],
        "heads": {"gone": None},
    }


def test_the_models_detail_text_is_the_canonical_json_of_the_detail():
    assert model_detail_text({"b": 1, "a": "é"}) == '{"a":"é","b":1}'
    assert model_detail_text({}) == "{}"
