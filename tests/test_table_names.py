"""The table's vocabulary as attributes (``atmostonce.names``, ``Table.names``) and the semantic flags the code
reads through the loaded table instead of lists of its own (docs/design.md, "One table, read by everything")."""

from __future__ import annotations

import ast
import copy
import dataclasses
import importlib
import pickle
import sys
from pathlib import Path
from types import MappingProxyType

import pytest

from atmostonce import GuardRefused, MemoryStore
from atmostonce.errors import TableCode
from atmostonce.names import ACTOR, APPROVAL_EVENT, CLAIM_EVENT, CLAIM_GUARD, CLAIM_STATE, EVENT, GUARD, OUTCOME, STATE
from atmostonce.table import TableError, UnknownName, machine, parse_table, table
from tests.fixtures.broken_tables import raw_table
from tests.helpers import submit
from tests.test_store_reads_and_refusals import second_attempt

ROOT = Path(__file__).resolve().parents[1]
NAMESPACES = {
    "STATE": lambda: table().names.state,
    "EVENT": lambda: table().names.event,
    "GUARD": lambda: table().names.guard,
    "EFFECT": lambda: table().names.effect,
    "OUTCOME": lambda: table().names.outcome,
    "ACTOR": lambda: table().names.actor,
    "CLAIM_STATE": lambda: machine("claim").names.state,
    "CLAIM_EVENT": lambda: machine("claim").names.event,
    "CLAIM_GUARD": lambda: machine("claim").names.guard,
    "APPROVAL_EVENT": lambda: machine("approval").names.event,
}


def test_each_name_reads_back_as_the_tables_own_spelling():
    t = table()
    assert OUTCOME.gate_rate_limited == "gate.rate_limited"
    assert OUTCOME.lookup_not_found_fenced == "lookup.not_found_fenced"
    assert (STATE.indeterminate, EVENT.record_unknown, GUARD.lease_holder, ACTOR.sweeper) == (
        "indeterminate",
        "record_unknown",
        "lease_holder",
        "sweeper",
    )
    assert list(t.names.outcome) == list(t.outcomes) and list(OUTCOME) == list(t.outcomes)
    assert list(STATE) == list(t.states) and len(GUARD) == len(t.guards)
    assert "send.unknown" in OUTCOME and "send_unknown" not in OUTCOME
    assert (CLAIM_STATE.sending, CLAIM_EVENT.replace, CLAIM_GUARD.claim_owner, APPROVAL_EVENT.approve) == (
        "sending",
        "replace",
        "claim_owner",
        "approve",
    )


def test_a_misspelt_name_is_refused_where_it_is_read_with_what_was_asked():
    with pytest.raises(UnknownName) as e:
        OUTCOME.gate_rate_limitd  # noqa: B018
    assert (e.value.vocabulary, e.value.name, e.value.table) == ("outcome", "gate_rate_limitd", table().name)
    assert isinstance(e.value, TableError) and e.value.code == TableCode.UNKNOWN_NAME
    with pytest.raises(UnknownName) as e:
        table().names.guard.lease_holdr  # noqa: B018
    assert (e.value.vocabulary, e.value.name) == ("guard", "lease_holdr")
    with pytest.raises(UnknownName) as e:
        CLAIM_GUARD.lease_holder  # noqa: B018  # an intent guard is not one of the claim's
    assert (e.value.vocabulary, e.value.name, e.value.table) == ("guard", "lease_holder", machine("claim").name)


def test_a_module_binding_a_misspelt_name_fails_at_import(tmp_path, monkeypatch):
    (tmp_path / "aom_typo_module.py").write_text(
        "from atmostonce.names import OUTCOME\nWAIT = OUTCOME.gate_rate_limitd\n", "utf-8"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UnknownName) as e:
        importlib.import_module("aom_typo_module")
    assert (e.value.vocabulary, e.value.name) == ("outcome", "gate_rate_limitd")
    assert "aom_typo_module" not in sys.modules


def test_the_namespaces_survive_copy_and_pickle_probes():
    names = table().names.state
    assert not hasattr(names, "__deepcopy__")  # a dunder probe is an AttributeError, not a vocabulary miss
    assert list(copy.deepcopy(names)) == list(names)
    assert list(pickle.loads(pickle.dumps(names))) == list(names)


def test_two_names_spelled_alike_are_refused_when_the_table_loads():
    raw = raw_table()
    raw["outcomes"]["gate_rate.limited"] = dict(raw["outcomes"]["gate.rate_limited"])
    with pytest.raises(TableError) as e:
        parse_table(raw)
    assert not isinstance(e.value, UnknownName)
    assert (e.value.code, e.value.name) == (TableCode.SPELLED_ALIKE, "gate_rate.limited")


def _names_used_in_code() -> list[tuple[str, int, str, str]]:
    """Every ``NAMESPACE.attr`` read in the shipped code, as ``(file, line, namespace, attr)``."""
    out = []
    for folder in ("reference", "adapters", "spec"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text("utf-8"))):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in NAMESPACES:
                    out.append((str(path.relative_to(ROOT)), node.lineno, node.value.id, node.attr))
    return out


def test_every_name_the_code_reads_is_declared_by_its_table():
    """Code paths no test runs are held to the table too: a typo anywhere in the shipped code fails here."""
    used = _names_used_in_code()
    assert len(used) > 50  # the runtime and the stores name the vocabulary through these
    undeclared = [(f, line, ns, attr) for f, line, ns, attr in used if attr not in dir(NAMESPACES[ns]())]
    assert undeclared == []


def _without(t, flag: str, guard: str):
    guards = dict(t.guards)
    guards[guard] = dataclasses.replace(guards[guard], **{flag: False})
    return dataclasses.replace(t, guards=MappingProxyType(guards))


@pytest.mark.parametrize("fencing", [True, False], ids=["fencing", "flag_removed"])
def test_a_stale_workers_refusal_is_recorded_only_when_its_guard_is_a_fencing_one(fencing):
    now = [1000.0]
    t = table() if fencing else _without(table(), "fencing", "lease_holder")
    s = MemoryStore(clock=lambda: now[0], table=t)
    it = submit(s)
    old, new = second_attempt(s, it, lambda secs: now.__setitem__(0, now[0] + secs))
    s.authorize_dispatch(new, request_digest=it.request_digest)
    with pytest.raises(GuardRefused) as e:
        s.record_unknown(old, reason="late")
    assert (e.value.event, e.value.guard) == ("record_unknown", "lease_holder")  # refused either way
    assert [r.guard for r in s.refusals(it.key)] == (["lease_holder"] if fencing else [])


def test_the_outbox_counts_a_dispatch_as_waited_by_the_outcomes_waiting_flag():
    from atmostonce.service import held_outcomes

    t = table()
    assert held_outcomes(t) == t.waiting_outcomes - {"gate.rate_limited", "claim.busy"}
    outcomes = dict(t.outcomes)
    outcomes["gate.paused"] = dataclasses.replace(outcomes["gate.paused"], waiting=False)
    assert "gate.paused" not in held_outcomes(dataclasses.replace(t, outcomes=MappingProxyType(outcomes)))
