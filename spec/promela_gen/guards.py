"""The Promela translation of every guard: table guard -> Promela expression.

The third registry of each guard, beside the model predicates (``reference/atmostonce/guards.py``
``GUARDS``, ``reference/atmostonce/claims.py`` ``CLAIM_GUARDS`` / ``APPROVAL_GUARDS``) and the SQL
fragments (``adapters/atmostonce_sql/guards.py`` ``SQL_GUARDS``, ``adapters/atmostonce_sql/claims.py``
``CLAIM_SQL_GUARDS`` / ``APPROVAL_SQL_GUARDS``); ``tests/test_formal.py`` checks that each map here
covers exactly its machine's guard catalogue, as ``tests/test_guards.py`` does for the other two.

* :data:`PROMELA_GUARDS`: the intent table's guards (``spec/table.toml``) in the intent
  configurations (main, text, restore), over the model's row and world variables;
* :data:`CLAIMS_INTENT_GUARDS`: the same guards in the claims configuration, where the intent
  machine is abstracted (attempt ownership and leases stay; the rest is ``true``, checked by the
  intent configurations);
* :data:`CLAIM_PROMELA_GUARDS` / :data:`APPROVAL_PROMELA_GUARDS`: the claim and approval machines'
  guards (``spec/claim.toml``, ``spec/approval.toml``), in the claims configuration.

An expression's ``{placeholders}`` are what the caller presents; each configuration binds them per
actor (``ACTOR_ARGS`` in ``configurations/main.py``, ``CLAIMS_ACTOR_ARGS`` in
``configurations/claims.py``). A guard without a translation is a :class:`GenerationError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from .base import GenerationError

__all__ = [
    "APPROVAL_PROMELA_GUARDS",
    "CLAIMS_INTENT_GUARDS",
    "CLAIM_GUARDS_PML",
    "CLAIM_PROMELA_GUARDS",
    "PROMELA_GUARDS",
    "claim_guard_expr",
    "guard_expr",
]

# The predicates of reference/atmostonce/guards.py over the model's row and world.
PROMELA_GUARDS: Mapping[str, str] = MappingProxyType(
    {
        "no_open_attempt": "!att_open",
        "attempts_remaining": "attempt_count < max_attempts",
        "attempts_exhausted": "attempt_count >= max_attempts",
        "lease_holder": "(att_open && row_tok == {lease_tok} && gen == {lease_gen})",
        "lease_live": "lease == LIVE",
        "lease_expired": "lease == EXPIRED",
        "request_digest_matches": "{digest_ok}",
        "remote_id_known": "rid != 0",
        "restore_epoch_current": "(row_rep == {lease_rep} && {lease_rep} == repoch)",
        # world state read at the instant of the write: the caller's choice `pol` says which one
        # (if any) is off at that instant
        "kill_switch_off": "{kill_off}",
        "credential_current": "{credential_ok}",
        "contract_supported": "{contract_ok}",
        "source_is_head": "{source_ok}",
        "rate_limit_clear": "{rate_ok}",
        "text_window_clear": "txt_other == 0",
        "no_remote_object": "rid == 0",
        "plan_unchanged": "(gen == {plan_gen} && rc == {plan_rc} && {plan_rep} == repoch)",
        "absence_provable": "row_rep == repoch",
        "reconcile_budget_left": "rc < max_rc",
        "evidence_fenced": "{fenced}",
        "operator_identified": "{operator}",
    }
)

# The intent machine's guards in the claims configuration: `k` is the intent's index. Attempt
# ownership and leases stay (a stale worker cannot record an outcome on someone else's attempt);
# the rest are checked in the other configurations and are free here.
CLAIMS_INTENT_GUARDS: Mapping[str, str] = MappingProxyType(
    {
        "no_open_attempt": "i_tok[k] == 0",
        "attempts_remaining": "true",
        "attempts_exhausted": "true",
        "lease_holder": "(i_tok[k] != 0 && i_tok[k] == {lease_tok})",
        # the intent's send lease: once the claim is sending it is the claim lease (extend_claim_lease);
        # before that, any lease may have passed (the sweeper's abandon is always possible)
        "lease_live": "true",
        "lease_expired": "(!(c_tied && c_key == k) || c_lease == EXPIRED)",
        "request_digest_matches": "true",
        "remote_id_known": "true",
        "restore_epoch_current": "true",
        "kill_switch_off": "true",
        "credential_current": "true",
        "contract_supported": "true",
        "source_is_head": "true",
        "rate_limit_clear": "true",
        "text_window_clear": "true",
        "no_remote_object": "true",
        "plan_unchanged": "true",
        "absence_provable": "true",
        "reconcile_budget_left": "true",
        "evidence_fenced": "true",
        "operator_identified": "{operator}",
    }
)

# The claim guards (reference/atmostonce/claims.py CLAIM_GUARDS): `k` the intent the move is for,
# `ap` the approval (presented at reserve, the claim's bound approval for a coupled move);
# {cl_ep} / {cl_tok} the claim lease the caller presents, {digest} the bytes it means to send.
CLAIM_PROMELA_GUARDS: Mapping[str, str] = MappingProxyType(
    {
        "intent_queued": "i_st[k] == {intent_initial}",
        "approval_usable": "(ap != 0 && a_st[ap] == {approval_live} && a_dl[ap] == LIVE)",
        "approval_binds_request": "(ap != 0 && a_dig[ap] == {digest} && a_dig[ap] == i_dig[k])",
        # every approval in the model is made by its authenticated approver: there is no database writer
        # who forges one, so the signature check holds for each (modelcheck.NOT_CAUGHT says why)
        "approval_signature_verified": "true",
        "approval_for_intent": "(ap != 0 && a_key[ap] == k)",
        "target_version_current": "(ap != 0 && a_ver[ap] == tver)",
        "claim_owner": "(c_tok != 0 && c_tok == {cl_tok} && c_ep == {cl_ep})",
        "claim_lease_live": "c_lease == LIVE",
        "claim_lease_expired": "c_lease == EXPIRED",
        "bound_to_intent": "(c_key != 0 && c_key == k)",
    }
)

# The approval guards (reference/atmostonce/claims.py APPROVAL_GUARDS).
APPROVAL_PROMELA_GUARDS: Mapping[str, str] = MappingProxyType(
    {
        "approver_identified": "{approver}",
        "approval_deadline_passed": "a_dl[ap] == EXPIRED",
        "withdrawer_identified": "{operator}",
        "intent_awaiting_approval": "i_st[k] == {intent_initial}",
        # the model's approver always approves the intent's own bytes (record_approval copies its digest),
        # and its withdrawals give no reason to weigh: both hold for every move (modelcheck.NOT_CAUGHT)
        "approval_covers_intent_bytes": "true",
        "withdrawal_attributable": "true",
    }
)

# the claims configuration looks the claim and approval guards up in one namespace (their names differ)
CLAIM_GUARDS_PML: Mapping[str, str] = MappingProxyType({**CLAIM_PROMELA_GUARDS, **APPROVAL_PROMELA_GUARDS})


def guard_expr(name: str, where: str) -> str:
    """The intent configurations' translation of guard ``name`` (unformatted)."""
    try:
        return PROMELA_GUARDS[name]
    except KeyError:
        raise GenerationError(
            f"{where}: guard {name!r} has no Promela translation (add it to PROMELA_GUARDS)"
        ) from None


def claim_guard_expr(name: str, where: str, binding: Mapping[str, str]) -> str:
    """A claim or approval guard's translation, bound to the caller's arguments, in parentheses."""
    try:
        expr = CLAIM_GUARDS_PML[name]
    except KeyError:
        raise GenerationError(
            f"{where}: guard {name!r} has no Promela translation (add it to CLAIM_GUARDS_PML)"
        ) from None
    return "(" + expr.format_map(binding) + ")"
