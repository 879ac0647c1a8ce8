"""Configuration `claims`: two approval-gated intents share one target (``-DCLAIMS``).

Another model in the same file (the text between ``#ifdef CLAIMS`` and ``#else``): the target's
claim row (``spec/claim.toml``), the approvals (``spec/approval.toml``), and the coupling of intent
events to claim events (``couples`` / ``couples_required`` in ``spec/table.toml``) are generated
from the data; the intent machine runs with its states and events from the table, but its own
guards are abstracted (``CLAIMS_INTENT_GUARDS`` in ``guards.py``): the intent-level properties are
checked in the other configurations, this one checks what the claim and approval machines and the
coupling add (P10 to P16, :data:`CLAIM_PROPERTIES`). Its fixed environment is
``templates/claims.pml``; the claim and approval guards' translations are in ``guards.py``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from types import MappingProxyType

from atmostonce.table import Table

from ..base import (
    DEFAULT_BOUNDS,
    Binding,
    Bounds,
    GenerationError,
    any_of,
    block,
    kind_states,
    one_kind,
    placeholders,
    property_doc,
    property_switches,
    render,
)
from ..guards import CLAIM_GUARDS_PML, CLAIMS_INTENT_GUARDS, claim_guard_expr
from .main import INTENT_PROPERTIES, evidence

__all__ = [
    "CLAIMS_ACTOR_ARGS",
    "CLAIMS_APPROVALS",
    "CLAIMS_ATTEMPTS",
    "CLAIMS_EVIDENCE",
    "CLAIMS_INTENTS",
    "CLAIMS_INTENT_EFFECTS",
    "CLAIMS_TAKES",
    "CLAIM_EFFECTS_PML",
    "CLAIM_PROPERTIES",
    "FLAGS",
    "NAME",
    "broken_claim_freed_on_unknown",
    "generate_claims",
    "validate_claims",
]

NAME = "claims"
FLAGS: tuple[str, ...] = ("-DCLAIMS",)

# Callers' preconditions that differ here: no restore is modelled (rows rewound, stragglers: the
# restore configuration), but the operator may declare the restore fence at any moment at which no
# bytes are between their authorization and their send (the restore protocol waits out every send
# lease first, docs/design.md), so that its coupled claim move (fence_claim: reserved or sending ->
# uncertain) is explored against everything else.
CLAIMS_INTENTS = 2
CLAIMS_EVIDENCE: Mapping[str, str] = MappingProxyType(
    {"restore_fence": "(" + " && ".join(f"!i_gap[{j}]" for j in range(1, CLAIMS_INTENTS + 1)) + ")"}
)
CLAIMS_APPROVALS = 2
CLAIMS_ATTEMPTS = 2  # intent attempts begun, over both intents (attempt tokens are fresh)
CLAIMS_TAKES = 2  # claim reservations and replacements (owner tokens are fresh)

CLAIM_PROPERTIES: Mapping[str, str] = MappingProxyType(
    {
        "P10_one_dispatch_per_target": (
            "At most one intent of the target is in flight (authorized, or with bytes between its "
            "authorization and its send) at a time, and only under the target's claim: when an "
            "intent becomes in flight and when its bytes leave, the claim is sending, bound to "
            "that intent, held by the sender (its epoch and owner token), and the claim lease was "
            "live at the authorizing write; no other intent of the target is in flight."
        ),
        "P11_sending_claim_freed_only_when_settled": (
            "A claim that began sending (sending or uncertain) becomes free only together with an "
            "intent move that lands its intent in a settled state (published, or proved not sent: "
            "disposition done or retryable), or by an identified person."
        ),
        "P12_dispatch_under_its_approval": (
            "Every dispatch starts under an approval that a named person gave for this intent and "
            "for exactly the bytes sent, whose deadline is still ahead, and that has authorized no "
            "other dispatch."
        ),
        "P13_version_race_loser_sends_nothing": (
            "No two dispatches of the target start under approvals drafted against the same target "
            "version: of two approvals drafted in parallel, the loser of the compare-and-set on the "
            "target version sends nothing."
        ),
        "P14_approvals_end_truthfully": (
            "An approval leaves its live state only by being consumed by a dispatch, by a machine "
            "once its deadline has passed (database clock), or by an identified person."
        ),
        "P15_one_live_claim_lease": (
            "At most one holder of a live claim lease (the claim-level counterpart of P6): a worker "
            "that still holds the target's reservation (it has neither released it nor crashed) "
            "under a lease the database clock has not passed is never superseded by another "
            "worker's reserve or replace."
        ),
        "P16_reservation_only_for_a_queued_intent": (
            "Whenever the claim is reserved, the intent it is bound to is queued (the initial "
            "state), so a reservation never holds the target for an intent that cannot dispatch: "
            "it is taken only for a queued intent, and every move that takes its intent out of the "
            "queue other than the dispatch itself releases it in the same step."
        ),
    }
)

CLAIMS_INTENT_EFFECTS: Mapping[str, str] = MappingProxyType(
    {
        "create": "skip",
        "open_attempt": "tok_seq++; i_tok[k] = tok_seq",
        "extend_lease": "skip",
        "close_attempt": "i_tok[k] = 0",
        "fence_restore": "i_tok[k] = 0",
        **{
            e: "skip"
            for e in (
                "write_descriptor",
                "set_remote_id",
                "claim_text_slot",
                "release_text_slot",
                "take_rate_slot",
                "count_reconcile",
                "bump_resend_epoch",
                "bump_fence_epoch",
                "grant_attempt",
                "grant_reconcile",
            )
        },
    }
)

# The claim guards (reference/atmostonce/claims.py CLAIM_GUARDS): `k` the intent the move is for,
# `ap` the approval (presented at reserve, the claim's bound approval for a coupled move);
# {cl_ep} / {cl_tok} the claim lease the caller presents, {digest} the bytes it means to send.

CLAIM_EFFECTS_PML: Mapping[str, str] = MappingProxyType(
    {
        "take_claim": "c_ep++; ctok_seq++; c_tok = ctok_seq; c_key = k; c_apv = ap; c_lease = LIVE; c_tied = 0",
        "drop_claim": "c_tok = 0; c_key = 0; c_apv = 0; c_lease = NONE; c_tied = 0",
        "bump_target_version": "tver++",
        "extend_claim_lease": "c_lease = LIVE; c_tied = 1",
        "record_approval": (
            "na++; ap = na; a_key[ap] = k; a_dig[ap] = i_dig[k]; a_ver[ap] = tver; a_dl[ap] = LIVE; a_named[ap] = {approver}"
        ),
        "mark_used": "skip",
    }
)
CLAIMS_ACTOR_ARGS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "worker": MappingProxyType(
            {
                "caller": "w",
                "human": "0",
                "lease_tok": "my_gen",
                "cl_ep": "cl_ep",
                "cl_tok": "cl_tok",
                "digest": "i_dig[k]",
            }
        ),
        "sweeper": MappingProxyType({"caller": "NOBODY", "human": "0", "lease_tok": "i_tok[k]"}),
        "reconciler": MappingProxyType({"caller": "NOBODY", "human": "0"}),
        "operator": MappingProxyType({"caller": "NOBODY", "human": "op_named", "operator": "op_named"}),
        "approver": MappingProxyType({"caller": "NOBODY", "human": "op_named", "approver": "op_named"}),
    }
)


def claim_effects(effects: Iterable[str], where: str, binding: Mapping[str, str]) -> list[str]:
    out = []
    for eff in effects:
        if eff not in CLAIM_EFFECTS_PML:
            raise GenerationError(f"{where}: effect {eff!r} has no Promela translation (add it to CLAIM_EFFECTS_PML)")
        out.append(f"/* effect {eff} */ " + CLAIM_EFFECTS_PML[eff].format_map(binding) + ";")
    return out


def validate_claims(t: Table, claim_t: Table, approval_t: Table) -> None:
    for g in t.guards:
        if g not in CLAIMS_INTENT_GUARDS:
            raise GenerationError(
                f"guard {g!r} has no translation in the claims configuration (add it to CLAIMS_INTENT_GUARDS)"
            )
    for eff in t.effects:
        if eff not in CLAIMS_INTENT_EFFECTS:
            raise GenerationError(
                f"effect {eff!r} has no translation in the claims configuration (add it to CLAIMS_INTENT_EFFECTS)"
            )
    for m in (claim_t, approval_t):
        for g in m.guards:
            if g not in CLAIM_GUARDS_PML:
                raise GenerationError(f"{m.name}: guard {g!r} has no Promela translation (add it to CLAIM_GUARDS_PML)")
        for eff in m.effects:
            if eff not in CLAIM_EFFECTS_PML:
                raise GenerationError(
                    f"{m.name}: effect {eff!r} has no Promela translation (add it to CLAIM_EFFECTS_PML)"
                )
        for a in m.actors:
            if a not in CLAIMS_ACTOR_ARGS:
                raise GenerationError(f"{m.name}: actor {a!r} has no process in the claims configuration")
    names = [*t.states, *claim_t.states, *approval_t.states]
    if len(set(names)) != len(names):
        raise GenerationError(f"state names must differ across the three machines (one mtype namespace): {names}")
    shared = set(t.guards) & (set(claim_t.guards) | set(approval_t.guards))
    if shared or set(claim_t.guards) & set(approval_t.guards):
        raise GenerationError(f"guard names must differ across the machines: {sorted(shared)}")
    for ev in t.events.values():
        for m, cev in ev.couples.items():
            if m != "claim":
                raise GenerationError(f"event {ev.name!r} couples machine {m!r}: only the claim is modelled")
            if cev not in claim_t.events:
                raise GenerationError(f"event {ev.name!r} couples unknown claim event {cev!r}")
        for m in ev.couples_required:
            if m not in ev.couples:
                raise GenerationError(f"event {ev.name!r}: couples_required names {m!r} without a coupling")
    for cev in claim_t.events.values():
        for m, aev in cev.couples.items():
            if m != "approval" or aev not in approval_t.events:
                raise GenerationError(f"claim event {cev.name!r} couples {m}.{aev}: not modelled")


def broken_claim_freed_on_unknown(t: Table) -> Table:
    """The broken claims configuration: a worker's move from in flight to unknown (the first in the
    table: read_back_failed) frees the claim (couples the claim's settling move instead of uncertain)."""
    unknown = t.names.state.indeterminate
    in_flight = t.names.state.authorized
    settle = next(
        e.couples["claim"]
        for e in t.events.values()
        if "claim" in e.couples and in_flight in e.sources and e.target == t.names.state.published
    )
    # the first such move only: the other one keeps the coupling to uncertain, so no claim event
    # becomes a worker's own uncoupled call
    first = next(
        n
        for n, e in t.events.items()
        if e.actor == "worker" and in_flight in e.sources and e.target == unknown and "claim" in e.couples
    )
    events = {
        n: dataclasses.replace(e, couples=MappingProxyType({"claim": settle})) if n == first else e
        for n, e in t.events.items()
    }
    return dataclasses.replace(t, events=MappingProxyType(events))


def generate_claims(
    t: Table,
    claim_t: Table,
    approval_t: Table,
    *,
    drop_guard: str | None = None,
    bounds: Bounds = DEFAULT_BOUNDS,
    extra_evidence: Mapping[str, str] | None = None,
) -> str:
    """The claims configuration (the text between ``#ifdef CLAIMS`` and ``#else``)."""
    validate_claims(t, claim_t, approval_t)
    W, NI, NA = bounds.workers, CLAIMS_INTENTS, CLAIMS_APPROVALS
    in_flight = t.names.state.authorized
    settled = [t.names.state.published, t.names.state.failed]
    c_free = one_kind(claim_t, "free")
    c_dispatching = one_kind(claim_t, "dispatching")
    c_began = kind_states(claim_t, "dispatching", "uncertain")
    c_reserved = kind_states(claim_t, "pre_dispatch")
    p16 = (
        f"assert(!P16_reservation_only_for_a_queued_intent || !{any_of('c_st', c_reserved)} "
        f"|| (c_key != 0 && i_st[c_key] == {t.initial}));"
    )
    a_live = approval_t.initial
    claim_events_coupled = {cev for ev in t.events.values() for cev in ev.couples.values()}
    approval_events_coupled = {aev for cev in claim_t.events.values() for aev in cev.couples.values()}
    common = {"intent_initial": t.initial, "approval_live": a_live}

    def others_idle(k: str = "k") -> str:
        return " && ".join(f"({k} == {j} || (i_st[{j}] != {in_flight} && !i_gap[{j}]))" for j in range(1, NI + 1))

    def claim_part(cev_name: str, binding: Mapping[str, str], where: str) -> tuple[list[str], list[str], list[str]]:
        """(conditions, effects, checks) of claim event cev_name (and its approval coupling)."""
        cev = claim_t.events[cev_name]
        conds = [any_of("c_st", cev.sources)]
        for g in cev.guards:
            if g != drop_guard:
                conds.append(claim_guard_expr(g, f"{where}: claim event {cev_name!r}", binding))
        effs = ["t_cfrom = c_st; t_clease = c_lease; t_ctok = c_tok;"]
        effs += claim_effects(cev.effects, f"claim event {cev_name!r}", binding)
        effs.append(f"c_st = {cev.target};")
        for aev_name in cev.couples.values():
            aev = approval_t.events[aev_name]
            conds.append(f"ap != 0 && {any_of('a_st[ap]', aev.sources)}")
            for g in aev.guards:
                if g != drop_guard:
                    conds.append(claim_guard_expr(g, f"approval event {aev_name!r}", binding))
            effs += claim_effects(aev.effects, f"approval event {aev_name!r}", binding)
            effs.append(f"a_st[ap] = {aev.target};")
        checks = []
        if "take_claim" in cev.effects:
            others = " && ".join(f"(w == {v} || g_ctok[{v}] == 0 || g_ctok[{v}] != t_ctok)" for v in range(W))
            checks.append(f"assert(!P15_one_live_claim_lease || t_clease != LIVE || ({others}));")
        if cev.target == c_free and set(cev.sources) & set(c_began):
            checks.append(
                f"assert(!P11_sending_claim_freed_only_when_settled || !{any_of('t_cfrom', c_began)} "
                f"|| {any_of('i_st[k]', settled)} || {binding['human']});"
            )
        return conds, effs, checks

    inlines: list[str] = []
    by_actor: dict[str, list[str]] = {}

    # ---- intent events, each with the claim move it couples (table.toml `couples`)
    for ev in t.events.values():
        if ev.creates:
            continue
        if ev.actor not in CLAIMS_ACTOR_ARGS:
            raise GenerationError(f"event {ev.name!r}: actor {ev.actor!r} has no process in the claims configuration")
        human_actor = t.actors[ev.actor].human
        base = dict(CLAIMS_ACTOR_ARGS[ev.actor])
        binding = Binding(
            ev.actor, f"event {ev.name!r}", {**common, **base, "human": base["human"] if human_actor else "0"}
        )
        iconds = [any_of("i_st[k]", ev.sources)]
        for g in ev.guards:
            if g != drop_guard:
                iconds.append("(" + CLAIMS_INTENT_GUARDS[g].format_map(binding) + ")")
        ieffs = ["t_from = i_st[k];"]
        for eff in ev.effects:
            ieffs.append(f"/* effect {eff} */ {CLAIMS_INTENT_EFFECTS[eff]};")
        ieffs.append(f"i_st[k] = {ev.target};")
        cev_name = ev.couples.get("claim")
        enter_flight = ev.target == in_flight and any(s != in_flight for s in ev.sources)
        pre = ""
        if cev_name is None:
            cond = " &&\n       ".join(iconds)
            body = ieffs
        else:
            cconds, ceffs, cchecks = claim_part(cev_name, binding, f"event {ev.name!r}")
            cc = " && ".join(cconds)
            if "claim" in ev.couples_required:
                cond = " &&\n       ".join([*iconds, cc])
                pre = "ap = c_apv;"
                body = [*ieffs, *ceffs, *cchecks]
            else:
                applies = f"(c_key == k && {any_of('c_st', claim_t.events[cev_name].sources)})"
                pre = "ap = c_apv;"
                cond = " &&\n       ".join([*iconds, f"(!{applies} || ({cc}))"])
                body = [
                    f"if :: {applies} -> t_app = 1 :: else -> t_app = 0 fi;",
                    *ieffs,
                    "if",
                    ":: t_app ->",
                    *["   " + x for x in [*ceffs, *cchecks]],
                    ":: else -> skip",
                    "fi;",
                ]
        if enter_flight:
            body.append(
                f"assert(!P10_one_dispatch_per_target || (c_st == {c_dispatching} && c_key == k && "
                f"c_ep == {binding['cl_ep']} && c_tok == {binding['cl_tok']} && t_clease == LIVE && {others_idle()}));"
            )
            body.append(
                "assert(!P12_dispatch_under_its_approval || (ap != 0 && a_named[ap] && a_key[ap] == k && "
                "a_dig[ap] == i_dig[k] && a_dl[ap] == LIVE && !a_used[ap]));"
            )
            body.append("assert(!P13_version_race_loser_sends_nothing || (ap != 0 && !(g_vers & (1 << a_ver[ap]))));")
            body.append("if :: ap != 0 -> a_used[ap] = 1; g_vers = g_vers | (1 << a_ver[ap]) :: else -> skip fi;")
        body.append(p16)
        if ev.actor == "worker":
            if "open_attempt" in ev.effects:
                body.append("my_gen = i_tok[k];")
            if enter_flight:
                body.append("authed = 1; i_gap[k] = 1;")
            if "close_attempt" in ev.effects:
                body.append("cworker_reset();")
        who = {"worker": "worker %d", "operator": "operator (named=%d)"}.get(ev.actor, ev.actor)
        arg = {"worker": ", w", "operator": ", op_named"}.get(ev.actor, "")
        body.append(f'printf("MSC: {who}: {ev.name} intent %d (%e -> {ev.target}) claim %e\\n"{arg}, k, t_from, c_st);')
        body.append("t_from = 0; t_cfrom = 0; t_clease = 0; t_ctok = 0; t_app = 0; ok = 1")
        header = (
            f"/* {ev.name} ({ev.actor}): {', '.join(ev.sources)} -> {ev.target}; intent guards: {', '.join(ev.guards) or '-'}\n"
            f"   couples: {dict(ev.couples) or '-'}{' (required)' if ev.couples_required else ''} */"
        )
        inlines.append(
            f"{header}\ninline ci_{ev.name}() {{\n  d_step {{\n    {pre}\n    if\n    :: {cond} ->\n"
            + block("\n".join(body), 7)
            + "\n    :: else -> ok = 0\n    fi;\n    ap = 0\n  }\n}"
        )
        by_actor.setdefault(ev.actor, []).append(ev.name)

    # ---- claim events not coupled to an intent event: called by a worker on its own
    standalone_claim = [e for e in claim_t.events.values() if e.name not in claim_events_coupled]
    for cev in standalone_claim:
        if cev.actor != "worker":
            raise GenerationError(f"claim event {cev.name!r} is neither coupled nor a worker's: not modelled")
        base = dict(CLAIMS_ACTOR_ARGS["worker"])
        binding = Binding("worker", f"claim event {cev.name!r}", {**common, **base})
        cconds, ceffs, cchecks = claim_part(cev.name, binding, "standalone")
        body = [*ceffs, *cchecks, p16]
        if "take_claim" in cev.effects:
            body.append("cl_ep = c_ep; cl_tok = c_tok; g_ctok[w] = c_tok;")
        if "drop_claim" in cev.effects:
            body.append("cl_ep = 0; cl_tok = 0; g_ctok[w] = 0;")
        body.append(
            f'printf("MSC: worker %d: claim {cev.name} for intent %d approval %d (%e -> {cev.target}) epoch %d\\n", w, k, ap, t_cfrom, c_ep);'
        )
        body.append("t_cfrom = 0; t_clease = 0; t_ctok = 0; ok = 1")
        inlines.append(
            f"/* claim {cev.name} (worker): {', '.join(cev.sources)} -> {cev.target}; guards: {', '.join(cev.guards)} */\n"
            f"inline cc_{cev.name}() {{\n  d_step {{\n    if\n    :: {' &&'.join(cconds)} ->\n"
            + block("\n".join(body), 7)
            + "\n    :: else -> ok = 0\n    fi\n  }\n}"
        )

    # ---- approval events not coupled: the creating one (approver), expiry (sweeper), withdrawal (operator)
    approval_standalone: dict[str, list[str]] = {}
    for aev in approval_t.events.values():
        if aev.name in approval_events_coupled:
            continue
        if aev.actor not in CLAIMS_ACTOR_ARGS:
            raise GenerationError(f"approval event {aev.name!r}: actor {aev.actor!r} not modelled")
        human_actor = approval_t.actors[aev.actor].human
        base = dict(CLAIMS_ACTOR_ARGS[aev.actor])
        binding = Binding(
            aev.actor,
            f"approval event {aev.name!r}",
            {**common, **base, "human": base["human"] if human_actor else "0"},
        )
        conds = ["na < NA"] if aev.creates else [f"ap != 0 && {any_of('a_st[ap]', aev.sources)}"]
        for g in aev.guards:
            if g != drop_guard:
                conds.append(claim_guard_expr(g, f"approval event {aev.name!r}", binding))
        body = ["t_afrom = " + ("0" if aev.creates else "a_st[ap]") + ";"]
        body += claim_effects(aev.effects, f"approval event {aev.name!r}", binding)
        body.append(f"a_st[ap] = {aev.target};")
        if not aev.creates and a_live in aev.sources and aev.target != a_live:
            body.append(
                f"assert(!P14_approvals_end_truthfully || t_afrom != {a_live} || a_dl[ap] == EXPIRED || {binding['human']});"
            )
        body.append(
            f'printf("MSC: {aev.actor}: {aev.name} approval %d (intent %d, version %d)\\n", ap, a_key[ap], a_ver[ap]);'
        )
        body.append("t_afrom = 0; ok = 1")
        inlines.append(
            f"/* approval {aev.name} ({aev.actor}): {', '.join(aev.sources) or '(creates)'} -> {aev.target}; guards: {', '.join(aev.guards) or '-'} */\n"
            f"inline ca_{aev.name}() {{\n  d_step {{\n    if\n    :: {' && '.join(conds)} ->\n"
            + block("\n".join(body), 7)
            + "\n    :: else -> ok = 0\n    fi\n  }\n}"
        )
        approval_standalone.setdefault(aev.actor, []).append(aev.name)

    pick_k = "if " + " ".join(f":: k = {j}" for j in range(1, NI + 1)) + " fi"
    pick_ap = "if " + " ".join(f":: na >= {a} -> ap = {a}" for a in range(1, NA + 1)) + " fi"

    def intent_alts(actor: str, evidence, pick: bool = True) -> list[str]:
        p0, p1 = (f"{pick_k}; ", " k = 0;") if pick else ("", "")
        return [f":: atomic {{ {evidence(n)} -> {p0}ci_{n}();{p1} ok = 0 }}" for n in by_actor.get(actor, [])]

    def worker_evidence(n: str) -> str:
        ev = t.events[n]
        evid = evidence(t, ev, dict(extra_evidence or {}))
        if any("lease_tok" in placeholders(CLAIMS_INTENT_GUARDS[g]) for g in ev.guards):
            evid = f"my_gen != 0 && {evid}"
        if "open_attempt" in ev.effects:
            evid = f"tok_seq < NT && {evid}"
        return f"wk != 0 && {evid} && k == wk"

    worker_alts = intent_alts("worker", worker_evidence, pick=False)
    for cev in standalone_claim:
        if "take_claim" in cev.effects:
            # for any intent, not only the one it works on: it may then present that claim lease for
            # its own intent (as a confused or stale dispatcher would)
            worker_alts.append(
                f":: atomic {{ wk != 0 && na > 0 && ctok_seq < NC && k == wk -> {pick_k}; {pick_ap}; cc_{cev.name}(); "
                "ap = 0; k = wk; ok = 0 }"
            )
        else:
            worker_alts.append(f":: atomic {{ cl_tok != 0 && k == wk -> cc_{cev.name}(); ok = 0 }}")
    sweeper_alts = intent_alts("sweeper", lambda n: "true")
    sweeper_alts += [
        f":: atomic {{ na > 0 -> {pick_ap}; ca_{n}(); ap = 0; ok = 0 }}" for n in approval_standalone.get("sweeper", [])
    ]
    reconciler_alts = intent_alts("reconciler", lambda n: "true")
    operator_alts = []
    for n in by_actor.get("operator", []):
        evid = evidence(t, t.events[n], {**CLAIMS_EVIDENCE, **(extra_evidence or {})})
        cond = "moves < CLAIMS_OPERATOR_MOVES" + ("" if evid == "true" else f" && {evid}")
        for named in (1, 0):
            operator_alts.append(
                f":: atomic {{ {cond} -> {pick_k}; op_named = {named}; ci_{n}(); if :: ok -> moves++ :: else -> skip fi; "
                "op_named = 0; k = 0; ok = 0 }"
            )
    for n in approval_standalone.get("operator", []):
        for named in (1, 0):
            operator_alts.append(
                f":: atomic {{ moves < CLAIMS_OPERATOR_MOVES && na > 0 -> {pick_ap}; op_named = {named}; ca_{n}(); "
                "if :: ok -> moves++ :: else -> skip fi; op_named = 0; ap = 0; ok = 0 }"
            )
    approver_alts = []
    for n in approval_standalone.get("approver", []):
        for named in (1, 0):
            # approval a is for intent ((a - 1) % NI) + 1: a worker may still present it for the other intent
            approver_alts.append(
                f":: atomic {{ na < NA -> k = (na % NI) + 1; op_named = {named}; ca_{n}(); op_named = 0; k = 0; ok = 0 }}"
            )
    nl = "\n"
    approval_clock = "\n".join(
        f'  :: d_step {{ a_dl[{a}] == LIVE -> a_dl[{a}] = EXPIRED; printf("MSC: clock: approval {a}\'s deadline passes\\n") }}'
        for a in range(1, NA + 1)
    )
    edit = " ".join(
        f':: i_st[{j}] == {t.initial} && i_dig[{j}] == 1 -> i_dig[{j}] = 2; printf("MSC: editor: the draft of intent {j} changes\\n")'
        for j in range(1, NI + 1)
    )
    ablation_txt = f"\n * ABLATION: guard `{drop_guard}` removed." if drop_guard else ""
    return render(
        "claims",
        ablation_note=ablation_txt,
        intents=NI,
        claim_states=", ".join(claim_t.states),
        approvals=NA,
        approval_states=", ".join(approval_t.states),
        workers=W,
        property_doc=property_doc(CLAIM_PROPERTIES),
        property_switches=property_switches(CLAIM_PROPERTIES, first=len(INTENT_PROPERTIES) + 1),
        attempts=CLAIMS_ATTEMPTS,
        claim_takes=CLAIMS_TAKES,
        states=", ".join(t.states),
        events=(nl + nl).join(inlines),
        pick_k=pick_k,
        worker_alts=block(nl.join(worker_alts), 2),
        in_flight=in_flight,
        claim_dispatching=c_dispatching,
        others_idle=others_idle(),
        sweeper_alts=block(nl.join(sweeper_alts), 2),
        reconciler_alts=block(nl.join(reconciler_alts), 2),
        operator_alts=block(nl.join(operator_alts), 2),
        approver_alts=block(nl.join(approver_alts), 2),
        edits=edit,
        approval_clock=approval_clock,
        init_intents="; ".join(f"i_st[{j}] = {t.initial}; i_dig[{j}] = 1" for j in range(1, NI + 1)),
        claim_initial=claim_t.initial,
        run_workers="; ".join(f"run cworker({v})" for v in range(W)),
    )
