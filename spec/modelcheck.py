"""Run the Spin model check of the delivery-intent protocol; see ``docs/formal.md``.

``python spec/modelcheck.py`` generates the model from ``spec/table.toml`` (it must equal the
committed ``spec/atmostonce.pml``), runs ``spin -a``, compiles ``pan`` with gcc and runs it for:

* the model proper, in each configuration of :data:`CONFIGURATIONS` (zero errors expected);
* one ablation per catalogued guard, the guard removed from every event: each must produce a
  counterexample in some configuration, unless :data:`NOT_CAUGHT` names the guard with a reason
  (then it must produce none);
* partial ablations (:data:`PARTIAL_ABLATIONS`): a guard removed from some of its events only,
  which must produce a counterexample too;
* the deliberately broken configuration (a machine retry of an unknown outcome), which must
  produce a counterexample;
* platform ablations (:data:`PLATFORM_ABLATIONS`): the platform's side of a proof of absence taken
  away (a fenced lookup that leaves no tombstone), which must produce a counterexample, and with
  only P1 switched on a duplicate effect;
* explorations (:data:`EXPLORATIONS`): configurations that drop an assumption of the model on
  purpose; their counterexample is expected, recorded and compared like everything else.

It reads each ``pan`` report (errors, states stored, transitions, depth, time; ``./pan`` exits 0
even when it finds errors), replays every counterexample with ``spin -t -p`` and keeps the event
lines, and compares everything with the committed manifest ``spec/modelcheck.json``: state counts
and outcomes exactly. ``--write`` records a new manifest instead. Exit status: 0 all as expected;
1 a property failed, an ablation went uncaught, or the manifest differs; 2 spin or gcc is missing,
or the model is stale. Wall time never decides the exit status: a run much slower than the recorded
one (a loaded machine) prints a warning and exits as its results say; no Spin or gcc step has a
time limit (every search is bounded by its depth and memory limits instead).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
MANIFEST = HERE / "modelcheck.json"
WORKDIR = ROOT / "build" / "modelcheck"


def _load_promela():
    spec = importlib.util.spec_from_file_location("atmostonce_promela", HERE / "promela.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    sys.modules.setdefault("atmostonce_promela", mod)
    spec.loader.exec_module(mod)
    return mod


promela = _load_promela()

# cpp flags per configuration of the one generated model, in the order they run; each configuration is
# a module of spec/promela_gen/configurations/ (its docstring says what it adds): main (two workers,
# sweeper, reconciler, operator with 2 moves, clock, transport, platform), text (plus another intent of
# the same account with the same text), restore (plus a database backup and a restore from it), claims
# (two approval-gated intents sharing one target: its claim row, approvals, the couplings)
CONFIGURATIONS: dict[str, tuple[str, ...]] = {c.NAME: tuple(c.FLAGS) for c in promela.CONFIGURATIONS}
# ablations try the cheaper configurations first
ABLATION_ORDER = ("text", "main", "restore")
# guards that are always true without a restore (every lease, plan and attempt carries the one
# restore epoch there, so the ablated model of the other configurations is the model proper):
# their ablations run in the restore configuration only
RESTORE_GUARDS = ("restore_epoch_current", "absence_provable")
# the guards of the claim and approval machines: they exist in the claims configuration only
CLAIM_MACHINES = ("claim", "approval")
# the vacuity check (every event fires) runs here: every event can fire in it, and it is cheap
COVERAGE_CONFIGURATION = "text"

# explorations: configurations that break an assumption of the model on purpose; the
# counterexample is expected and recorded (docs/formal.md)
EXPLORATIONS: dict[str, tuple[tuple[str, ...], str]] = {
    "restore_anytime": (
        ("-DRESTORES", "-DOPERATOR_MOVES=1", "-DCUT_AT_BOUND", "-DRESTORE_ANYTIME"),
        "the restore configuration without its procedure step 'wait out every send lease issued "
        "before the restore': a worker between its authorization and its send puts bytes on the wire "
        "after the restore (docs/formal.md)",
    ),
}

# platform ablations: the platform breaks its side of the contract a guard relies on; each must yield a
# counterexample (docs/formal.md, docs/design.md "A fence is a tombstone")
PLATFORM_ABLATIONS: dict[str, tuple[str, tuple[str, ...], str]] = {
    "no_tombstone": (
        "text",
        ("-DNO_TOMBSTONE",),
        "the platform fences only what had arrived: a fenced not-found leaves no tombstone, so a create "
        "still in the network when the lookup answered arrives afterwards and lands beside the retry",
    ),
}

# guards whose removal cannot show at this abstraction level, with the reason
NOT_CAUGHT: dict[str, str] = {
    "approval_signature_verified": (
        "the model has no database writer who forges an approval: every approval in it is made by its "
        "authenticated approver, so the signature check holds for each and removing it changes nothing "
        "here; a forged or unsigned row is refused by the tests on SQLite and PostgreSQL instead "
        "(docs/design.md#signed-approvals)"
    ),
    "approval_covers_intent_bytes": (
        "every approval in the model is of the intent's own bytes (record_approval copies the intent's "
        "digest): an approval of other bytes is not a move the model makes; the tests on SQLite and "
        "PostgreSQL refuse one"
    ),
    "intent_awaiting_approval": (
        "an approval given while the intent is not queued authorizes nothing by itself: a send still "
        "needs the intent back in the queue and every dispatch guard of that later move, so no property "
        "of the model (each about sends and records) can break; the rule keeps a person from approving "
        "what may already be out, and the tests on SQLite and PostgreSQL refuse such an approval"
    ),
    "withdrawal_attributable": (
        "a withdrawal's reason is not part of the model, and a withdrawal only ever stops a send: "
        "removing the attribution rule cannot add an effect; the tests on both databases cover it"
    ),
}

# partial ablations, to show that each placement and each clause of a guard matters: a guard removed
# from some events only ("keep": the events it stays on), or one clause of its Promela translation
# removed from every event ("clause": the rendered text, dropped with the `&&` before it)
PARTIAL_ABLATIONS: dict[str, dict[str, Any]] = {
    "restore_epoch_current@completing_writes": {
        "guard": "restore_epoch_current",
        "keep": ("authorize_dispatch",),
        "configuration": "restore",
        "what": "the epoch fence kept on the authorizing write only: a straggler past its send records "
        "an outcome on the restored attempt, whose token and generation still match (docs/formal.md, F3)",
    },
    "plan_unchanged@without_epoch": {
        "guard": "plan_unchanged",
        "clause": "pl_rep == repoch",
        "configuration": "restore",
        "what": "plans compared on generation and reconcile count only: a plan from before the restore "
        "matches the restored row and records what it found there (docs/formal.md, F2)",
    },
}

# full searches are compiled with -O2 (gcc takes ~5 s, pan runs ~1.7x faster); searches that are
# expected to stop at an early counterexample with -O0 (gcc takes ~1 s). Neither changes the counts.
PAN_RUN = ("-m100000",)
GCC = ("gcc", "-w", "-DSAFETY", "-DMEMLIM=12288")
FULL = ("-O2", "-w24")
# the restore configuration stores tens of millions of states: pan compresses each stored state
# (-DCOLLAPSE, lossless: the same states and counts, about a third of the memory, somewhat slower)
RESTORE_GCC = ("-DCOLLAPSE",)


def gcc_for(spin_flags: Sequence[str]) -> tuple[str, ...]:
    """The compile flags a model's configuration adds to :data:`GCC`."""
    return RESTORE_GCC if "-DRESTORES" in spin_flags else ()


SHORT = ("-O0", "-w22")


class ToolMissing(RuntimeError):
    pass


@dataclass
class PanResult:
    errors: int
    states_stored: int
    transitions: int
    depth: int
    seconds: float
    violated: str | None = None  # the property (P..) named in the first failed assertion
    assertion: str | None = None
    truncated: bool = False
    trail: list[str] = field(default_factory=list)

    def counts(self) -> dict[str, Any]:
        return {
            "errors": self.errors,
            "states_stored": self.states_stored,
            "transitions": self.transitions,
            "depth": self.depth,
        }


def tools() -> dict[str, str]:
    """Versions of spin and gcc; raises :class:`ToolMissing`."""
    out = {}
    for tool, args in (("spin", ("-V",)), ("gcc", ("--version",))):
        if shutil.which(tool) is None:
            raise ToolMissing(f"{tool} is not installed (apt-get install -y spin gcc)")
        first = subprocess.run([tool, *args], capture_output=True, text=True, check=False).stdout.splitlines()
        out[tool] = first[0].strip() if first else "?"
    return out


_NUM = r"([0-9.e+]+)"


def parse_pan(report: str) -> PanResult:
    """Read a ``pan`` report; raises ``ValueError`` if it is not one."""

    def grab(pattern: str) -> float:
        m = re.search(pattern, report)
        if m is None:
            raise ValueError(f"pan report lacks {pattern!r}:\n{report[-2000:]}")
        return float(m.group(1))

    m = re.search(r"assertion violated (.*?) \(at depth", report)
    assertion = m.group(1).strip() if m else None
    violated = None
    if assertion:
        names = re.findall(r"\b(P\d+_\w+|BOUND_\w+)", assertion)
        violated = names[0] if names else assertion
    elif "invalid end state" in report and "errors: 0" not in report:
        violated = "invalid end state"
    return PanResult(
        errors=int(grab(r"errors: (\d+)")),
        states_stored=int(grab(_NUM + r" states, stored")),
        transitions=int(grab(_NUM + r" transitions \(= stored\+matched\)")),
        depth=int(grab(r"depth reached (\d+)")),
        seconds=grab(r"pan: elapsed time " + _NUM),
        violated=violated,
        assertion=assertion,
        # a search cut short without an error (depth, memory, the -DMEMLIM bound): not exhaustive
        truncated="max search depth too small" in report
        or "out of memory" in report
        or "reached -DMEMLIM bound" in report
        or ("Search not completed" in report and "errors: 0" in report),
    )


def trimmed_trail(text: str) -> list[str]:
    """The event lines of a ``spin -t -p`` replay: ``step N  <what happened>``, then the failed assertion."""
    lines = text.splitlines()
    out: list[str] = []
    failed: list[str] = []
    for i, line in enumerate(lines):
        s = line.strip()
        if s.startswith("MSC: "):
            step = ""
            for nxt in lines[i + 1 : i + 4]:
                m = re.match(r"\s*(\d+):\s+proc ", nxt)
                if m:
                    step = m.group(1)
                    break
            out.append(f"{step:>4}  {s[5:]}")
        elif s.startswith("spin: text of failed assertion:"):
            failed.append("      " + s[len("spin: text of ") :])
    return out + failed


def _is_property(violated: str | None) -> bool:
    """A counterexample counts only when it breaks a named property (P..), not a bound or an end state."""
    return violated is not None and re.fullmatch(r"P\d+_\w+", violated) is not None


def check_one(
    name: str, model: str, flags: Sequence[str], workdir: Path, *, full: bool = True, bfs: bool = False
) -> PanResult:
    """spin -a, gcc, ./pan for one model text; replays a counterexample with spin -t -p.

    ``bfs``: breadth-first search, so that a counterexample is a shortest one (for the docs).
    """
    d = workdir / name.replace("/", "__")
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    (d / "model.pml").write_text(model, "utf-8")

    def run(cmd: Sequence[str]) -> subprocess.CompletedProcess:
        # no timeout: a slow machine makes a search slow, not wrong (pan stops at its -m and MEMLIM bounds)
        return subprocess.run(list(cmd), cwd=d, capture_output=True, text=True, check=False)

    p = run(["spin", *flags, "-a", "model.pml"])
    if p.returncode != 0:
        raise RuntimeError(f"{name}: spin -a failed:\n{p.stdout}{p.stderr}")
    opt, hash_size = FULL if full else SHORT
    p = run([*GCC, *gcc_for(flags), opt, *(["-DBFS"] if bfs else []), "-o", "pan", "pan.c"])
    if p.returncode != 0:
        raise RuntimeError(f"{name}: gcc failed:\n{p.stderr[-3000:]}")
    p = run(["./pan", *PAN_RUN, hash_size])
    (d / "pan.out").write_text(p.stdout + p.stderr, "utf-8")
    res = parse_pan(p.stdout)
    if res.errors and (d / "model.pml.trail").exists():
        t = run(["spin", *flags, "-t", "-p", "model.pml"])
        (d / "trail.txt").write_text(t.stdout, "utf-8")
        res.trail = trimmed_trail(t.stdout)
    return res


# ------------------------------------------------------------------------------------ the jobs
@dataclass
class Outcome:
    kind: str  # configuration / ablation / broken / exploration
    name: str
    ok: bool
    record: dict[str, Any]
    problems: list[str] = field(default_factory=list)


def _record(res: PanResult, config: str, flags: Sequence[str], trail: bool = False) -> dict[str, Any]:
    rec: dict[str, Any] = {"configuration": config, "flags": list(flags), **res.counts(), "seconds": res.seconds}
    if res.violated:
        rec["caught_by"] = res.violated
    if trail:
        rec["trail"] = res.trail
    return rec


def job_configuration(table, name: str, workdir: Path) -> Outcome:
    flags = CONFIGURATIONS[name]
    res = check_one(f"model/{name}", promela.generate(table), flags, workdir)
    problems = []
    if res.errors:
        problems.append(f"{res.violated}: {res.assertion}\n" + "\n".join(res.trail))
    if res.truncated:
        problems.append("the search was truncated (depth or memory): raise -m or MEMLIM")
    return Outcome("configuration", name, not problems, _record(res, name, flags, trail=bool(res.errors)), problems)


def _semantics(model: str) -> str:
    """The model text without what an ablation changes but Spin does not run: the ablation note in the
    header comment and the `(true)` conjuncts of guards the model renders as always true."""
    lines = [line for line in model.splitlines() if "ABLATION: guard" not in line]
    return "\n".join(lines).replace("(true) &&", "").replace("&& (true)", "").replace(" ", "")


def job_ablation(table, guard: str, workdir: Path) -> Outcome:
    model = promela.generate(table, drop_guard=guard)
    tried = []
    res = None
    configs = ("restore",) if guard in RESTORE_GUARDS else ABLATION_ORDER
    if guard in claim_guards():
        configs = ("claims",)
    if guard in NOT_CAUGHT and _semantics(model) == _semantics(promela.generate(table)):
        # the guard has no Promela translation (it is rendered as `true`): the ablated model is the
        # checked model itself, whose search the configurations record; searching it again proves nothing
        config = configs[-1]
        rec = {
            "configuration": config,
            "flags": list(dict.fromkeys((*CONFIGURATIONS[config], "-DCUT_AT_BOUND"))),
            "errors": 0,
            "identical_to_checked_model": True,
            "not_caught_reason": NOT_CAUGHT[guard],
        }
        return Outcome("ablation", guard, True, rec)
    for config in configs:
        flags = tuple(dict.fromkeys((*CONFIGURATIONS[config], "-DCUT_AT_BOUND")))
        # -O2 where the search is long: a full one (not caught), or the claims configuration, where a
        # counterexample may come only after millions of states
        full = guard in NOT_CAUGHT or config == "claims"
        res = check_one(f"ablation/{guard}/{config}", model, flags, workdir, full=full)
        tried.append(config)
        if res.errors:
            break
    assert res is not None
    rec = _record(res, tried[-1], flags)
    if guard in NOT_CAUGHT:
        rec["not_caught_reason"] = NOT_CAUGHT[guard]
        if res.errors:
            return Outcome(
                "ablation",
                guard,
                False,
                rec,
                [f"listed in NOT_CAUGHT but caught by {res.violated}: take it off the list"],
            )
        return Outcome("ablation", guard, True, rec)
    if not res.errors:
        return Outcome("ablation", guard, False, rec, [f"removing {guard!r} is not caught in {tried}"])
    if not _is_property(res.violated):
        return Outcome("ablation", guard, False, rec, [f"the counterexample breaks no named property: {res.violated}"])
    return Outcome("ablation", guard, True, rec)


def job_partial_ablation(table, name: str, workdir: Path) -> Outcome:
    import dataclasses
    from types import MappingProxyType

    spec = PARTIAL_ABLATIONS[name]
    guard, config = spec["guard"], spec["configuration"]
    keep, clause = spec.get("keep"), spec.get("clause")
    if keep is not None:
        events = {
            n: e if n in keep else dataclasses.replace(e, guards=tuple(g for g in e.guards if g != guard))
            for n, e in table.events.items()
        }
        table = dataclasses.replace(table, events=MappingProxyType(events))
    model = promela.generate(table, note=f"PARTIAL ABLATION: {name}")
    if clause is not None:
        cut = model.replace(f" && {clause}", "")
        if cut == model:
            raise RuntimeError(f"{name}: clause {clause!r} is not in the model")
        model = cut
    flags = tuple(dict.fromkeys((*CONFIGURATIONS[config], "-DCUT_AT_BOUND")))
    res = check_one(f"partial/{name}", model, flags, workdir, full=False)
    rec = _record(res, config, flags, trail=True)
    rec["what"] = spec["what"]
    if not res.errors:
        return Outcome("partial", name, False, rec, [f"the partial ablation {name} is not caught"])
    if not _is_property(res.violated):
        return Outcome("partial", name, False, rec, [f"the counterexample breaks no named property: {res.violated}"])
    return Outcome("partial", name, True, rec)


def job_broken(table, workdir: Path) -> Outcome:
    broken = promela.broken_retry_on_unknown(table)
    model = promela.generate(broken, extra_evidence=promela.BROKEN_EVIDENCE, note="BROKEN ON PURPOSE: retry on unknown")
    flags = ("-DCUT_AT_BOUND",)
    res = check_one("broken/retry_on_unknown", model, flags, workdir, full=False, bfs=True)
    rec = _record(res, "main", flags, trail=True)
    rec["edge"] = "retry_unknown: a worker moves indeterminate -> pending"
    # the same model with only P1 switched on: the duplicate the broken edge leads to
    flags1 = (*flags, "-DCHECK=1")
    dup = check_one("broken/retry_on_unknown-P1", model, flags1, workdir, full=False, bfs=True)
    rec["duplicate"] = _record(dup, "main", flags1, trail=True)
    problems = []
    if not res.errors:
        problems.append("the broken configuration was not caught")
    if dup.violated != "P1_at_most_one_effect":
        problems.append(f"with only P1 on, expected a duplicate effect, got {dup.violated!r}")
    return Outcome("broken", "retry_on_unknown", not problems, rec, problems)


def job_broken_claims(table, workdir: Path) -> Outcome:
    """The broken claims configuration: recording an unknown outcome frees the target's claim."""
    broken = promela.broken_claim_freed_on_unknown(table)
    model = promela.generate(broken, note="BROKEN ON PURPOSE: the claim is freed on an unknown outcome")
    flags = CONFIGURATIONS["claims"]
    res = check_one("broken/claim_freed_on_unknown", model, flags, workdir, full=False, bfs=True)
    rec = _record(res, "claims", flags, trail=True)
    rec["edge"] = "read_back_failed (authorized -> indeterminate) couples the claim's settle (sending -> free)"
    problems = []
    if res.violated != "P11_sending_claim_freed_only_when_settled":
        problems.append(f"expected P11 to catch the broken coupling, got {res.violated!r}")
    return Outcome("broken", "claim_freed_on_unknown", not problems, rec, problems)


def job_exploration(table, name: str, workdir: Path) -> Outcome:
    flags, what = EXPLORATIONS[name]
    # breadth-first: the trail is a shortest one (for the docs)
    res = check_one(f"exploration/{name}", promela.generate(table), flags, workdir, full=False, bfs=True)
    rec = _record(res, name, flags, trail=True)
    rec["what"] = what
    # with only P1 switched on: whether dropping the assumption leads to a duplicate effect
    # (depth-first: a breadth-first search for it stores some 9 million states)
    flags1 = (*flags, "-DCHECK=1")
    dup = check_one(f"exploration/{name}-P1", promela.generate(table), flags1, workdir, full=False)
    rec["duplicate"] = _record(dup, name, flags1, trail=True)
    if not res.errors:
        return Outcome("exploration", name, False, rec, ["the exploration found no counterexample any more"])
    return Outcome("exploration", name, True, rec)


def never_fired(model: str, pan_report: str) -> list[str]:
    """Events whose move never happens: every call site's final ``ok = 1`` is unreached.

    ``model`` must come from ``promela.generate(..., coverage=True)`` (events as ``atomic``
    sequences, so pan reports their statements one by one).
    """
    lines = model.splitlines()
    spans: list[tuple[int, int, str]] = []
    for i, line in enumerate(lines, start=1):
        m = re.match(r"inline ev_(\w+)\(\) \{", line)
        if m:
            end = next(j for j in range(i, len(lines) + 1) if lines[j - 1] == "}")
            spans.append((i, end, m.group(1)))
    unreached: dict[str, int] = {}
    for m in re.finditer(r"model\.pml:(\d+), state \d+, \"ok = 1\"", pan_report):
        n = int(m.group(1))
        for lo, hi, name in spans:
            if lo <= n <= hi:
                unreached[name] = unreached.get(name, 0) + 1
    out = []
    for _, _, name in spans:
        calls = len(re.findall(rf"\bev_{name}\(\);", model))
        if calls == 0 or unreached.get(name, 0) >= calls:
            out.append(name)
    return out


def job_coverage(table, workdir: Path) -> Outcome:
    """Vacuity check: every table event's move happens somewhere in the checked model."""
    config = COVERAGE_CONFIGURATION
    flags = CONFIGURATIONS[config]
    model = promela.generate(table, coverage=True)
    res = check_one("coverage", model, flags, workdir)
    report = (workdir / "coverage" / "pan.out").read_text("utf-8")
    silent = never_fired(model, report)
    rec = _record(res, config, flags)
    rec["never_fired"] = {e: _why_silent(table, e) for e in silent}
    problems = [f"event {e!r} never fires in the {config} configuration" for e in silent if not _why_silent(table, e)]
    if res.errors:
        problems.append(f"{res.violated}: {res.assertion}")
    return Outcome("coverage", config, not problems, rec, problems)


def _why_silent(table, event: str) -> str:
    """Events allowed to stay silent in the checked configurations, with the reason ('' = none)."""
    ev = table.events.get(event)
    if ev is not None and "fence_restore" in ev.effects:
        return "declared only after a database restore: exercised by the restore configuration (-DRESTORES)"
    return ""


# ------------------------------------------------------------------------------------ manifest
def job_platform_ablation(table, name: str, workdir: Path) -> Outcome:
    config, extra, what = PLATFORM_ABLATIONS[name]
    flags = tuple(dict.fromkeys((*CONFIGURATIONS[config], "-DCUT_AT_BOUND", *extra)))
    model = promela.generate(table)
    res = check_one(f"platform/{name}", model, flags, workdir, full=False, bfs=True)
    rec = _record(res, config, flags, trail=True)
    rec["what"] = what
    flags1 = (*flags, "-DCHECK=1")
    dup = check_one(f"platform/{name}-P1", model, flags1, workdir, full=False)
    rec["duplicate"] = _record(dup, config, flags1, trail=True)
    problems = []
    if not res.errors:
        problems.append(f"the platform ablation {name} is not caught")
    elif not _is_property(res.violated):
        problems.append(f"the counterexample breaks no named property: {res.violated}")
    if dup.violated != "P1_at_most_one_effect":
        problems.append(f"with only P1 on, expected a duplicate effect, got {dup.violated!r}")
    return Outcome("platform", name, not problems, rec, problems)


def _compare(kind: str, name: str, got: dict[str, Any], want: dict[str, Any] | None) -> list[str]:
    if want is None:
        return [f"{kind} {name}: not in the manifest (run with --write)"]
    out = []
    for k in (
        "errors",
        "states_stored",
        "transitions",
        "depth",
        "caught_by",
        "configuration",
        "flags",
        "identical_to_checked_model",
    ):
        if got.get(k) != want.get(k):
            out.append(f"{kind} {name}: {k} is {got.get(k)!r}, the manifest says {want.get(k)!r}")
    if "never_fired" in got and got["never_fired"] != want.get("never_fired"):
        out.append(f"{kind} {name}: events that never fire {got['never_fired']} vs {want.get('never_fired')}")
    if "duplicate" in got:
        out += _compare(kind, f"{name} (P1 only)", got["duplicate"], want.get("duplicate"))
    return out


def build_manifest(outcomes: list[Outcome], tool_versions: dict[str, str], table, seconds: float) -> dict[str, Any]:
    b = promela.Bounds()
    kinds = ("configuration", "coverage", "ablation", "partial", "platform", "broken", "exploration")
    by = {k: {o.name: o.record for o in outcomes if o.kind == k} for k in kinds}
    return {
        "generated_by": "python spec/modelcheck.py --write",
        "spin": tool_versions.get("spin", "?"),
        "table": f"{table.name} {table.version}",
        "bounds": {
            "workers": b.workers,
            "intents": 1,  # two in the text configuration (OTHER_INTENT), two in claims (below)
            "max_attempts": b.max_attempts,
            "max_reconciles": b.max_reconciles,
            "operator_moves": b.operator_moves,
            "request_slots": b.request_slots,
            "claims": {
                "intents": promela.CLAIMS_INTENTS,
                "approvals": promela.CLAIMS_APPROVALS,
                "attempts": promela.CLAIMS_ATTEMPTS,
                "claim_takes": promela.CLAIMS_TAKES,
                "operator_moves": 1,
            },
            "pan": " ".join(PAN_RUN),
            "gcc": " ".join(GCC[1:]),
            "full_search": " ".join(FULL),
            "restore_gcc": " ".join(RESTORE_GCC),
            "short_search": " ".join(SHORT),
        },
        "properties": dict(promela.PROPERTIES),
        "configurations": by["configuration"],
        "coverage": by["coverage"],
        "ablations": by["ablation"],
        "partial_ablations": by["partial"],
        "platform_ablations": by["platform"],
        "not_caught": dict(NOT_CAUGHT),
        "broken": by["broken"],
        "explorations": by["exploration"],
        "runtime_seconds": round(seconds, 1),
    }


def compare_manifest(got: dict[str, Any], want: dict[str, Any]) -> list[str]:
    out = []
    if got["spin"] != want.get("spin"):
        out.append(f"spin is {got['spin']!r}, the manifest was recorded with {want.get('spin')!r}")
    if got["bounds"] != want.get("bounds"):
        out.append(f"bounds differ from the manifest: {got['bounds']} vs {want.get('bounds')}")
    for section, kind in (
        ("configurations", "configuration"),
        ("coverage", "coverage"),
        ("ablations", "ablation"),
        ("partial_ablations", "partial"),
        ("platform_ablations", "platform"),
        ("broken", "broken"),
        ("explorations", "exploration"),
    ):
        for name, rec in got[section].items():
            out += _compare(kind, name, rec, want.get(section, {}).get(name))
        for name in set(want.get(section, {})) - set(got[section]):
            out.append(f"{kind} {name}: in the manifest but not run")
    if got["not_caught"] != want.get("not_caught"):
        out.append("the NOT_CAUGHT list differs from the manifest")
    return out


def runtime_warning(got: float, want: float | None) -> str | None:
    """A warning when the run took more than three times the recorded runtime plus a minute, else None.

    Only ever printed: the state counts decide, and a loaded machine is no failure."""
    if want is None or got <= 3 * want + 60:
        return None
    return f"WARNING: runtime {got:.0f}s is far above the recorded {want}s (a loaded machine?); not a failure"


# the wall clock main() measures the run with (a seam for the tests)
_clock = time.monotonic


# ------------------------------------------------------------------------------------ main
def plan(table, *, only: str | None = None, guards: Sequence[str] | None = None) -> list[Callable[[Path], Outcome]]:
    """The jobs, longest first (the outcomes are reported in a fixed order whatever the order of running)."""
    long: list[Callable[[Path], Outcome]] = []
    short: list[Callable[[Path], Outcome]] = []
    if only in (None, "model"):
        long += [lambda wd, n=n: job_configuration(table, n, wd) for n in CONFIGURATIONS]
        long.append(lambda wd: job_coverage(table, wd))
    if only in (None, "ablations"):
        for g in guards or all_guards(table):
            (long if g in NOT_CAUGHT else short).append(lambda wd, g=g: job_ablation(table, g, wd))
        if not guards:
            short += [lambda wd, n=n: job_partial_ablation(table, n, wd) for n in PARTIAL_ABLATIONS]
            short += [lambda wd, n=n: job_platform_ablation(table, n, wd) for n in PLATFORM_ABLATIONS]
    if only in (None, "broken"):
        short += [lambda wd, n=n: job_exploration(table, n, wd) for n in EXPLORATIONS]
        short.append(lambda wd: job_broken(table, wd))
        short.append(lambda wd: job_broken_claims(table, wd))
    return long + short


def run_jobs(jobs: list[Callable[[Path], Outcome]], workdir: Path, parallel: int) -> list[Outcome]:
    workdir.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as ex:
        return list(ex.map(lambda j: j(workdir), jobs))


def claim_guards() -> list[str]:
    """The guards of the claim and approval machines (ablated in the claims configuration)."""
    from atmostonce.table import machine

    return [g for m in CLAIM_MACHINES for g in machine(m).guards]


def all_guards(table) -> list[str]:
    """Every guard an ablation removes: the intent table's, then the claim and approval machines'."""
    return [*table.guards, *claim_guards()]


def _table():
    from atmostonce.table import load_table

    return load_table(promela.TABLE_PATH)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python spec/modelcheck.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="record spec/modelcheck.json instead of comparing")
    ap.add_argument("--only", choices=("model", "ablations", "broken"), help="run one part (no manifest compare)")
    ap.add_argument("--guard", action="append", help="ablate only this guard (repeatable; implies --only ablations)")
    ap.add_argument("--jobs", type=int, default=int(os.environ.get("MODELCHECK_JOBS", "2")))
    ap.add_argument("--workdir", type=Path, default=WORKDIR)
    args = ap.parse_args(argv)

    try:
        versions = tools()
    except ToolMissing as exc:
        print(f"modelcheck: {exc}", file=sys.stderr)
        return 2
    table = _table()
    try:
        text = promela.default_model(table)
    except promela.GenerationError as exc:
        print(f"modelcheck: {exc}", file=sys.stderr)
        return 2
    if not promela.MODEL_PATH.exists() or promela.MODEL_PATH.read_text("utf-8") != text:
        print("modelcheck: spec/atmostonce.pml is stale: run `python spec/promela.py --write`", file=sys.stderr)
        return 2

    only = "ablations" if args.guard else args.only
    t0 = _clock()
    outcomes = run_jobs(plan(table, only=only, guards=args.guard), args.workdir, args.jobs)
    seconds = _clock() - t0
    kinds = ("configuration", "coverage", "ablation", "partial", "platform", "broken", "exploration")
    names = [*CONFIGURATIONS, *all_guards(table), *PARTIAL_ABLATIONS, *PLATFORM_ABLATIONS, *EXPLORATIONS]
    outcomes.sort(key=lambda o: (kinds.index(o.kind), names.index(o.name) if o.name in names else 0))

    rc = 0
    for o in outcomes:
        r = o.record
        what = r.get("caught_by") or "no error"
        print(
            f"{'ok ' if o.ok else 'BAD'} {o.kind:13} {o.name:24} {r['configuration']:8} "
            f"{what:38} states {r.get('states_stored', '-'):>9} transitions {r.get('transitions', '-'):>10} "
            f"depth {r.get('depth', '-'):>4} {r.get('seconds', 0.0):>6.2f}s"
        )
        for p in o.problems:
            print("    " + p.replace("\n", "\n    "))
        rc |= 0 if o.ok else 1
    print(f"total {seconds:.1f}s with {args.jobs} parallel jobs ({versions['spin']})")

    if only is not None:
        return rc
    manifest = build_manifest(outcomes, versions, table, seconds)
    if args.write:
        MANIFEST.write_text(json.dumps(manifest, indent=2) + "\n", "utf-8")
        print(f"wrote {MANIFEST}")
        return rc
    if not MANIFEST.exists():
        print("modelcheck: no spec/modelcheck.json: run with --write", file=sys.stderr)
        return 1
    want = json.loads(MANIFEST.read_text("utf-8"))
    diffs = compare_manifest(manifest, want)
    for d in diffs:
        print("MANIFEST " + d)
    warning = runtime_warning(seconds, want.get("runtime_seconds"))
    if warning is not None:  # wall time is a warning, never a failure
        print(warning)
    if diffs:
        rc = 1
    elif rc == 0:
        print("matches spec/modelcheck.json")
    return rc


if __name__ == "__main__":
    sys.exit(main())
