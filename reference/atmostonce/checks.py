"""Static checks over the transition table's graph (docs/design.md#one-table-read-by-everything).

Each check is a function ``(Table) -> list[str]`` returning problems (empty
means it holds). :data:`CHECKS` names them all; :func:`check_table` runs them.
The broken fixtures in ``tests/fixtures/broken_tables/`` prove each one bites.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from .table import Event, Table

__all__ = ["CHECKS", "MACHINE_CHECKS", "check_machines", "check_table"]


def _machine_events(t: Table) -> list[Event]:
    return [e for e in t.events.values() if not t.actors[e.actor].human]


def references_resolve(t: Table) -> list[str]:
    """Every name an event or outcome uses is declared."""
    out = []
    if t.initial not in t.states:
        out.append(f"initial state {t.initial!r} is not declared")
    for e in t.events.values():
        if e.actor not in t.actors:
            out.append(f"event {e.name}: unknown actor {e.actor!r}")
        for s in (*e.sources, e.target):
            if s not in t.states:
                out.append(f"event {e.name}: unknown state {s!r}")
        for g in e.guards:
            if g not in t.guards:
                out.append(f"event {e.name}: guard {g!r} is not in the catalogue")
        for f in e.effects:
            if f not in t.effects:
                out.append(f"event {e.name}: effect {f!r} is not in the catalogue")
    return out


def catalogue_used(t: Table) -> list[str]:
    """Every catalogued guard and effect is named by at least one event."""
    used_g = {g for e in t.events.values() for g in e.guards}
    used_f = {f for e in t.events.values() for f in e.effects}
    return [f"guard {g!r} is catalogued but no event uses it" for g in t.guards if g not in used_g] + [
        f"effect {f!r} is catalogued but no event uses it" for f in t.effects if f not in used_f
    ]


def outcomes_map_to_states(t: Table) -> list[str]:
    """Every outcome names a declared state; one that records a move names the event, which lands there."""
    out = []
    for o in t.outcomes.values():
        if o.state not in t.states:
            out.append(f"outcome {o.name}: state {o.state!r} is not declared")
        if o.event is None:
            continue  # moves nothing: the intent stays in o.state
        ev = t.events.get(o.event)
        if ev is None:
            out.append(f"outcome {o.name}: event {o.event!r} is not declared")
        elif ev.target != o.state:
            out.append(f"outcome {o.name}: event {o.event} lands in {ev.target!r}, not {o.state!r}")
    return out


def one_creator(t: Table) -> list[str]:
    """Exactly one event creates intents, and it creates them in the initial state."""
    creators = [e for e in t.events.values() if e.creates]
    if len(creators) != 1:
        return [f"expected one creating event, found {[e.name for e in creators]}"]
    if creators[0].target != t.initial:
        return [f"creating event {creators[0].name} lands in {creators[0].target!r}, not the initial state"]
    return []


def reachable_from_initial(t: Table) -> list[str]:
    """Every declared state is reachable from the initial state."""
    seen, todo = {t.initial}, deque([t.initial])
    while todo:
        s = todo.popleft()
        for e in t.events.values():
            if s in e.sources and e.target not in seen:
                seen.add(e.target)
                todo.append(e.target)
    return [f"state {s!r} is unreachable from {t.initial!r}" for s in t.states if s not in seen]


def terminals_have_no_machine_exits(t: Table) -> list[str]:
    """No machine actor moves an intent out of a terminal state (published, parked)."""
    return [
        f"machine event {e.name} ({e.actor}) leaves terminal state {s!r}"
        for e in _machine_events(t)
        for s in e.sources
        if t.states.get(s) is not None and t.states[s].terminal
    ]


def only_retry_reenters_initial(t: Table) -> list[str]:
    """The only machine edge into the initial state from another state leaves ``failed`` (definitively not
    sent: the only state an automatic retry may leave)."""
    failed = t.names.state.failed
    out = []
    edges = [(e, s) for e in _machine_events(t) if e.target == t.initial for s in e.sources if s != t.initial]
    for e, s in edges:
        if s != failed:
            out.append(f"machine event {e.name} re-enters {t.initial!r} from {s!r}, not {failed!r}")
    if len({e.name for e, _ in edges}) > 1:
        out.append(f"more than one machine event re-enters {t.initial!r}: {sorted({e.name for e, _ in edges})}")
    return out


def unknown_never_resent_by_machine(t: Table) -> list[str]:
    """No machine-only path leads from an unknown-outcome state back to the initial or in-flight states.

    An edge guarded by a ``proof_of_absence`` guard (a fenced lookup that proves
    nothing landed, docs/design.md#a-fence-is-a-tombstone) carries evidence and is allowed to pass.
    """
    bad_targets = {t.initial, t.names.state.authorized}
    proof = {g.name for g in t.guards.values() if g.proof_of_absence}
    out = []
    for start in (t.names.state.indeterminate,):
        seen, todo = {start}, deque([(start, (start,))])
        while todo:
            s, path = todo.popleft()
            for e in _machine_events(t):
                if s not in e.sources or proof & set(e.guards):
                    continue
                if e.target in bad_targets:
                    out.append(f"machine path {' -> '.join(path)} -{e.name}-> {e.target} resends an unknown outcome")
                elif e.target not in seen:
                    seen.add(e.target)
                    todo.append((e.target, (*path, e.target)))  # type: ignore[arg-type]  # paths grow: tuple[str, ...]
    return out


def refusals_that_wait_leave_the_intent_queued(t: Table) -> list[str]:
    """A guard whose refusal is a wait names a waiting outcome that keeps the intent in the initial state and
    moves nothing, and is not also a policy gate (whose refusal parks the intent). The same holds for the
    outcome a guard checked before ``begin`` reports (``before_begin``): nothing was begun. Every waiting
    outcome (``waiting = true``) likewise moves nothing and leaves the intent queued; a ``timed`` one is waiting."""
    out = []
    for g in t.guards.values():
        for what, name in (("refusal outcome", g.refusal_outcome), ("before-begin outcome", g.before_begin)):
            if name is None:
                continue
            o = t.outcomes.get(name)
            if o is None:
                out.append(f"guard {g.name}: {what} {name!r} is not declared")
            elif not o.waiting:
                out.append(f"guard {g.name}: {what} {o.name} is not a waiting outcome")
        if g.refusal_outcome is not None and g.policy:
            out.append(f"guard {g.name}: a policy gate's refusal parks the intent; it cannot also be a wait")
    for o in t.outcomes.values():
        if o.waiting and (o.state != t.initial or o.event is not None):
            out.append(f"waiting outcome {o.name} does not leave the intent queued in {t.initial!r}")
        if o.timed and not o.waiting:
            out.append(f"outcome {o.name} is timed but not waiting")
    return out


def stale_writers_are_fenced(t: Table) -> list[str]:
    """Every machine event into or out of the in-flight state, and out of the unknown state, carries a
    ``fencing`` guard: a worker or maintenance pass acting on a superseded lease or plan is refused, and the
    refusal is recorded with what it presented (docs/design.md#leases-fencing-and-the-database-clock)."""
    fencing = set(t.fencing_guards)
    in_flight, unknown = t.names.state.authorized, t.names.state.indeterminate
    return [
        f"machine event {e.name} ({e.actor}) moves {'/'.join(e.sources)} -> {e.target} without a fencing guard"
        for e in _machine_events(t)
        if (in_flight in e.sources or e.target == in_flight or unknown in e.sources) and not fencing & set(e.guards)
    ]


CHECKS: dict[str, Callable[[Table], list[str]]] = {
    f.__name__: f
    for f in (
        references_resolve,
        catalogue_used,
        outcomes_map_to_states,
        one_creator,
        reachable_from_initial,
        terminals_have_no_machine_exits,
        only_retry_reenters_initial,
        unknown_never_resent_by_machine,
        refusals_that_wait_leave_the_intent_queued,
        stale_writers_are_fenced,
    )
}


def check_table(t: Table) -> dict[str, list[str]]:
    """Run every check; returns ``{check name: problems}`` with only failing checks present."""
    return {name: probs for name, f in CHECKS.items() if (probs := f(t))}


# ---------------------------------------------------------------- the auxiliary machines (docs/design.md#approvals-and-per-target-dispatch-claims)
def _kinds(t: Table, *kinds: str) -> set[str]:
    return {s.name for s in t.states.values() if s.kind in kinds}


def couplings_resolve(intent: Table, machines: dict[str, Table]) -> list[str]:
    """Every ``couples`` entry names a known machine and one of its events; required ones are coupled."""
    out = []
    for owner, t in (("intent", intent), *machines.items()):
        for e in t.events.values():
            for m, name in e.couples.items():
                if m not in machines:
                    out.append(f"{owner} event {e.name}: couples unknown machine {m!r}")
                elif name not in machines[m].events:
                    out.append(f"{owner} event {e.name}: {m} has no event {name!r}")
            for m in e.couples_required:
                if m not in e.couples:
                    out.append(f"{owner} event {e.name}: requires a {m} move it does not couple")
    return out


def dispatch_needs_the_claim(intent: Table, machines: dict[str, Table]) -> list[str]:
    """Every intent event into the in-flight state requires a claim move into the claim's dispatching state."""
    claim = machines.get("claim")
    if claim is None:
        return ["no claim machine"]
    inflight, dispatching = {intent.names.state.authorized}, _kinds(claim, "dispatching")
    out = []
    for e in intent.events.values():
        if e.target in inflight and not set(e.sources) <= inflight:
            ce = claim.events.get(e.couples.get("claim", ""))
            if ce is None or "claim" not in e.couples_required or ce.target not in dispatching:
                out.append(f"intent event {e.name} authorizes a send without requiring a claim move into sending")
    return out


def in_flight_exits_move_the_claim(intent: Table, machines: dict[str, Table]) -> list[str]:
    """Every intent event leaving the in-flight state couples a claim event that leaves the dispatching state."""
    claim = machines.get("claim")
    if claim is None:
        return ["no claim machine"]
    inflight, dispatching = {intent.names.state.authorized}, _kinds(claim, "dispatching")
    out = []
    for e in intent.events.values():
        if set(e.sources) & inflight and e.target not in inflight:
            ce = claim.events.get(e.couples.get("claim", ""))
            if ce is None or not set(ce.sources) & dispatching or ce.target in dispatching:
                out.append(f"intent event {e.name} leaves the in-flight state but leaves the claim sending")
    return out


def queue_exits_release_the_claim(intent: Table, machines: dict[str, Table]) -> list[str]:
    """Every intent event that takes an intent out of the queue (the initial state) other than into the
    in-flight state couples a claim event that leaves the pre-dispatch state: a reservation is never left
    holding the target for an intent that cannot dispatch (the formal check's P16, docs/formal.md)."""
    claim = machines.get("claim")
    if claim is None:
        return ["no claim machine"]
    queued, inflight = intent.initial, {intent.names.state.authorized}
    held = _kinds(claim, "pre_dispatch")
    out = []
    for e in intent.events.values():
        if queued in e.sources and e.target != queued and e.target not in inflight:
            ce = claim.events.get(e.couples.get("claim", ""))
            if ce is None or not set(ce.sources) & held or ce.target in held:
                out.append(f"intent event {e.name} takes the intent out of the queue but leaves its reservation held")
    return out


def uncertain_claim_left_only_on_evidence(intent: Table, machines: dict[str, Table]) -> list[str]:
    """A claim that began sending is never reclaimed by a timer (docs/design.md#approvals-and-per-target-dispatch-claims): every machine actor's claim event
    from a dispatching or uncertain state to a free or pre-dispatch one is coupled only to intent events that
    land in a settled state (the object exists, or the platform proved nothing was sent); only a human's
    move may free it otherwise."""
    claim = machines.get("claim")
    if claim is None:
        return ["no claim machine"]
    from .claims import settled_states

    hot, cold = _kinds(claim, "dispatching", "uncertain"), _kinds(claim, "free", "pre_dispatch")
    settled = set(settled_states(intent))
    out = []
    for e in claim.events.values():
        if claim.actors[e.actor].human or e.target not in cold or not set(e.sources) & hot:
            continue
        carriers = [ie for ie in intent.events.values() if ie.couples.get("claim") == e.name]
        if not carriers:
            out.append(f"claim event {e.name} frees a claim that may have sent, and no settling intent move carries it")
        for ie in carriers:
            if ie.target not in settled:
                out.append(
                    f"claim event {e.name} frees a claim that may have sent on {ie.name}, which lands in {ie.target!r}"
                )
    return out


def preflight_guards_belong_to_worker_moves(intent: Table, machines: dict[str, Table]) -> list[str]:
    """A guard the dispatcher evaluates before a move (``preflight``) is one a worker's move of the same
    machine checks again in its conditional write, so the pre-flight only chooses and never replaces the
    gate; and it is not a fencing guard, whose refusal must reach the write to be recorded."""
    out = []
    for name, t in machines.items():
        worker_guards = {g for e in t.events.values() if not t.actors[e.actor].human for g in e.guards}
        for g in t.preflight_guards:
            if g not in worker_guards:
                out.append(f"{name}: preflight guard {g} is checked by no worker move")
            if t.guards[g].fencing:
                out.append(f"{name}: preflight guard {g} is fencing: its refusal must be recorded by the write")
    return out


def machine_graphs_hold(intent: Table, machines: dict[str, Table]) -> list[str]:
    """Each auxiliary machine passes the generic graph checks: names resolve, catalogues are used, every
    state is reachable, and no machine actor leaves a terminal state."""
    out = []
    for name, t in machines.items():
        for f in (references_resolve, catalogue_used, reachable_from_initial, terminals_have_no_machine_exits):
            out += [f"{name}: {p}" for p in f(t)]
    return out


MACHINE_CHECKS: dict[str, Callable[[Table, dict[str, Table]], list[str]]] = {
    f.__name__: f
    for f in (
        machine_graphs_hold,
        couplings_resolve,
        dispatch_needs_the_claim,
        in_flight_exits_move_the_claim,
        queue_exits_release_the_claim,
        uncertain_claim_left_only_on_evidence,
        preflight_guards_belong_to_worker_moves,
    )
}


def check_machines(intent: Table, machines: dict[str, Table]) -> dict[str, list[str]]:
    """Run every auxiliary-machine check; ``{check name: problems}`` with only failing checks present."""
    return {name: probs for name, f in MACHINE_CHECKS.items() if (probs := f(intent, machines))}
