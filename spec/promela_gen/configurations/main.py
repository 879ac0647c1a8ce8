"""Configuration `main`: one intent, its workers, sweeper, reconciler, operator, clock, transport, platform.

The model proper, checked with no cpp flags (``spec/modelcheck.py`` ``CONFIGURATIONS``). Its fixed
environment is ``templates/main.pml``; what is generated into it from ``spec/table.toml``: the
states, one ``inline ev_<event>()`` per table row (source states, the conjunction of the guards'
translations from ``guards.py``, the effects' row updates from :data:`EFFECTS`, the target), and
each actor's alternatives (which event it may call with the evidence it holds). The text and
restore configurations are this model with a process more (``text.py``, ``restore.py``), switched
on by cpp; the claims configuration is another model in the same file (``claims.py``).

Added here, by name (a name without an entry is a :class:`GenerationError`):

* :data:`EFFECTS`: each catalogued effect's row update, plus ghost bookkeeping;
* :data:`OUTCOME_EVIDENCE` / :data:`ACTION_EVIDENCE`: what a caller must have observed before the
  call (callers are honest about evidence but arbitrary in order, timing and staleness);
* :data:`OUTCOME_CHECKS`: property checks attached to the outcome an event records;
* :data:`ACTOR_ARGS`: what each actor presents to the store (lease, plan, identity, ...);
* :data:`INTENT_PROPERTIES`: P1 to P9, assertions named after them (``spin -DCHECK=n`` keeps Pn).
"""

from __future__ import annotations

import dataclasses
import textwrap
from collections.abc import Mapping
from types import MappingProxyType

from atmostonce.table import Event, Table

from ..base import (
    DEFAULT_BOUNDS,
    Binding,
    Bounds,
    GenerationError,
    any_of,
    block,
    placeholders,
    property_switches,
    render,
)
from ..guards import guard_expr

__all__ = [
    "ACTION_EVIDENCE",
    "ACTOR_ARGS",
    "BROKEN_EVIDENCE",
    "EFFECTS",
    "FLAGS",
    "INTENT_PROPERTIES",
    "NAME",
    "OUTCOME_CHECKS",
    "OUTCOME_EVIDENCE",
    "ROW",
    "broken_retry_on_unknown",
    "evidence",
    "generate_intent",
    "validate",
]

NAME = "main"
# two workers, sweeper, reconciler, operator (2 moves), clock, transport, platform
FLAGS: tuple[str, ...] = ()

# --------------------------------------------------------------------------------------- properties
INTENT_PROPERTIES: Mapping[str, str] = MappingProxyType(
    {
        "P1_at_most_one_effect": (
            "The platform holds at most one effect for the delivery key. Every request that lands "
            "is counted. A send that was definitively not sent, or that a fenced lookup proved "
            "absent, never lands, so the retry after it needs no excuse: the count shows it. The "
            "only excuse is an identified operator's deliberate decision to send again (the moves "
            "that grant an attempt: resolve_not_sent, resend): requests made before it are on the "
            "operator, and the count restarts. Nothing else excuses a second effect."
        ),
        "P2_send_needs_current_authorization": (
            "A worker puts bytes on the wire only while the intent is in the in-flight state "
            "under that worker's own open attempt (the newest attempt ever issued) with a live "
            "lease, and only under an authorizing write that was made while its lease was live "
            "and while nothing that write re-checks at the last moment was off: the bytes are "
            "the approved ones (request digest), no kill switch is engaged, and the credential, "
            "the platform contract and the source version are current."
        ),
        "P3_unknown_never_resent_by_machine": (
            "Once the intent has been in an unknown-outcome state, no machine move brings it back "
            "to the initial or in-flight state unless a fenced lookup of the current platform key "
            "(resend epoch and fence epoch) has found nothing since (the proof of absence of docs/design.md), or an identified "
            "operator moved it since."
        ),
        "P4_terminal_left_only_by_operator": (
            "No move out of a terminal state (published, parked) is made by a machine actor, or by "
            "an operator call that does not name a person."
        ),
        "P5_stale_generation_never_writes": (
            "Every write made on behalf of an attempt or a maintenance plan (a call presenting a "
            "lease or a plan) carries the intent's current generation."
        ),
        "P6_one_live_lease": (
            "At most one in-flight attempt per intent: when a worker takes or extends a lease, no "
            "other worker still holds a live one. A lease ends when its holder closes it, when the "
            "store clock passes its deadline, or when an identified operator revokes it; a machine "
            "closing somebody else's live lease does not end it for the holder."
        ),
        "P7_budgets": (
            "The budgets are the budgets: attempts begun never exceed the cap (the initial cap plus "
            "one per operator grant), the machine parks for exhaustion only once the cap is spent, "
            "and inconclusive lookups never exceed the reconcile cap (the initial cap plus what each "
            "declared restore granted)."
        ),
        "P8_records_tell_the_truth": (
            "A machine move into the `done` terminal state names (remote id) an object the "
            "platform really holds for the current resend epoch; a machine move into the retryable "
            "state happens only when no request of the current epoch has landed or can still land "
            "(the retryable state means 'definitively not sent')."
        ),
        "P9_duplicate_text_excluded": (
            "Within one duplicate-text window, the platform never holds effects of two intents of "
            "the account with the same normalized text (this intent and another one that runs the "
            "same protocol), unless an identified operator decided to send again."
        ),
    }
)


# ------------------------------------------------------------------------------ translations
# Effects: the row update, then ghost bookkeeping. {caller}: the calling worker's index (NOBODY
# for other actors); {human}: 1 for an identified operator.
EFFECTS: Mapping[str, str] = MappingProxyType(
    {
        "create": """
            state = {initial}; attempt_count = 0; max_attempts = MAX_ATTEMPTS; att_open = 0;
            gen = 0; row_tok = 0; row_rep = 0; lease = NONE; rid = 0; rc = 0; max_rc = MAX_RECONCILES;
            epoch = 0; fepoch = 0; g_cap = MAX_ATTEMPTS; g_rc_cap = MAX_RECONCILES""",
        "open_attempt": """
            attempt_count++; gen_seq++; gen = gen_seq; tok_seq++; row_tok = tok_seq; row_rep = repoch;
            att_open = 1; lease = LIVE; rid = 0;
            g_begins++;
            assert(!P7_budgets || g_begins <= g_cap);
            {p6_check};
            holder = {caller}; wl[{caller}] = 1""",
        "extend_lease": """
            lease = LIVE;
            {p6_check};
            wl[{caller}] = 1""",
        # descriptor drift is covered by the reconciler's free choice to park (lookup.* outcomes)
        "write_descriptor": "skip",
        "set_remote_id": "rid = {rid}",
        "close_attempt": """
            if
            :: att_open && (holder == {caller} || {human}) -> wl[holder] = 0
            :: else -> skip
            fi;
            att_open = 0; lease = NONE""",
        "claim_text_slot": "txt_ours = 1",
        # the rate window's counter: windows and their lengths are not modelled, the worker's `pol`
        # choice says whether the window is full at the instant of the write (rate_limit_clear)
        "take_rate_slot": "skip",
        "release_text_slot": "txt_ours = 0",
        "fence_restore": """
            if
            :: att_open && (holder == {caller} || {human}) -> wl[holder] = 0
            :: else -> skip
            fi;
            att_open = 0; lease = NONE; restore_unfenced = 0""",
        "count_reconcile": "rc++",
        "bump_resend_epoch": "epoch++; rid = 0",
        # the fenced lookup tombstoned the key of (epoch, fepoch): the retry goes out under the next one
        "bump_fence_epoch": "fepoch++",
        "grant_attempt": """
            if
            :: max_attempts < attempt_count + 1 -> max_attempts = attempt_count + 1
            :: else -> skip
            fi;
            if
            :: {human} && g_cap < g_begins + 1 -> g_cap = g_begins + 1
            :: else -> skip
            fi""",
        "grant_reconcile": """
            if
            :: max_rc < rc + 1 -> g_rc_cap = g_rc_cap + rc + 1 - max_rc; max_rc = rc + 1
            :: else -> skip
            fi""",
    }
)

# What a caller must have observed before recording an outcome (its local knowledge). Outcomes
# that record no move (no event) need no entry.
OUTCOME_EVIDENCE: Mapping[str, str] = MappingProxyType(
    {
        "send.success": "out == SEND_OK",
        "send.not_sent": "out == SEND_NOT_SENT",
        "send.unknown": "out == SEND_UNKNOWN",
        # a landed object read back may match, lag (not found) or differ: all honest after success
        "read_back.match": "out == SEND_OK",
        "read_back.not_found": "out == SEND_OK",
        "read_back.differs": "out == SEND_OK",
        # a transport without read-back records the success as unknown
        "read_back.unavailable": "out == SEND_OK",
        # the sweeper believes the lease expired (its listing may be stale: the store's clock decides)
        "crash.before_authorize": "sw_have",
        "crash.after_authorize": "sw_have",
        "lookup.found": "r_ev == FOUND",
        "lookup.not_found": "r_ev == NOT_FOUND",
        # an object found that does not hold what was approved: recorded like a lookup that found nothing
        "lookup.differs": "r_ev == FOUND",
        "lookup.not_found_before_restore": "r_ev == NOT_FOUND",
        "lookup.not_found_fenced": "r_ev == NOT_FOUND",
        # any lookup may be unavailable, the budget may be spent, the descriptor may have drifted
        "lookup.unsupported": "pl_have",
        "reconcile.budget_spent": "pl_have",
        "reconcile.descriptor_drift": "pl_have",
        # a policy guard refused, or an operator gate said no
        "gate.blocked": "true",
        "retry.allowed": "true",
        "retry.exhausted": "true",
        "operator.park": "true",
        "operator.resolve_published": "true",
        "operator.resolve_not_sent": "true",
        "operator.resend": "true",
        # the restore procedure: the fence is declared once, after a restore, for an intent it left open
        "operator.restore_fence": "restore_unfenced",
    }
)

# Events that record no outcome are actions; their callers' preconditions. A worker starts no new
# attempt after a restore until the operator has declared the restore fence (the restore procedure).
ACTION_EVIDENCE: Mapping[str, str] = MappingProxyType(
    {
        "begin": "my_gen == 0 && out == SEND_NONE && !restore_unfenced",
        "authorize_dispatch": "!authed && out == SEND_NONE",
    }
)

# Checks attached to the outcome an event records ('' for none beyond the generic checks).
OUTCOME_CHECKS: Mapping[str, str] = MappingProxyType(
    {
        "lookup.not_found": "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= g_rc_cap)",
        "lookup.not_found_before_restore": ("g_inconclusive++; assert(!P7_budgets || g_inconclusive <= g_rc_cap)"),
        "lookup.differs": "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= g_rc_cap)",
        "retry.exhausted": "assert(!P7_budgets || g_begins >= g_cap)",
        **{
            o: ""
            for o in (
                "send.success",
                "send.not_sent",
                "send.unknown",
                "read_back.match",
                "read_back.not_found",
                "read_back.differs",
                "read_back.unavailable",
                "crash.before_authorize",
                "crash.after_authorize",
                "lookup.found",
                "lookup.not_found_fenced",
                "lookup.unsupported",
                "reconcile.budget_spent",
                "reconcile.descriptor_drift",
                "gate.blocked",
                "retry.allowed",
                "operator.park",
                "operator.resolve_published",
                "operator.resolve_not_sent",
                "operator.resend",
                "operator.restore_fence",
            )
        },
    }
)

# What each actor presents to the store; an event whose guards need an argument its actor does not
# present is a generation error.
# What the authorizing write re-checks at the last moment, besides the lease: the worker's choice
# `pol` says which one (if any) is off at that instant. placeholder -> (constant, what is off)
POLICY = {
    "digest_ok": ("POL_BYTES", "the bytes differ from the approved request digest"),
    "kill_off": ("POL_KILL", "a kill switch is engaged"),
    "credential_ok": ("POL_CREDENTIAL", "the credential was rotated or revoked"),
    "contract_ok": ("POL_CONTRACT", "the platform contract changed"),
    "source_ok": ("POL_SOURCE", "the source version is no longer the head"),
    "rate_ok": ("POL_RATE", "the account's rate window is full"),
}
ACTOR_ARGS: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {
        "client": MappingProxyType({"caller": "NOBODY", "human": "0"}),
        "worker": MappingProxyType(
            {
                "caller": "w",
                "human": "0",
                "lease_gen": "my_gen",
                "lease_tok": "my_tok",
                "lease_rep": "my_rep",
                "rid": "my_rid",
                **{k: f"(pol != {v})" for k, (v, _) in POLICY.items()},
            }
        ),
        "sweeper": MappingProxyType(
            {"caller": "NOBODY", "human": "0", "lease_gen": "sw_gen", "lease_tok": "sw_tok", "lease_rep": "sw_rep"}
        ),
        "reconciler": MappingProxyType(
            {
                "caller": "NOBODY",
                "human": "0",
                "plan_gen": "pl_gen",
                "plan_rc": "pl_rc",
                "plan_rep": "pl_rep",
                "fenced": "FENCED",
                "rid": "r_rid",
            }
        ),
        # a person's resend and resolve_not_sent present the plan of the read they decided on; in the model
        # the person reads and moves in one step, so it is the row as it is (the window between a person's look
        # and their move is tested against the stores: tests/test_person_plan.py)
        "operator": MappingProxyType(
            {
                "caller": "NOBODY",
                "human": "op_named",
                "operator": "op_named",
                "rid": "0",
                "plan_gen": "gen",
                "plan_rc": "rc",
                "plan_rep": "repoch",
            }
        ),
    }
)

# Arguments that carry a generation (P5): a lease or a plan.
GENERATION_ARGS = ("lease_gen", "plan_gen")

# the intent row (the columns reference/atmostonce/guards.py reads), saved by a backup under -DRESTORES
ROW = (
    ("state", "mtype:state", "the intent's state"),
    ("att_open", "bit", "attempt_token is not None"),
    ("row_tok", "byte", "attempt_token (a fresh token per attempt)"),
    ("gen", "byte", "generation of the current or last attempt"),
    ("gen_seq", "byte", "the generation sequence (a restore rewinds it)"),
    ("row_rep", "byte", "the restore epoch the attempt was opened under (column `epoch`)"),
    ("lease", "byte", "lease_expires_at: NONE / LIVE (ahead of the store clock) / EXPIRED"),
    ("attempt_count", "byte", ""),
    ("max_attempts", "byte", ""),
    ("rc", "byte", "reconcile_count"),
    ("max_rc", "byte", "max_reconciles"),
    ("epoch", "byte", "resend_epoch"),
    ("fepoch", "byte", "fence_epoch: with the resend epoch, the platform idempotency key"),
    ("rid", "byte", "remote_id: 0 = none, else the request slot that created the object"),
    ("txt_ours", "bit", "this intent holds the account's text slot"),
    ("holder", "byte", "ghost: the worker that opened the current attempt"),
    ("g_begins", "byte", "ghost (P7): attempts begun"),
    ("g_cap", "byte", "ghost (P7): the attempt cap granted"),
    ("g_inconclusive", "byte", "ghost (P7): inconclusive lookups"),
    ("g_rc_cap", "byte", "ghost (P7): the reconcile cap, raised by as much as a restore's grant raised the budget"),
)


# ------------------------------------------------------------------------------------ helpers
def outcomes_of(t: Table, ev: Event) -> list[str]:
    return [o.name for o in t.outcomes.values() if getattr(o, "event", None) == ev.name]


def evidence(t: Table, ev: Event, extra: Mapping[str, str]) -> str:
    if ev.name in extra:
        return extra[ev.name]
    outs = outcomes_of(t, ev)
    if not outs:
        if ev.name not in ACTION_EVIDENCE:
            raise GenerationError(
                f"event {ev.name!r} records no outcome and has no caller precondition (add it to ACTION_EVIDENCE)"
            )
        return ACTION_EVIDENCE[ev.name]
    parts = []
    for o in outs:
        if o not in OUTCOME_EVIDENCE:
            raise GenerationError(f"outcome {o!r} has no evidence translation (add it to OUTCOME_EVIDENCE)")
        parts.append(OUTCOME_EVIDENCE[o])
    uniq = list(dict.fromkeys(parts))
    return uniq[0] if len(uniq) == 1 else "(" + " || ".join(f"({p})" for p in uniq) + ")"


def outcome_checks(t: Table, ev: Event) -> list[str]:
    out = []
    for o in outcomes_of(t, ev):
        if o not in OUTCOME_CHECKS:
            raise GenerationError(f"outcome {o!r} has no entry in OUTCOME_CHECKS (use '' for none)")
        if OUTCOME_CHECKS[o] and OUTCOME_CHECKS[o] not in out:
            out.append(OUTCOME_CHECKS[o])
    return out


def uses(ev: Event, placeholder: str) -> bool:
    return any(placeholder in placeholders(guard_expr(g, f"event {ev.name!r}")) for g in ev.guards)


def validate(t: Table) -> None:
    for g in t.guards:
        guard_expr(g, "guard catalogue")
    for eff in t.effects:
        if eff not in EFFECTS:
            raise GenerationError(f"effect {eff!r} has no Promela translation (add it to EFFECTS)")
    for o in t.outcomes.values():
        if getattr(o, "event", None) is None:
            continue
        if o.name not in OUTCOME_EVIDENCE:
            raise GenerationError(f"outcome {o.name!r} has no evidence translation (add it to OUTCOME_EVIDENCE)")
        if o.name not in OUTCOME_CHECKS:
            raise GenerationError(f"outcome {o.name!r} has no entry in OUTCOME_CHECKS (use '' for none)")
    for a in t.actors:
        if a not in ACTOR_ARGS:
            raise GenerationError(f"actor {a!r} has no process in the model (add it to ACTOR_ARGS and the template)")


# ------------------------------------------------------------------------------------ broken config
def broken_retry_on_unknown(t: Table) -> Table:
    """The deliberately broken configuration: a worker moves an unknown outcome back to the queue."""
    unknown = t.names.state.indeterminate
    ev = Event(
        name="retry_unknown",
        actor="worker",
        sources=(unknown,),
        target=t.initial,
        guards=("attempts_remaining",),
        effects=(),
        seed="BROKEN ON PURPOSE (docs/formal.md): retry on unknown",
    )
    return dataclasses.replace(t, events=MappingProxyType({**t.events, ev.name: ev}))


BROKEN_EVIDENCE: Mapping[str, str] = MappingProxyType({"retry_unknown": "true"})


# ------------------------------------------------------------------------------------ generate
def event_inline(t: Table, ev: Event, drop_guard: str | None, W: int, slots: int, seq: str = "d_step") -> str:
    human_actor = t.actors[ev.actor].human
    what = f"event {ev.name!r}"
    base = dict(ACTOR_ARGS[ev.actor])
    human = base["human"] if human_actor else "0"
    binding = Binding(ev.actor, what, {**base, "human": human})
    in_flight = t.names.state.authorized
    done = t.names.state.published
    retryable = t.names.state.failed
    back_to_queue = [t.initial, t.names.state.authorized]

    conds = [any_of("state", ev.sources)]
    presented: list[str] = []
    for g in ev.guards:
        expr = guard_expr(g, what)
        presented += [binding[p] for p in sorted(placeholders(expr)) if p in GENERATION_ARGS]
        if g == drop_guard:
            continue
        conds.append("(" + expr.format_map(binding) + ")")

    p6 = "; ".join(f"assert(!P6_one_live_lease || {binding['caller']} == {v} || !wl[{v}])" for v in range(W))
    eff_binding = Binding(ev.actor, what, {**binding, "p6_check": p6, "initial": t.initial})
    body: list[str] = ["t_from = state; t_lease = lease;"]
    for p in dict.fromkeys(presented):
        body.append(f"assert(!P5_stale_generation_never_writes || {p} == gen);")
    for eff in ev.effects:
        if eff not in EFFECTS:
            raise GenerationError(f"{what}: effect {eff!r} has no Promela translation (add it to EFFECTS)")
        body.append(f"/* effect {eff} */")
        body.append(textwrap.dedent(EFFECTS[eff].format_map(eff_binding)).strip() + ";")
    body.append(f"state = {ev.target};")
    terminal = list(t.terminal_states)
    if set(ev.sources) & set(terminal):
        body.append(f"assert(!P4_terminal_left_only_by_operator || !{any_of('t_from', terminal)} || {human});")
    if human_actor and "grant_attempt" in ev.effects:
        # a person's deliberate decision to send again: what was sent before is on them
        body.append(f"if :: {human} -> excuse_all() :: else -> skip fi;")
    elif human_actor:
        body.append(f"if :: {human} -> tainted = 0; proof = 0 :: else -> skip fi;")
    if ev.target == t.names.state.indeterminate:
        body.append("tainted = 1; proof = 0;")
    if ev.target in back_to_queue and any(s != ev.target for s in ev.sources):
        body.append(
            "if :: t_from != state -> "
            "assert(!P3_unknown_never_resent_by_machine || !tainted || proof); tainted = 0; proof = 0 "
            ":: else -> skip fi;"
        )
    if not human_actor and ev.target == done:
        body.append(
            "assert(!P8_records_tell_the_truth || (rid != 0 && req_st[rid] == LANDED && req_ep[rid] == epoch));"
        )
    if not human_actor and ev.target == retryable:
        live = " || ".join(
            f"(req_ep[{i}] == epoch && !req_ex[{i}] && (req_st[{i}] == LANDED || (req_st[{i}] == TRANSIT && !TOMBED({i}))))"
            for i in range(1, slots + 1)
        )
        body.append(f"assert(!P8_records_tell_the_truth || !({live}));")
    for chk in outcome_checks(t, ev):
        body.append(chk + ";")
    if ev.actor == "worker":
        if "open_attempt" in ev.effects:
            body.append("my_gen = gen; my_tok = row_tok; my_rep = row_rep; my_ep = epoch; my_fe = fepoch;")
        if ev.target == in_flight and any(s != in_flight for s in ev.sources):
            body.append("authed = 1; ingap[w] = 1; grant_live[w] = (t_lease == LIVE);")
        if "close_attempt" in ev.effects or "fence_restore" in ev.effects:
            body.append("worker_reset();")
    who = {"worker": "worker %d", "operator": "operator (named=%d)"}.get(ev.actor, ev.actor)
    arg = {"worker": ", w", "operator": f", {binding['operator']}" if "operator" in base else ""}.get(ev.actor, "")
    body.append(f'printf("MSC: {who}: {ev.name} (%e -> {ev.target})\\n"{arg}, t_from);')
    body.append("t_from = 0; t_lease = 0; ok = 1")
    ablated = f"   [ABLATED: {drop_guard} removed]" if drop_guard in ev.guards else ""
    header = (
        f"/* {ev.name} ({ev.actor}{', human' if human_actor else ''}): {', '.join(ev.sources)} -> {ev.target}\n"
        f"   guards: {', '.join(ev.guards) or '-'}{ablated}\n"
        f"   effects: {', '.join(ev.effects) or '-'}\n"
        f"   source: {ev.seed} */"
    )
    cond = " &&\n       ".join(conds)
    return (
        f"{header}\ninline ev_{ev.name}() {{\n  {seq} {{\n    if\n    :: {cond} ->\n"
        + block("\n".join(body), 7)
        + "\n    :: else -> ok = 0\n    fi\n  }\n}"
    )


def generate_intent(
    t: Table,
    *,
    bounds: Bounds = DEFAULT_BOUNDS,
    drop_guard: str | None = None,
    extra_evidence: Mapping[str, str] | None = None,
    coverage: bool = False,
    other_intent: str,
    restore: str,
) -> str:
    """The intent configurations (the text between ``#else /* not CLAIMS`` and the final ``#endif``).

    ``other_intent`` and ``restore``: the processes the text and restore configurations add (each
    inside its ``#ifdef``). Arguments as :func:`promela_gen.model.generate`; ``drop_guard`` is one of
    the intent table's guards or None.
    """
    extra = dict(extra_evidence or {})
    unknown = t.names.state.indeterminate
    in_flight = t.names.state.authorized
    creators = [e for e in t.events.values() if e.creates]
    if len(creators) != 1:
        raise GenerationError(f"expected exactly one creating event, found {[e.name for e in creators]}")
    creator = creators[0]
    b = bounds
    W = b.workers
    slots = b.request_slots

    inlines: list[str] = []
    by_actor: dict[str, list[Event]] = {a: [] for a in t.actors}
    for ev in t.events.values():
        if ev.creates:
            continue
        if ev.actor not in ACTOR_ARGS:
            raise GenerationError(f"event {ev.name!r}: actor {ev.actor!r} has no process in the model")
        by_actor[ev.actor].append(ev)
        inlines.append(event_inline(t, ev, drop_guard, W, slots, "atomic" if coverage else "d_step"))
    if by_actor.get("client"):
        raise GenerationError(f"client events besides the creating one are not modelled: {by_actor['client']}")

    # ---------------------------------------------------------------- the callers' alternatives
    worker_alts = []
    for ev in by_actor.get("worker", []):
        evid = evidence(t, ev, extra)
        if uses(ev, "lease_gen"):
            evid = f"my_gen != 0 && {evid}"
        pols = [v for k, (v, _) in POLICY.items() if uses(ev, k)]
        if pols:
            # what the write meets: everything current, or one of these off (bytes that differ from
            # the approved digest, a kill switch engaged, a stale credential or platform contract)
            choice = " ".join(f":: pol = {p}" for p in ["POL_OK", *pols])
            worker_alts.append(
                f":: atomic {{ {evid} -> if {choice} fi; ev_{ev.name}(); "
                f"if :: !ok -> pol = POL_OK :: else -> skip fi; ok = 0 }}"
            )
        else:
            worker_alts.append(f":: atomic {{ {evid} -> ev_{ev.name}(); ok = 0 }}")
    sweeper_alts = [
        f":: atomic {{ {evidence(t, ev, extra)} && {any_of('sw_state', ev.sources)} -> ev_{ev.name}(); "
        "sweeper_reset(); ok = 0 }"
        for ev in by_actor.get("sweeper", [])
    ]
    reconciler_alts = [
        f":: atomic {{ pl_have && {evidence(t, ev, extra)} -> ev_{ev.name}(); plan_reset(); ok = 0 }}"
        for ev in by_actor.get("reconciler", [])
    ]
    operator_alts = []
    for ev in by_actor.get("operator", []):
        evid = evidence(t, ev, extra)
        if "fence_restore" in ev.effects:
            # the restore procedure (declared once after a restore), not one of the operator's free moves
            cond, count = evid, "skip"
        else:
            cond = "moves < OPERATOR_MOVES" + ("" if evid == "true" else f" && {evid}")
            count = "if :: ok -> moves++ :: else -> skip fi"
        for named in (1, 0):
            operator_alts.append(
                f":: atomic {{ {cond} -> op_named = {named}; ev_{ev.name}(); {count}; op_named = 0; ok = 0 }}"
            )

    create_binding = Binding("client", "creating event", {**ACTOR_ARGS["client"], "initial": t.initial})
    for e in creator.effects:
        if e not in EFFECTS:
            raise GenerationError(f"creating event: effect {e!r} has no Promela translation")
    create = "; ".join(
        " ".join(textwrap.dedent(EFFECTS[e].format_map(create_binding)).split()) for e in creator.effects
    )

    row_decls = "\n".join(f"{typ} {name};" + (f" /* {doc} */" if doc else "") for name, typ, doc in ROW)
    orphans = "\n".join(
        f"  :: d_step {{ wl[{v}] && !(att_open && holder == {v} && lease == LIVE) -> wl[{v}] = 0 }}" for v in range(W)
    )
    # a request in the network arrives at any moment (or never); a tombstoned key is refused on arrival
    landing = "\n".join(
        f"  :: d_step {{ req_st[{i}] == TRANSIT && !TOMBED({i}) -> land({i}) }}\n"
        f"  :: d_step {{ req_st[{i}] == TRANSIT && TOMBED({i}) -> req_st[{i}] = DEAD;"
        f' printf("MSC: platform: request {i} arrives: refused by the tombstone\\n") }}'
        for i in range(1, slots + 1)
    )
    find_landed = "\n".join(
        f"       if :: r_rid == 0 && req_ep[{i}] == pl_ep && req_fe[{i}] == pl_fe && req_st[{i}] == LANDED -> r_rid = {i}"
        " :: else -> skip fi;"
        for i in range(1, slots + 1)
    )
    run_workers = "; ".join(f"run worker({v})" for v in range(W))
    pol_defines = "\n".join(f"#define {c} {i}   /* {what} */" for i, (c, what) in enumerate(POLICY.values(), start=1))
    nl = "\n"
    return render(
        "main",
        property_switches=property_switches(INTENT_PROPERTIES),
        workers=W,
        max_attempts=b.max_attempts,
        max_reconciles=b.max_reconciles,
        operator_moves=b.operator_moves,
        any_in_gap=" || ".join(f"ingap[{v}]" for v in range(W)),
        policy_defines=pol_defines,
        states=", ".join(t.states),
        row_decls=row_decls,
        slot_array=slots + 1,
        tombs=(b.operator_moves + 1) * (slots + 1),
        slots=slots,
        events=(nl + nl).join(inlines),
        in_flight=in_flight,
        worker_alts=block(nl.join(worker_alts), 2),
        sweeper_alts=block(nl.join(sweeper_alts), 2),
        unknown=unknown,
        find_landed=find_landed,
        reconciler_alts=block(nl.join(reconciler_alts), 2),
        operator_alts=block(nl.join(operator_alts), 2),
        orphans=orphans,
        landing=landing,
        other_intent=other_intent,
        restore=restore,
        creator=creator.name,
        creator_actor=creator.actor,
        creator_effects=", ".join(creator.effects),
        create=create,
        run_workers=run_workers,
    )
