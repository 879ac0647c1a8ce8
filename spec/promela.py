"""Generate the Spin (Promela) model of the delivery-intent protocol from ``spec/table.toml`` (issue 10).

``python spec/promela.py --write`` rewrites ``spec/atmostonce.pml``; ``--check`` exits 1 when the
committed file differs from what the current table gives; ``--print`` writes it to stdout.
``python spec/modelcheck.py`` runs Spin on it and on one variant per guard with that guard removed
(see ``docs/formal.md``).

Taken from the table: the states (an ``mtype``); every event (one ``d_step``: source states, the
conjunction of its guards, its effects, its target); which actor calls it; which states are
initial / in flight / terminal / unknown / retryable (named through the table vocabulary, ``t.names.state``);
which outcome each event records (that decides what evidence a caller must
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

Under ``-DCLAIMS`` the file is another model (:func:`generate_claims`): two approval-gated intents
sharing one target, the target's claim row (``spec/claim.toml``), the approvals
(``spec/approval.toml``), and every intent event moving the claim as its ``couples`` field says;
properties ``P10_...`` to ``P14_...`` (:data:`CLAIM_PROPERTIES`).
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

from atmostonce.table import Event, Table, load_table, machine

__all__ = [
    "ACTION_EVIDENCE",
    "ACTOR_ARGS",
    "BROKEN_EVIDENCE",
    "CLAIM_EFFECTS_PML",
    "CLAIM_GUARDS_PML",
    "CLAIM_PROPERTIES",
    "CLAIMS_ACTOR_ARGS",
    "CLAIMS_INTENT_EFFECTS",
    "CLAIMS_INTENT_GUARDS",
    "EFFECTS",
    "GUARDS",
    "MODEL_PATH",
    "OUTCOME_CHECKS",
    "OUTCOME_EVIDENCE",
    "PROPERTIES",
    "Bounds",
    "GenerationError",
    "broken_claim_freed_on_unknown",
    "broken_retry_on_unknown",
    "default_model",
    "generate",
    "generate_claims",
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
_INTENT_PROPERTIES: Mapping[str, str] = MappingProxyType(
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
            epoch = 0; fepoch = 0; g_cap = MAX_ATTEMPTS""",
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
        "lookup.not_found": "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= MAX_RECONCILES)",
        "lookup.not_found_before_restore": (
            "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= MAX_RECONCILES)"
        ),
        "lookup.differs": "g_inconclusive++; assert(!P7_budgets || g_inconclusive <= MAX_RECONCILES)",
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
    ("fepoch", "byte", "fence_epoch: with the resend epoch, the platform idempotency key"),
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


# ------------------------------------------------------------------------------------ generate
def _event_inline(t: Table, ev: Event, drop_guard: str | None, W: int, slots: int, seq: str = "d_step") -> str:
    human_actor = t.actors[ev.actor].human
    what = f"event {ev.name!r}"
    base = dict(ACTOR_ARGS[ev.actor])
    human = base["human"] if human_actor else "0"
    binding = _Binding(ev.actor, what, {**base, "human": human})
    in_flight = t.names.state.authorized
    done = t.names.state.published
    retryable = t.names.state.failed
    back_to_queue = [t.initial, in_flight]

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
    for chk in _outcome_checks(t, ev):
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
    claim_t, approval_t = machine("claim"), machine("approval")
    if drop_guard is not None and drop_guard not in {*t.guards, *claim_t.guards, *approval_t.guards}:
        raise GenerationError(f"cannot drop {drop_guard!r}: not in the guard catalogue")
    claims = generate_claims(t, claim_t, approval_t, drop_guard=drop_guard, bounds=bounds, extra_evidence=extra)
    if drop_guard not in t.guards:
        drop_guard = None
    unknown = t.names.state.indeterminate
    in_flight = t.names.state.authorized
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
    props = "\n".join(
        f"byte {name} = (CHECK == 0 || CHECK == {i});" for i, name in enumerate(_INTENT_PROPERTIES, start=1)
    )
    prop_doc = "\n".join(
        f" * {name}:\n" + textwrap.indent(textwrap.fill(doc, 92), " *   ") for name, doc in _INTENT_PROPERTIES.items()
    )
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
    fenced_kill = "\n".join(
        [
            "#ifndef NO_TOMBSTONE",
            "            tomb[KEY(pl_ep, pl_fe)] = 1;   /* the tombstone: no create with this key lands any more */",
            "#endif",
        ]
    )
    find_landed = "\n".join(
        f"       if :: r_rid == 0 && req_ep[{i}] == pl_ep && req_fe[{i}] == pl_fe && req_st[{i}] == LANDED -> r_rid = {i}"
        " :: else -> skip fi;"
        for i in range(1, slots + 1)
    )
    run_workers = "; ".join(f"run worker({v})" for v in range(W))
    pol_defines = "\n".join(f"#define {c} {i}   /* {what} */" for i, (c, what) in enumerate(_POLICY.values(), start=1))
    note_txt = f"\n * {note}" if note else ""
    ablation_txt = f"\n * ABLATION: guard `{drop_guard}` removed from every event." if drop_guard else ""
    nl = "\n"

    text = f"""\
/* GENERATED by spec/promela.py from spec/table.toml ({t.name} {t.version}): do not edit.
 * Regenerate with `python spec/promela.py --write`; check with `python spec/modelcheck.py`.{ablation_txt}{note_txt}
 *
 * One intent (one delivery key), {W} workers, the sweeper, the reconciler, an operator, the store
 * clock, and the platform behind a transport. Bounds: max_attempts = {b.max_attempts},
 * max_reconciles = {b.max_reconciles}, operator moves = OPERATOR_MOVES (default {b.operator_moves}),
 * request slots = MAX_ATTEMPTS + OPERATOR_MOVES. The platform's lookup by key is fenced or not
 * (chosen once; both are explored). A request the transport reported unknown is in the network
 * (TRANSIT): it has not reached the platform yet and may arrive at any later moment, also after a
 * fenced lookup answered; a fenced not-found leaves a tombstone on the key it looked up (resend
 * epoch, fence epoch), and the platform refuses every create carrying a tombstoned key when it
 * arrives (docs/design.md, "A fence is a tombstone").
 * Configurations (cpp): -DOTHER_INTENT adds another intent of the same account with the same
 * text (the duplicate-text window); -DRESTORES adds one database backup and one restore;
 * -DCUT_AT_BOUND stops exploring sends beyond the request slots instead of failing;
 * -DNO_TOMBSTONE (an ablation) makes the platform fence only what had arrived: no tombstone.
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
byte req_st[{slots + 1}];    /* 0 unsent / TRANSIT (in the network) / LANDED / DEAD */
byte req_ep[{slots + 1}];    /* the resend epoch the request carried */
byte req_fe[{slots + 1}];    /* the fence epoch the request carried */
bit tomb[{(b.operator_moves + 1) * (slots + 1)}];      /* the platform's tombstones, by key (resend epoch, fence epoch) */
#define KEY(ep, fe) ((ep) * {slots + 1} + (fe))
#define TOMBED(i) (tomb[KEY(req_ep[i], req_fe[i])])
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
  my_gen = 0; my_tok = 0; my_rep = 0; my_ep = 0; my_fe = 0; my_rid = 0; pol = POL_OK; authed = 0; out = SEND_NONE;
  ingap[w] = 0; grant_live[w] = 0
}}

inline sweeper_reset() {{
  sw_have = 0; sw_state = 0; sw_gen = 0; sw_tok = 0; sw_rep = 0
}}

inline plan_reset() {{
  pl_have = 0; pl_gen = 0; pl_rc = 0; pl_rep = 0; pl_rid = 0; pl_ep = 0; pl_fe = 0; r_ev = 0; r_rid = 0
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
  req_ep[nreq] = my_ep; req_fe[nreq] = my_fe; req_ex[nreq] = 0;
  authed = 0; ingap[w] = 0;
  if
  :: !TOMBED(nreq) -> out = SEND_OK; my_rid = nreq; printf("MSC: worker %d: send request %d: success\\n", w, nreq); land(nreq)
  :: out = SEND_NOT_SENT; req_st[nreq] = DEAD; printf("MSC: worker %d: send request %d: not sent\\n", w, nreq)
  :: out = SEND_UNKNOWN; req_st[nreq] = TRANSIT; printf("MSC: worker %d: send request %d: unknown\\n", w, nreq)
  fi
}}
byte BOUND_request_slots_too_small = 0;

/* ================================================================ actors */

/* A dispatch worker: calls its table events in any order its evidence allows, with the lease it
 * holds (possibly stale), and may stop at every step boundary; it comes back with no memory. */
proctype worker(byte w) {{
  byte my_gen, my_tok, my_rep, my_ep, my_fe, my_rid, out, pol;
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
  byte pl_gen, pl_rc, pl_rep, pl_rid, pl_ep, pl_fe, r_ev, r_rid;
  bit pl_have, ok;
end:
  do
  :: atomic {{ !pl_have && state == {unknown} -> pl_have = 1; pl_gen = gen; pl_rc = rc; pl_rep = repoch; pl_rid = rid; pl_ep = epoch; pl_fe = fepoch }}
  /* read back by remote id: never fenced; a landed object may not be visible yet */
  :: atomic {{ pl_have && r_ev == 0 && pl_rid != 0 ->
       if
       :: req_st[pl_rid] == LANDED -> r_ev = FOUND; r_rid = pl_rid; printf("MSC: reconciler: read back: found\\n")
       :: r_ev = NOT_FOUND; printf("MSC: reconciler: read back: not found\\n")
       fi }}
  /* lookup by the platform key: delivery key, resend epoch, fence epoch */
  :: atomic {{ pl_have && r_ev == 0 ->
{find_landed}
       if
       :: FENCED && r_rid != 0 -> r_ev = FOUND; printf("MSC: reconciler: fenced lookup: found\\n")
       :: FENCED && r_rid == 0 ->
            r_ev = NOT_FOUND;   /* a fence: no request with this key can land any more */
            printf("MSC: reconciler: fenced lookup: not found\\n");
{fenced_kill}
            if :: tainted && pl_ep == epoch && pl_fe == fepoch -> proof = 1 :: else -> skip fi
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
    head, sep, body = text.partition("#ifndef CHECK\n")
    return f"{head}#ifdef CLAIMS\n{claims}\n#else /* not CLAIMS: the intent configurations */\n\n{sep}{body}#endif\n"


# ==================================================================================== claims (issue 5)
# Configuration `claims` (-DCLAIMS): two approval-gated intents share one target. The target's
# claim row (spec/claim.toml), the approvals (spec/approval.toml) and the coupling of intent events
# to claim events (`couples` / `couples_required` in spec/table.toml) are generated from the data;
# the intent machine runs with its states and events from the table, but its own guards are
# abstracted (CLAIMS_INTENT_GUARDS): the intent-level properties are checked in the other
# configurations, this one checks what the claim and approval machines and the coupling add.

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
            )
        },
    }
)

# The claim guards (reference/atmostonce/claims.py CLAIM_GUARDS): `k` the intent the move is for,
# `ap` the approval (presented at reserve, the claim's bound approval for a coupled move);
# {cl_ep} / {cl_tok} the claim lease the caller presents, {digest} the bytes it means to send.
CLAIM_GUARDS_PML: Mapping[str, str] = MappingProxyType(
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
        # approval.toml
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


def _kind_states(t: Table, *kinds: str) -> list[str]:
    return [s.name for s in t.states.values() if s.kind in kinds]


def _claim_guard(name: str, where: str, binding: Mapping[str, str]) -> str:
    try:
        expr = CLAIM_GUARDS_PML[name]
    except KeyError:
        raise GenerationError(
            f"{where}: guard {name!r} has no Promela translation (add it to CLAIM_GUARDS_PML)"
        ) from None
    return "(" + expr.format_map(binding) + ")"


def _claim_effects(effects: Iterable[str], where: str, binding: Mapping[str, str]) -> list[str]:
    out = []
    for eff in effects:
        if eff not in CLAIM_EFFECTS_PML:
            raise GenerationError(f"{where}: effect {eff!r} has no Promela translation (add it to CLAIM_EFFECTS_PML)")
        out.append(f"/* effect {eff} */ " + CLAIM_EFFECTS_PML[eff].format_map(binding) + ";")
    return out


def _validate_claims(t: Table, claim_t: Table, approval_t: Table) -> None:
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


def generate_claims(
    t: Table,
    claim_t: Table,
    approval_t: Table,
    *,
    drop_guard: str | None = None,
    bounds: Bounds = Bounds(),
    extra_evidence: Mapping[str, str] | None = None,
) -> str:
    """The claims configuration (the text between ``#ifdef CLAIMS`` and ``#else``)."""
    _validate_claims(t, claim_t, approval_t)
    W, NI, NA = bounds.workers, CLAIMS_INTENTS, CLAIMS_APPROVALS
    in_flight = t.names.state.authorized
    settled = [t.names.state.published, t.names.state.failed]
    c_free = _one_kind(claim_t, "free")
    c_dispatching = _one_kind(claim_t, "dispatching")
    c_began = _kind_states(claim_t, "dispatching", "uncertain")
    c_reserved = _kind_states(claim_t, "pre_dispatch")
    p16 = (
        f"assert(!P16_reservation_only_for_a_queued_intent || !{_any('c_st', c_reserved)} "
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
        conds = [_any("c_st", cev.sources)]
        for g in cev.guards:
            if g != drop_guard:
                conds.append(_claim_guard(g, f"{where}: claim event {cev_name!r}", binding))
        effs = ["t_cfrom = c_st; t_clease = c_lease; t_ctok = c_tok;"]
        effs += _claim_effects(cev.effects, f"claim event {cev_name!r}", binding)
        effs.append(f"c_st = {cev.target};")
        for aev_name in cev.couples.values():
            aev = approval_t.events[aev_name]
            conds.append(f"ap != 0 && {_any('a_st[ap]', aev.sources)}")
            for g in aev.guards:
                if g != drop_guard:
                    conds.append(_claim_guard(g, f"approval event {aev_name!r}", binding))
            effs += _claim_effects(aev.effects, f"approval event {aev_name!r}", binding)
            effs.append(f"a_st[ap] = {aev.target};")
        checks = []
        if "take_claim" in cev.effects:
            others = " && ".join(f"(w == {v} || g_ctok[{v}] == 0 || g_ctok[{v}] != t_ctok)" for v in range(W))
            checks.append(f"assert(!P15_one_live_claim_lease || t_clease != LIVE || ({others}));")
        if cev.target == c_free and set(cev.sources) & set(c_began):
            checks.append(
                f"assert(!P11_sending_claim_freed_only_when_settled || !{_any('t_cfrom', c_began)} "
                f"|| {_any('i_st[k]', settled)} || {binding['human']});"
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
        binding = _Binding(
            ev.actor, f"event {ev.name!r}", {**common, **base, "human": base["human"] if human_actor else "0"}
        )
        iconds = [_any("i_st[k]", ev.sources)]
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
                applies = f"(c_key == k && {_any('c_st', claim_t.events[cev_name].sources)})"
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
            + _block("\n".join(body), 7)
            + "\n    :: else -> ok = 0\n    fi;\n    ap = 0\n  }\n}"
        )
        by_actor.setdefault(ev.actor, []).append(ev.name)

    # ---- claim events not coupled to an intent event: called by a worker on its own
    standalone_claim = [e for e in claim_t.events.values() if e.name not in claim_events_coupled]
    for cev in standalone_claim:
        if cev.actor != "worker":
            raise GenerationError(f"claim event {cev.name!r} is neither coupled nor a worker's: not modelled")
        base = dict(CLAIMS_ACTOR_ARGS["worker"])
        binding = _Binding("worker", f"claim event {cev.name!r}", {**common, **base})
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
            + _block("\n".join(body), 7)
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
        binding = _Binding(
            aev.actor,
            f"approval event {aev.name!r}",
            {**common, **base, "human": base["human"] if human_actor else "0"},
        )
        conds = ["na < NA"] if aev.creates else [f"ap != 0 && {_any('a_st[ap]', aev.sources)}"]
        for g in aev.guards:
            if g != drop_guard:
                conds.append(_claim_guard(g, f"approval event {aev.name!r}", binding))
        body = ["t_afrom = " + ("0" if aev.creates else "a_st[ap]") + ";"]
        body += _claim_effects(aev.effects, f"approval event {aev.name!r}", binding)
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
            + _block("\n".join(body), 7)
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
        evid = _evidence(t, ev, dict(extra_evidence or {}))
        if any("lease_tok" in _placeholders(CLAIMS_INTENT_GUARDS[g]) for g in ev.guards):
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
        evid = _evidence(t, t.events[n], {**CLAIMS_EVIDENCE, **(extra_evidence or {})})
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
    props = "\n".join(
        f"byte {name} = (CHECK == 0 || CHECK == {i});"
        for i, name in enumerate(CLAIM_PROPERTIES, start=len(_INTENT_PROPERTIES) + 1)
    )
    prop_doc = "\n".join(
        f" * {name}:\n" + textwrap.indent(textwrap.fill(doc, 92), " *   ") for name, doc in CLAIM_PROPERTIES.items()
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
    return f"""\
/* ==================================================================================== CLAIMS
 * Configuration `claims` (generated from spec/table.toml, spec/claim.toml, spec/approval.toml).{ablation_txt}
 * {NI} approval-gated intents share one target: its claim row ({", ".join(claim_t.states)}; epoch,
 * owner token, bound intent and approval, lease) and its version; up to {NA} approvals
 * ({", ".join(approval_t.states)}), each drafted against the target version current when it was given;
 * (approval a is for intent ((a - 1) mod {NI}) + 1); {W} workers that reserve, replace and release the claim with possibly stale claim leases and crash
 * at any step; the sweeper, the reconciler, one operator move, one draft edit after review, the
 * database clock (intent leases, claim leases, approval deadlines). Intent events move the claim
 * as their `couples` field says, in the same atomic step. The intent machine's own guards are
 * abstracted (CLAIMS_INTENT_GUARDS in spec/promela.py): attempt ownership and leases stay, the
 * rest is checked by the other configurations.
 *
 * Properties:
{prop_doc}
 */

#ifndef CHECK
#define CHECK 0
#endif
{props}

#define NOBODY {W}
#define NI {NI}
#define NA {NA}
#ifndef NT
#define NT {CLAIMS_ATTEMPTS}
#endif
#ifndef NC
#define NC {CLAIMS_TAKES}
#endif
#ifndef CLAIMS_OPERATOR_MOVES
#define CLAIMS_OPERATOR_MOVES 1
#endif
#define NONE 0
#define LIVE 1
#define EXPIRED 2
#define SEND_NONE 0
#define SEND_OK 1
#define SEND_NOT_SENT 2
#define SEND_UNKNOWN 3
#define FOUND 1
#define NOT_FOUND 2

mtype:state = {{ {", ".join(t.states)} }};
mtype:claim = {{ {", ".join(claim_t.states)} }};
mtype:approval = {{ {", ".join(approval_t.states)} }};

/* ---- the intents (index 1..NI): state, attempt token, send lease, digest of the current draft */
mtype:state i_st[NI + 1];
byte i_tok[NI + 1];
byte i_dig[NI + 1];
bit i_gap[NI + 1];          /* ghost: bytes of this intent between its authorization and its send */
byte tok_seq;
/* ---- the target's claim row */
mtype:claim c_st;
byte c_ep, c_tok, c_key, c_apv, c_lease, tver, ctok_seq;
bit c_tied;                 /* the claim lease is the bound intent's send lease (extend_claim_lease) */
/* ---- the approvals (index 1..NA) */
mtype:approval a_st[NA + 1];
byte a_key[NA + 1], a_ver[NA + 1], a_dig[NA + 1], a_dl[NA + 1];
bit a_named[NA + 1];        /* ghost: a named person gave it */
bit a_used[NA + 1];         /* ghost (P12): it authorized a dispatch */
byte na;
byte g_vers;                /* ghost (P13): target versions the dispatched approvals were drafted against */
byte g_ctok[{W}];             /* ghost (P15): the claim owner token each worker holds (0: none; forgotten on a crash) */
bit restore_unfenced;       /* no restore in this configuration (CLAIMS_EVIDENCE) */

mtype:state t_from;
mtype:claim t_cfrom;
mtype:approval t_afrom;
byte t_clease, t_ctok;
bit t_app;

inline cworker_reset() {{
  wk = 0; my_gen = 0; cl_ep = 0; cl_tok = 0; g_ctok[w] = 0; out = SEND_NONE; authed = 0
}}

{(nl + nl).join(inlines)}

/* A dispatch worker: works on one intent at a time (chosen freely), reserves or replaces the
 * claim with any approval, calls the intent's worker events with the leases it holds (possibly
 * stale), sends once after an authorization, and may crash at any step (it forgets everything). */
proctype cworker(byte w) {{
  byte wk, k, ap, my_gen, cl_ep, cl_tok, out;
  bit authed, ok;
end:
  do
  :: atomic {{ wk == 0 -> if :: w == 0 -> k = 1 :: else -> {pick_k} fi; wk = k }}   /* worker 0 works on intent 1 */
{_block(nl.join(worker_alts), 2)}
  :: atomic {{ authed && k == wk ->
       assert(!P10_one_dispatch_per_target || (i_st[k] == {in_flight} && c_st == {c_dispatching} && c_key == k
              && c_ep == cl_ep && c_tok == cl_tok && {others_idle()}));
       authed = 0; i_gap[k] = 0;
       if
       :: out = SEND_OK; printf("MSC: worker %d: intent %d's bytes leave: success\\n", w, k)
       :: out = SEND_NOT_SENT; printf("MSC: worker %d: intent %d: not sent\\n", w, k)
       :: out = SEND_UNKNOWN; printf("MSC: worker %d: intent %d's bytes leave: unknown\\n", w, k)
       fi }}
  :: atomic {{ wk != 0 -> if :: authed -> i_gap[wk] = 0 :: else -> skip fi; cworker_reset(); k = 0 }}   /* crash */
  od
}}

proctype csweeper() {{
  byte k, ap;
  bit ok;
end:
  do
{_block(nl.join(sweeper_alts), 2)}
  od
}}

proctype creconciler() {{
  byte k, ap;
  bit ok;
end:
  do
{_block(nl.join(reconciler_alts), 2)}
  od
}}

proctype coperator() {{
  byte k, ap, moves;
  bit op_named, ok;
end:
  do
{_block(nl.join(operator_alts), 2)}
  od
}}

/* The approver: up to NA approvals, each of one intent's current draft, named or not. */
proctype capprover() {{
  byte k, ap;
  bit op_named, ok;
end:
  do
{_block(nl.join(approver_alts), 2)}
  od
}}

/* The editor changes one queued draft once, after it may have been approved (new bytes). */
proctype ceditor() {{
end:
  atomic {{ if {edit} fi }}
}}

/* The database clock: deadlines pass at any moment, except that bytes leave before the send
 * lease ends (and with it the claim lease it was extended to). */
proctype cclock() {{
end:
  do
  :: d_step {{ c_lease == LIVE && !(c_tied && i_gap[c_key]) -> c_lease = EXPIRED;
       printf("MSC: clock: the claim lease passes\\n") }}
{approval_clock}
  od
}}

init {{
  atomic {{
    {"; ".join(f"i_st[{j}] = {t.initial}; i_dig[{j}] = 1" for j in range(1, NI + 1))};
    c_st = {claim_t.initial};
    {"; ".join(f"run cworker({v})" for v in range(W))}; run csweeper(); run creconciler(); run coperator();
    run capprover(); run ceditor(); run cclock()
  }}
}}
"""


PROPERTIES: Mapping[str, str] = MappingProxyType({**_INTENT_PROPERTIES, **CLAIM_PROPERTIES})


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
