"""Generate the Spin (Promela) model of the delivery-intent protocol from ``spec/table.toml`` (issue 10).

``python spec/promela.py --write`` rewrites ``spec/atmostonce.pml``; ``--check`` exits 1 when the
committed file differs from what the current table gives; ``--print`` writes it to stdout.
``python spec/modelcheck.py`` runs Spin on it and on one variant per guard with that guard removed
(see ``docs/formal.md``).

Taken from the table: the states (an ``mtype``); every event (one ``d_step``: source states, the
conjunction of its guards, its effects, its target); which actor calls it; which states are
initial / in flight / terminal / unknown / retryable (the properties are phrased over those kinds,
not over state names); which outcome each event records (that decides what evidence a caller must
hold before making the call); which event carries the restore fence.

Added here, by name; the generator raises :class:`GenerationError` for any name it cannot
translate, so a new guard, effect, outcome, actor or event cannot enter the model untranslated:

* :data:`GUARDS`: one Promela expression per catalogued guard (the predicate of
  ``reference/atmostonce/guards.py`` over the model's row and world variables);
* :data:`EFFECTS`: each catalogued effect's row update, plus ghost bookkeeping;
* :data:`OUTCOME_EVIDENCE` / :data:`ACTION_EVIDENCE`: what a caller must have observed before the
  call (callers are honest about evidence but arbitrary in order, timing and staleness);
* :data:`OUTCOME_CHECKS`: property checks attached to the outcome an event records;
* :data:`ACTOR_ARGS`: what each actor presents to the store (lease, plan, identity, ...).

The environment (workers, sweeper, reconciler, operator, store clock, transport, platform,
another intent sharing the account's text, and, under ``-DRESTORES``, a database restore) is
fixed text below. Properties are assertions named ``P1_...`` to ``P9_...`` (:data:`PROPERTIES`);
``spin -DCHECK=n`` keeps only property ``n``.
"""

from __future__ import annotations

import argparse
import dataclasses
import string
import sys
import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import MappingProxyType

from atmostonce.table import Event, Table, load_table

__all__ = [
    "ACTION_EVIDENCE",
    "ACTOR_ARGS",
    "BROKEN_EVIDENCE",
    "EFFECTS",
    "GUARDS",
    "MODEL_PATH",
    "OUTCOME_CHECKS",
    "OUTCOME_EVIDENCE",
    "PROPERTIES",
    "Bounds",
    "GenerationError",
    "broken_retry_on_unknown",
    "default_model",
    "generate",
    "main",
]

HERE = Path(__file__).resolve().parent
MODEL_PATH = HERE / "atmostonce.pml"
TABLE_PATH = HERE / "table.toml"


class GenerationError(ValueError):
    """The table names something the generator has no Promela translation for."""


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The model's bounds: one intent, ``workers`` workers, at most ``operator_moves`` operator moves."""

    workers: int = 2
    max_attempts: int = 2
    max_reconciles: int = 1
    operator_moves: int = 2  # the largest OPERATOR_MOVES a configuration may pick with -D

    @property
    def request_slots(self) -> int:
        # every send needs its own authorization, hence its own attempt; attempts are capped by
        # max_attempts plus one per operator grant, so the correct model never needs more slots
        return self.max_attempts + self.operator_moves


# --------------------------------------------------------------------------------------- properties
PROPERTIES: Mapping[str, str] = MappingProxyType(
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
            "to the initial or in-flight state unless a fenced lookup of the current resend epoch "
            "has found nothing since (the proof of absence of docs/design.md), or an identified "
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
            "and inconclusive lookups never exceed the reconcile cap."
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
# Guards: the predicates of reference/atmostonce/guards.py over the model's row and world.
# {placeholders} are what the caller presents (ACTOR_ARGS binds them per actor).
GUARDS: Mapping[str, str] = MappingProxyType(
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

# Effects: the row update, then ghost bookkeeping. {caller}: the calling worker's index (NOBODY
# for other actors); {human}: 1 for an identified operator.
EFFECTS: Mapping[str, str] = MappingProxyType(
    {
        "create": """
            state = {initial}; attempt_count = 0; max_attempts = MAX_ATTEMPTS; att_open = 0;
            gen = 0; row_tok = 0; row_rep = 0; lease = NONE; rid = 0; rc = 0; max_rc = MAX_RECONCILES;
            epoch = 0; g_cap = MAX_ATTEMPTS""",
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
        "grant_attempt": """
            if
            :: max_attempts < attempt_count + 1 -> max_attempts = attempt_count + 1
            :: else -> skip
            fi;
            if
            :: {human} && g_cap < g_begins + 1 -> g_cap = g_begins + 1
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
        # the sweeper believes the lease expired (its listing may be stale: the store's clock decides)
        "crash.before_authorize": "sw_have",
        "crash.after_authorize": "sw_have",
        "lookup.found": "r_ev == FOUND",
        "lookup.not_found": "r_ev == NOT_FOUND",
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
        "lookup.not_found": "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= MAX_RECONCILES)",
        "lookup.not_found_before_restore": (
            "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= MAX_RECONCILES)"
        ),
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
_POLICY = {
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
                **{k: f"(pol != {v})" for k, (v, _) in _POLICY.items()},
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
        "operator": MappingProxyType({"caller": "NOBODY", "human": "op_named", "operator": "op_named", "rid": "0"}),
    }
)

# Arguments that carry a generation (P5): a lease or a plan.
_GENERATION_ARGS = ("lease_gen", "plan_gen")

# the intent row (the columns reference/atmostonce/guards.py reads), saved by a backup under -DRESTORES
_ROW = (
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
    ("rid", "byte", "remote_id: 0 = none, else the request slot that created the object"),
    ("txt_ours", "bit", "this intent holds the account's text slot"),
    ("holder", "byte", "ghost: the worker that opened the current attempt"),
    ("g_begins", "byte", "ghost (P7): attempts begun"),
    ("g_cap", "byte", "ghost (P7): the attempt cap granted"),
    ("g_inconclusive", "byte", "ghost (P7): inconclusive lookups"),
)


# ------------------------------------------------------------------------------------ helpers
class _Binding(dict):
    def __init__(self, actor: str, what: str, values: Mapping[str, str]):
        super().__init__(values)
        self.actor, self.what = actor, what

    def __missing__(self, key: str) -> str:
        raise GenerationError(f"{self.what}: actor {self.actor!r} presents no {key!r} (see ACTOR_ARGS)")


def _placeholders(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def _block(text: str, n: int) -> str:
    return textwrap.indent(textwrap.dedent(text).strip("\n"), " " * n)


def _any(var: str, values: Iterable[str]) -> str:
    vals = list(values)
    if not vals:
        return "false"
    return "(" + " || ".join(f"{var} == {v}" for v in vals) + ")"


def _guard_expr(name: str, where: str) -> str:
    try:
        return GUARDS[name]
    except KeyError:
        raise GenerationError(f"{where}: guard {name!r} has no Promela translation (add it to GUARDS)") from None


def _outcomes_of(t: Table, ev: Event) -> list[str]:
    return [o.name for o in t.outcomes.values() if getattr(o, "event", None) == ev.name]


def _evidence(t: Table, ev: Event, extra: Mapping[str, str]) -> str:
    if ev.name in extra:
        return extra[ev.name]
    outs = _outcomes_of(t, ev)
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


def _outcome_checks(t: Table, ev: Event) -> list[str]:
    out = []
    for o in _outcomes_of(t, ev):
        if o not in OUTCOME_CHECKS:
            raise GenerationError(f"outcome {o!r} has no entry in OUTCOME_CHECKS (use '' for none)")
        if OUTCOME_CHECKS[o] and OUTCOME_CHECKS[o] not in out:
            out.append(OUTCOME_CHECKS[o])
    return out


def _one_kind(t: Table, kind: str) -> str:
    names = [s.name for s in t.states.values() if s.kind == kind]
    if len(names) != 1:
        raise GenerationError(f"the model expects exactly one state of kind {kind!r}, found {names}")
    return names[0]


def _uses(ev: Event, placeholder: str) -> bool:
    return any(placeholder in _placeholders(_guard_expr(g, f"event {ev.name!r}")) for g in ev.guards)


def _validate(t: Table) -> None:
    for g in t.guards:
        _guard_expr(g, "guard catalogue")
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
    unknown = _one_kind(t, "unknown")
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
def _event_inline(t: Table, ev: Event, drop_guard: str | None, W: int, slots: int, seq: str = "d_step") -> str:
    human_actor = t.actors[ev.actor].human
    what = f"event {ev.name!r}"
    base = dict(ACTOR_ARGS[ev.actor])
    human = base["human"] if human_actor else "0"
    binding = _Binding(ev.actor, what, {**base, "human": human})
    in_flight = _one_kind(t, "in_flight")
    done = _one_kind(t, "terminal")
    retryable = _one_kind(t, "retryable")
    back_to_queue = [s.name for s in t.states.values() if s.kind in ("initial", "in_flight")]

    conds = [_any("state", ev.sources)]
    presented: list[str] = []
    for g in ev.guards:
        expr = _guard_expr(g, what)
        presented += [binding[p] for p in sorted(_placeholders(expr)) if p in _GENERATION_ARGS]
        if g == drop_guard:
            continue
        conds.append("(" + expr.format_map(binding) + ")")

    p6 = "; ".join(f"assert(!P6_one_live_lease || {binding['caller']} == {v} || !wl[{v}])" for v in range(W))
    eff_binding = _Binding(ev.actor, what, {**binding, "p6_check": p6, "initial": t.initial})
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
        body.append(f"assert(!P4_terminal_left_only_by_operator || !{_any('t_from', terminal)} || {human});")
    if human_actor and "grant_attempt" in ev.effects:
        # a person's deliberate decision to send again: what was sent before is on them
        body.append(f"if :: {human} -> excuse_all() :: else -> skip fi;")
    elif human_actor:
        body.append(f"if :: {human} -> tainted = 0; proof = 0 :: else -> skip fi;")
    if t.states[ev.target].kind == "unknown":
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
            f"(req_ep[{i}] == epoch && !req_ex[{i}] && (req_st[{i}] == LANDED || req_st[{i}] == TRANSIT))"
            for i in range(1, slots + 1)
        )
        body.append(f"assert(!P8_records_tell_the_truth || !({live}));")
    for chk in _outcome_checks(t, ev):
        body.append(chk + ";")
    if ev.actor == "worker":
        if "open_attempt" in ev.effects:
            body.append("my_gen = gen; my_tok = row_tok; my_rep = row_rep; my_ep = epoch;")
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
        + _block("\n".join(body), 7)
        + "\n    :: else -> ok = 0\n    fi\n  }\n}"
    )


def generate(
    t: Table,
    *,
    bounds: Bounds = Bounds(),
    drop_guard: str | None = None,
    extra_evidence: Mapping[str, str] | None = None,
    note: str = "",
    coverage: bool = False,
) -> str:
    """The Promela model for table ``t``.

    ``drop_guard``: a catalogued guard to remove from every event's enabling condition (an
    ablation: the properties and the callers stay as they are). ``extra_evidence``: caller
    preconditions for events outside :data:`ACTION_EVIDENCE` (the broken configuration).
    ``coverage``: events as ``atomic`` instead of ``d_step`` sequences, so that pan's report of
    unreached statements shows any event whose move never happens (a vacuity check).
    Raises :class:`GenerationError` for any name without a translation.
    """
    extra = dict(extra_evidence or {})
    _validate(t)
    if drop_guard is not None and drop_guard not in t.guards:
        raise GenerationError(f"cannot drop {drop_guard!r}: not in the guard catalogue")
    unknown = _one_kind(t, "unknown")
    in_flight = _one_kind(t, "in_flight")
    creators = [e for e in t.events.values() if e.creates]
    if len(creators) != 1:
        raise GenerationError(f"expected exactly one creating event, found {[e.name for e in creators]}")
    creator = creators[0]
    fences = [e for e in t.events.values() if "fence_restore" in e.effects]
    fence_sources = sorted({s for e in fences for s in e.sources}, key=list(t.states).index)
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
        inlines.append(_event_inline(t, ev, drop_guard, W, slots, "atomic" if coverage else "d_step"))
    if by_actor.get("client"):
        raise GenerationError(f"client events besides the creating one are not modelled: {by_actor['client']}")

    # ---------------------------------------------------------------- the callers' alternatives
    worker_alts = []
    for ev in by_actor.get("worker", []):
        evid = _evidence(t, ev, extra)
        if _uses(ev, "lease_gen"):
            evid = f"my_gen != 0 && {evid}"
        pols = [v for k, (v, _) in _POLICY.items() if _uses(ev, k)]
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
        f":: atomic {{ {_evidence(t, ev, extra)} && {_any('sw_state', ev.sources)} -> ev_{ev.name}(); "
        "sweeper_reset(); ok = 0 }"
        for ev in by_actor.get("sweeper", [])
    ]
    reconciler_alts = [
        f":: atomic {{ pl_have && {_evidence(t, ev, extra)} -> ev_{ev.name}(); plan_reset(); ok = 0 }}"
        for ev in by_actor.get("reconciler", [])
    ]
    operator_alts = []
    for ev in by_actor.get("operator", []):
        evid = _evidence(t, ev, extra)
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

    create_binding = _Binding("client", "creating event", {**ACTOR_ARGS["client"], "initial": t.initial})
    for e in creator.effects:
        if e not in EFFECTS:
            raise GenerationError(f"creating event: effect {e!r} has no Promela translation")
    create = "; ".join(
        " ".join(textwrap.dedent(EFFECTS[e].format_map(create_binding)).split()) for e in creator.effects
    )

    row_decls = "\n".join(f"{typ} {name};" + (f" /* {doc} */" if doc else "") for name, typ, doc in _ROW)
    rewound = [(name, typ) for name, typ, _ in _ROW]
    backup_decls = " ".join(f"{typ} b_{name};" for name, typ in rewound)
    take_backup = " ".join(f"b_{name} = {name};" for name, _ in rewound)
    do_restore = " ".join(f"{name} = b_{name};" for name, _ in rewound)
    clear_backup = " ".join(f"b_{name} = 0;" for name, _ in rewound)
    props = "\n".join(f"byte {name} = (CHECK == 0 || CHECK == {i});" for i, name in enumerate(PROPERTIES, start=1))
    prop_doc = "\n".join(
        f" * {name}:\n" + textwrap.indent(textwrap.fill(doc, 92), " *   ") for name, doc in PROPERTIES.items()
    )
    orphans = "\n".join(
        f"  :: d_step {{ wl[{v}] && !(att_open && holder == {v} && lease == LIVE) -> wl[{v}] = 0 }}" for v in range(W)
    )
    landing = "\n".join(f"  :: d_step {{ req_st[{i}] == TRANSIT -> land({i}) }}" for i in range(1, slots + 1))
    fenced_kill = "\n".join(
        f"            if :: req_ep[{i}] == pl_ep && req_st[{i}] == TRANSIT -> req_st[{i}] = DEAD :: else -> skip fi;"
        for i in range(1, slots + 1)
    )
    find_landed = "\n".join(
        f"       if :: r_rid == 0 && req_ep[{i}] == pl_ep && req_st[{i}] == LANDED -> r_rid = {i} :: else -> skip fi;"
        for i in range(1, slots + 1)
    )
    run_workers = "; ".join(f"run worker({v})" for v in range(W))
    pol_defines = "\n".join(f"#define {c} {i}   /* {what} */" for i, (c, what) in enumerate(_POLICY.values(), start=1))
    note_txt = f"\n * {note}" if note else ""
    ablation_txt = f"\n * ABLATION: guard `{drop_guard}` removed from every event." if drop_guard else ""
    nl = "\n"

    return f"""\
/* GENERATED by spec/promela.py from spec/table.toml ({t.name} {t.version}): do not edit.
 * Regenerate with `python spec/promela.py --write`; check with `python spec/modelcheck.py`.{ablation_txt}{note_txt}
 *
 * One intent (one delivery key), {W} workers, the sweeper, the reconciler, an operator, the store
 * clock, and the platform behind a transport. Bounds: max_attempts = {b.max_attempts},
 * max_reconciles = {b.max_reconciles}, operator moves = OPERATOR_MOVES (default {b.operator_moves}),
 * request slots = MAX_ATTEMPTS + OPERATOR_MOVES. The platform's lookup by key is fenced or not
 * (chosen once; both are explored).
 * Configurations (cpp): -DOTHER_INTENT adds another intent of the same account with the same
 * text (the duplicate-text window); -DRESTORES adds one database backup and one restore;
 * -DCUT_AT_BOUND stops exploring sends beyond the request slots instead of failing.
 *
 * Properties (assertions; `spin -DCHECK=n` keeps only Pn, CHECK=0 keeps all):
{prop_doc}
 */

#ifndef CHECK
#define CHECK 0
#endif
/* property switches: constants (their names appear in a failed assertion's text) */
{props}

#define NOBODY {W}
#define MAX_ATTEMPTS {b.max_attempts}
#define MAX_RECONCILES {b.max_reconciles}
#ifndef OPERATOR_MOVES
#define OPERATOR_MOVES {b.operator_moves}
#endif
#if OPERATOR_MOVES > {b.operator_moves}
#error "OPERATOR_MOVES may not exceed {b.operator_moves}: regenerate with larger bounds"
#endif
#define SLOTS (MAX_ATTEMPTS + OPERATOR_MOVES)
#define ANY_IN_GAP ({" || ".join(f"ingap[{v}]" for v in range(W))})
#ifdef CUT_AT_BOUND
#define SEND_ROOM (nreq < SLOTS)   /* ablations: a send beyond the slots is not explored */
#else
#define SEND_ROOM 1                /* the model proper: running out of slots is an error */
#endif

/* lease_expires_at: none, ahead of the store clock, passed */
#define NONE 0
#define LIVE 1
#define EXPIRED 2
/* a request on the platform */
#define TRANSIT 1
#define LANDED 2
#define DEAD 3
/* what the transport told a worker */
#define SEND_NONE 0
#define SEND_OK 1
#define SEND_NOT_SENT 2
#define SEND_UNKNOWN 3
/* what a reconciler lookup found */
#define FOUND 1
#define NOT_FOUND 2
/* what the authorizing write meets: all current, or one thing off */
#define POL_OK 0
{pol_defines}

mtype:state = {{ {", ".join(t.states)} }};

/* ---- the intent row and its ghost companions (a restore rewinds all of these) */
{row_decls}

/* ---- the world */
byte repoch;               /* the database's restore epoch (durable: a restore advances it) */
byte tok_seq;              /* ghost: attempt tokens ever issued (tokens are random: never rewound) */
bit restored;              /* a restore happened */
bit restore_unfenced;      /* a restore happened and the operator has not declared the fence yet */
byte txt_other;            /* the other intent: 0 nothing, 1 holds the text slot, 2 its effect landed */

/* ---- the platform: one slot per send */
byte req_st[{slots + 1}];    /* 0 unsent / TRANSIT / LANDED / DEAD */
byte req_ep[{slots + 1}];    /* the resend epoch the request carried */
bit req_ex[{slots + 1}];     /* excused by an identified operator's move (P1, P8) */
byte nreq;
bit FENCED;                /* the platform's lookup by key is fenced */

/* ---- ghost state for the properties */
bit wl[NOBODY + 1];        /* the worker believes it holds a live lease (P6); slot NOBODY unused */
bit ingap[NOBODY + 1];     /* between its authorizing write and its send: bytes leave before the deadline */
bit grant_live[NOBODY + 1];  /* its authorizing write was made under a live lease (P2) */
byte g_unexcused;          /* landed requests not excused by an operator (P1) */
bit ours_landed;           /* a request of this intent landed, not excused by an operator (P9) */
bit tainted, proof;        /* P3: been unknown since; a fenced lookup proved absence since */

/* scratch inside d_steps, reset to 0 before each d_step ends (not `hidden`: -DBFS refuses hidden variables) */
mtype:state t_from;
byte t_lease, t_i;

inline excuse_all() {{
  for (t_i : 1 .. {slots}) {{ req_ex[t_i] = 1 }}; t_i = 0;
  g_unexcused = 0; ours_landed = 0; tainted = 0; proof = 0
}}

inline land(i) {{
  printf("MSC: platform: request %d lands\\n", i);
  req_st[i] = LANDED;
  if :: !req_ex[i] -> g_unexcused++; ours_landed = 1 :: else -> skip fi;
  assert(!P1_at_most_one_effect || g_unexcused <= 1);
  assert(!P9_duplicate_text_excluded || req_ex[i] || txt_other != 2)
}}

inline worker_reset() {{
  my_gen = 0; my_tok = 0; my_rep = 0; my_ep = 0; my_rid = 0; pol = POL_OK; authed = 0; out = SEND_NONE;
  ingap[w] = 0; grant_live[w] = 0
}}

inline sweeper_reset() {{
  sw_have = 0; sw_state = 0; sw_gen = 0; sw_tok = 0; sw_rep = 0
}}

inline plan_reset() {{
  pl_have = 0; pl_gen = 0; pl_rc = 0; pl_rep = 0; pl_rid = 0; pl_ep = 0; r_ev = 0; r_rid = 0
}}

/* ================================================================ events (one per table row) */

{(nl + nl).join(inlines)}

/* ================================================================ the transport (not a table event)
 * One send per authorization; the request takes a slot on the platform. The transport reports
 * success (the object landed), a definitive not-sent (nothing reached the platform), or unknown
 * (the request is in transit: it may land later, or never). */
inline transport_send() {{
  assert(!P2_send_needs_current_authorization ||
         (state == {in_flight} && att_open && row_tok == my_tok && my_tok == tok_seq && gen == my_gen
          && lease == LIVE && grant_live[w] && pol == POL_OK));
  if
  :: nreq < SLOTS -> nreq++
  :: else -> assert(BOUND_request_slots_too_small)
  fi;
  req_ep[nreq] = my_ep; req_ex[nreq] = 0;
  authed = 0; ingap[w] = 0;
  if
  :: out = SEND_OK; my_rid = nreq; printf("MSC: worker %d: send request %d: success\\n", w, nreq); land(nreq)
  :: out = SEND_NOT_SENT; req_st[nreq] = DEAD; printf("MSC: worker %d: send request %d: not sent\\n", w, nreq)
  :: out = SEND_UNKNOWN; req_st[nreq] = TRANSIT; printf("MSC: worker %d: send request %d: unknown\\n", w, nreq)
  fi
}}
byte BOUND_request_slots_too_small = 0;

/* ================================================================ actors */

/* A dispatch worker: calls its table events in any order its evidence allows, with the lease it
 * holds (possibly stale), and may stop at every step boundary; it comes back with no memory. */
proctype worker(byte w) {{
  byte my_gen, my_tok, my_rep, my_ep, my_rid, out, pol;
  bit authed, ok;
end:
  do
{_block(nl.join(worker_alts), 2)}
  :: atomic {{ authed && SEND_ROOM -> transport_send() }}
  :: atomic {{ (my_gen != 0 || out != SEND_NONE) -> worker_reset() }}   /* crash */
  od
}}

/* The sweeper: reads any open attempt it believes has expired (its listing may be stale or its
 * judgement early: the store's clock decides), then calls its event for the state it read. */
proctype sweeper() {{
  mtype:state sw_state;
  byte sw_gen, sw_tok, sw_rep;
  bit sw_have, ok;
end:
  do
  :: atomic {{ !sw_have && att_open -> sw_have = 1; sw_state = state; sw_gen = gen; sw_tok = row_tok; sw_rep = row_rep }}
{_block(nl.join(sweeper_alts), 2)}
  :: atomic {{ sw_have -> sweeper_reset() }}   /* gives up or crashes */
  od
}}

/* The reconciler: plans on an unknown-outcome intent (generation, reconcile count, remote id,
 * resend epoch), makes at most one lookup, then records what it found; its plan may be stale by
 * then. It claims `fenced` whenever the platform's lookup is fenced, whichever lookup it made. */
proctype reconciler() {{
  byte pl_gen, pl_rc, pl_rep, pl_rid, pl_ep, r_ev, r_rid;
  bit pl_have, ok;
end:
  do
  :: atomic {{ !pl_have && state == {unknown} -> pl_have = 1; pl_gen = gen; pl_rc = rc; pl_rep = repoch; pl_rid = rid; pl_ep = epoch }}
  /* read back by remote id: never fenced; a landed object may not be visible yet */
  :: atomic {{ pl_have && r_ev == 0 && pl_rid != 0 ->
       if
       :: req_st[pl_rid] == LANDED -> r_ev = FOUND; r_rid = pl_rid; printf("MSC: reconciler: read back: found\\n")
       :: r_ev = NOT_FOUND; printf("MSC: reconciler: read back: not found\\n")
       fi }}
  /* lookup by delivery key and resend epoch */
  :: atomic {{ pl_have && r_ev == 0 ->
{find_landed}
       if
       :: FENCED && r_rid != 0 -> r_ev = FOUND; printf("MSC: reconciler: fenced lookup: found\\n")
       :: FENCED && r_rid == 0 ->
            r_ev = NOT_FOUND;   /* a fence: no request sent before this answer can land any more */
            printf("MSC: reconciler: fenced lookup: not found\\n");
{fenced_kill}
            if :: tainted && pl_ep == epoch -> proof = 1 :: else -> skip fi
       :: !FENCED && r_rid != 0 -> r_ev = FOUND; printf("MSC: reconciler: lookup: found\\n")
       :: !FENCED -> r_ev = NOT_FOUND; r_rid = 0;   /* unfenced: read lag may hide an object */
            printf("MSC: reconciler: lookup: not found\\n")
       fi }}
{_block(nl.join(reconciler_alts), 2)}
  :: atomic {{ pl_have -> plan_reset() }}   /* gives up or crashes */
  od
}}

/* An operator: at most OPERATOR_MOVES moves that the store accepts; a call may name no person. */
proctype operator() {{
  byte moves;
  bit op_named, ok;
end:
  do
{_block(nl.join(operator_alts), 2)}
  od
}}

/* The store clock: a lease deadline passes at any moment, except that a worker's bytes leave
 * before its send lease ends (the send lease outlasts the pause between authorizing and sending). */
proctype clock() {{
end:
  do
  :: d_step {{ lease == LIVE && !ingap[holder] -> lease = EXPIRED; wl[holder] = 0; printf("MSC: clock: the lease passes its deadline\\n") }}
{orphans}
  od
}}

/* The platform: a request in transit may land at any moment (or never). */
proctype platform() {{
end:
  do
{landing}
  od
}}

#ifdef OTHER_INTENT
/* Another intent of the same account with the same normalized text, run by the same protocol:
 * it claims the text slot at its authorization if this intent does not hold it; then it lands. */
proctype other_intent() {{
end_claim:
  atomic {{ txt_ours == 0 && txt_other == 0 -> txt_other = 1; printf("MSC: other intent: claims the text slot\\n") }};
end_land:
  atomic {{ txt_other == 1 -> txt_other = 2; printf("MSC: other intent: its effect lands\\n"); assert(!P9_duplicate_text_excluded || !ours_landed) }}
end_done:
  skip
}}
#endif

#ifdef RESTORES
/* The database: one backup at any moment, then one restore from it at any later moment. The
 * restore rewinds the row, its sequence and its text claims; the restore epoch (kept outside the
 * database) advances; every lease is void. Until the operator declares the restore fence, no worker
 * starts a new attempt; stragglers that were running before the restore may still act. */
proctype dba() {{
  {backup_decls}
  atomic {{ {take_backup} printf("MSC: database: backup taken\\n") }};
end_restore:
  atomic {{
#ifndef RESTORE_ANYTIME
    !ANY_IN_GAP ->   /* opened only once every send lease issued before the restore has run out */
#endif
    {do_restore}
    {clear_backup}
    repoch++; restored = 1; printf("MSC: database: restored from the backup\\n");
    restore_unfenced = {_any("state", fence_sources)};
    for (t_i : 0 .. NOBODY) {{ wl[t_i] = 0 }}; t_i = 0;
    tainted = 0; proof = 0
  }}
}}
#endif

init {{
  atomic {{
    /* {creator.name} ({creator.actor}): effects {", ".join(creator.effects)} */
    {create};
    holder = NOBODY;
    if :: FENCED = 1 :: FENCED = 0 fi;
    {run_workers}; run sweeper(); run reconciler(); run operator(); run clock(); run platform();
#ifdef OTHER_INTENT
    run other_intent();
#endif
#ifdef RESTORES
    run dba();
#endif
    skip
  }}
}}
"""


# ------------------------------------------------------------------------------------ CLI
def default_model(table: Table | None = None) -> str:
    """The committed model: the current table, default bounds, nothing removed."""
    return generate(table or load_table(TABLE_PATH))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python spec/promela.py", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help=f"rewrite spec/{MODEL_PATH.name}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if spec/{MODEL_PATH.name} is stale")
    g.add_argument("--print", action="store_true", help="write the model to stdout")
    args = ap.parse_args(argv)
    try:
        text = default_model()
    except GenerationError as exc:
        print(f"promela: {exc}", file=sys.stderr)
        return 2
    if args.print:
        sys.stdout.write(text)
        return 0
    if args.write:
        MODEL_PATH.write_text(text, "utf-8")
        print(f"wrote {MODEL_PATH}")
        return 0
    if not MODEL_PATH.exists() or MODEL_PATH.read_text("utf-8") != text:
        print(f"{MODEL_PATH} is stale: run `python spec/promela.py --write`", file=sys.stderr)
        return 1
    print(f"{MODEL_PATH.name} matches the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
