"""The Spin model is generated from the table, and the model check bites (docs/formal.md).

Fast tests need no Spin: the committed model equals the generator's output for the current table,
every name in the table has a translation (and a missing one fails loudly), the manifest accounts
for every guard, and the report parsers read real pan output. The ``spin`` tests run Spin (in `make model-check`): the
model has no counterexample, one guard ablation and the broken configuration are caught.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import sys
from pathlib import Path
from types import MappingProxyType

import pytest

from atmostonce.table import Event, Guard, load_table, machine

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"


def _load(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


promela = _load("atmostonce_promela", SPEC / "promela.py")
modelcheck = _load("atmostonce_modelcheck", SPEC / "modelcheck.py")
# the Promela guard registry (spec/promela_gen/guards.py; loading spec/promela.py puts spec/ on the path)
guard_registry = importlib.import_module("promela_gen.guards")


@pytest.fixture(scope="module")
def table():
    return load_table(SPEC / "table.toml")


@pytest.fixture(scope="module")
def manifest():
    return json.loads((SPEC / "modelcheck.json").read_text("utf-8"))


# ------------------------------------------------------------------------------ generation
def test_committed_model_equals_the_generator_output(table):
    assert (SPEC / "atmostonce.pml").read_text("utf-8") == promela.generate(table), (
        "spec/atmostonce.pml is stale: run `python spec/promela.py --write`"
    )


def test_check_cli_agrees():
    assert promela.main(["--check"]) == 0


def test_every_state_event_and_guard_of_the_table_is_in_the_model(table):
    text = promela.generate(table)
    assert re.search(r"mtype:state = \{ " + ", ".join(table.states) + r" \}", text)
    for ev in table.events.values():
        if not ev.creates:
            assert f"inline ev_{ev.name}()" in text, ev.name
    for g in table.guards:
        assert g in guard_registry.PROMELA_GUARDS, g
    # every guard's expression appears in the enabling condition of every event that uses it
    for ev in table.events.values():
        body = text.split(f"inline ev_{ev.name}() {{")[1].split("->")[0] if not ev.creates else ""
        for g in ev.guards:
            binding = promela.ACTOR_ARGS[ev.actor]
            assert "(" + guard_registry.PROMELA_GUARDS[g].format_map(dict(binding)) + ")" in body, (ev.name, g)


def test_promela_guards_cover_exactly_the_catalogue(table):
    """Every guard of spec/table.toml has one Promela translation in each configuration, and nothing else has."""
    assert set(guard_registry.PROMELA_GUARDS) == set(table.guards)
    assert set(guard_registry.CLAIMS_INTENT_GUARDS) == set(table.guards)


def test_promela_claim_and_approval_guards_cover_exactly_the_machine_catalogues():
    assert set(guard_registry.CLAIM_PROMELA_GUARDS) == set(machine("claim").guards)
    assert set(guard_registry.APPROVAL_PROMELA_GUARDS) == set(machine("approval").guards)


def test_each_configuration_module_carries_the_flags_the_manifest_was_checked_with(manifest):
    assert [c.NAME for c in promela.CONFIGURATIONS] == list(manifest["configurations"])
    for c in promela.CONFIGURATIONS:
        assert manifest["configurations"][c.NAME]["flags"] == list(c.FLAGS), c.NAME


def test_a_template_placeholder_without_a_value_fails_loudly():
    base = importlib.import_module("promela_gen.base")
    with pytest.raises(promela.GenerationError, match="left_open"):
        base.render("restore", backup_decls="", take_backup="", do_restore="", clear_backup="")
    with pytest.raises(promela.GenerationError, match="stray"):
        base.render("text", stray="x")


def _with_guard(table, name: str):
    guards = {**table.guards, name: Guard(name=name, meaning="new", seed="test")}
    ev = dataclasses.replace(table.events["begin"], guards=(*table.events["begin"].guards, name))
    return dataclasses.replace(
        table, guards=MappingProxyType(guards), events=MappingProxyType({**table.events, "begin": ev})
    )


def test_a_guard_without_a_translation_fails_loudly(table):
    with pytest.raises(promela.GenerationError, match="brand_new_guard"):
        promela.generate(_with_guard(table, "brand_new_guard"))


def test_an_effect_event_outcome_or_actor_without_a_translation_fails_loudly(table):
    eff = dataclasses.replace(table, effects=MappingProxyType({**table.effects, "teleport": table.effects["create"]}))
    with pytest.raises(promela.GenerationError, match="teleport"):
        promela.generate(eff)
    ev = Event("shrug", "worker", ("pending",), "pending", (), (), "test")
    with pytest.raises(promela.GenerationError, match="shrug"):
        promela.generate(dataclasses.replace(table, events=MappingProxyType({**table.events, "shrug": ev})))
    mascot = dataclasses.replace(table.actors["worker"], name="mascot")
    with pytest.raises(promela.GenerationError, match="mascot"):
        promela.generate(dataclasses.replace(table, actors=MappingProxyType({**table.actors, "mascot": mascot})))
    send = dataclasses.replace(table.outcomes["send.unknown"], name="send.maybe")
    with pytest.raises(promela.GenerationError, match="send.maybe"):
        promela.generate(dataclasses.replace(table, outcomes=MappingProxyType({**table.outcomes, "send.maybe": send})))


def test_an_ablation_removes_exactly_that_guard_from_the_conditions(table):
    full = promela.generate(table)
    for g in table.guards:
        ablated = promela.generate(table, drop_guard=g)
        assert ablated != full
        assert f"[ABLATED: {g} removed]" in ablated
        users = [e for e in table.events.values() if g in e.guards]
        for ev in users:
            cond = ablated.split(f"inline ev_{ev.name}() {{")[1].split(" ->\n")[0]
            expr = "(" + guard_registry.PROMELA_GUARDS[g].format_map(dict(promela.ACTOR_ARGS[ev.actor])) + ")"
            assert expr not in cond, (g, ev.name)
    with pytest.raises(promela.GenerationError):
        promela.generate(table, drop_guard="no_such_guard")


def test_the_broken_configuration_adds_a_machine_edge_out_of_the_unknown_state(table):
    broken = promela.broken_retry_on_unknown(table)
    ev = broken.events["retry_unknown"]
    assert not broken.actors[ev.actor].human
    assert broken.states[ev.sources[0]].kind == "unknown" and ev.target == broken.initial
    assert "inline ev_retry_unknown()" in promela.generate(broken, extra_evidence=promela.BROKEN_EVIDENCE)


# ------------------------------------------------------------------------------ claims configuration
@pytest.fixture(scope="module")
def claim_t():
    return machine("claim")


@pytest.fixture(scope="module")
def approval_t():
    return machine("approval")


def _claims_part(text: str) -> str:
    return text.split("#ifdef CLAIMS\n")[1].split("#else /* not CLAIMS")[0]


def test_the_claims_configuration_has_the_states_of_all_three_machines(table, claim_t, approval_t):
    part = _claims_part(promela.generate(table))
    for name, m in (("state", table), ("claim", claim_t), ("approval", approval_t)):
        assert re.search(rf"mtype:{name} = \{{ " + ", ".join(m.states) + r" \}", part), name
    for g in (*claim_t.guards, *approval_t.guards):
        assert g in promela.CLAIM_GUARDS_PML, g
    for g in table.guards:
        assert g in promela.CLAIMS_INTENT_GUARDS, g


def test_every_coupling_of_the_table_moves_the_claim_in_the_same_step(table, claim_t, approval_t):
    part = _claims_part(promela.generate(table))
    for ev in table.events.values():
        if ev.creates:
            continue
        body = part.split(f"inline ci_{ev.name}() {{")[1].split("\n}\n")[0]
        cev_name = ev.couples.get("claim")
        if cev_name is None:
            assert "c_st = " not in body, ev.name
            continue
        cev = claim_t.events[cev_name]
        assert f"c_st = {cev.target};" in body, ev.name
        cond = body.split(" ->\n")[0]
        binding = {
            **promela.CLAIMS_ACTOR_ARGS[ev.actor],
            "intent_initial": table.initial,
            "approval_live": approval_t.initial,
        }
        for g in cev.guards:
            assert "(" + promela.CLAIM_GUARDS_PML[g].format_map(binding) + ")" in cond, (ev.name, g)
        # optional couplings apply only to a claim bound to the intent; a required one always
        optional = "(!(c_key == k && " in cond
        assert optional == ("claim" not in ev.couples_required), ev.name
        for aev_name in cev.couples.values():
            assert f"a_st[ap] = {approval_t.events[aev_name].target};" in body, ev.name
    # the claim events nobody couples are the worker's own calls
    coupled = {e.couples["claim"] for e in table.events.values() if "claim" in e.couples}
    for cev in claim_t.events.values():
        assert (f"inline cc_{cev.name}()" in part) == (cev.name not in coupled), cev.name


def test_an_untranslated_claim_guard_or_coupling_fails_loudly(table, claim_t, approval_t):
    ev = claim_t.events["reserve"]
    odd = dataclasses.replace(
        claim_t,
        guards=MappingProxyType({**claim_t.guards, "moon_phase": Guard(name="moon_phase", meaning="x", seed="t")}),
        events=MappingProxyType(
            {**claim_t.events, "reserve": dataclasses.replace(ev, guards=(*ev.guards, "moon_phase"))}
        ),
    )
    with pytest.raises(promela.GenerationError, match="moon_phase"):
        promela.generate_claims(table, odd, approval_t)
    auth = table.events["authorize_dispatch"]
    bad = dataclasses.replace(
        table,
        events=MappingProxyType(
            {**table.events, auth.name: dataclasses.replace(auth, couples=MappingProxyType({"claim": "teleport"}))}
        ),
    )
    with pytest.raises(promela.GenerationError, match="teleport"):
        promela.generate_claims(bad, claim_t, approval_t)


def test_a_claim_guard_ablation_changes_only_the_claims_configuration(table, claim_t):
    full = promela.generate(table)
    for g in modelcheck.claim_guards():
        ablated = promela.generate(table, drop_guard=g)
        assert ablated != full and "ABLATION: guard `" + g in ablated
        assert ablated.split("#else /* not CLAIMS")[1] == full.split("#else /* not CLAIMS")[1], g


# ------------------------------------------------------------------------------ manifest
def test_the_manifest_accounts_for_every_guard(table, manifest):
    assert set(manifest["ablations"]) == set(modelcheck.all_guards(table))
    for g, rec in manifest["ablations"].items():
        if g in modelcheck.NOT_CAUGHT:
            assert rec["errors"] == 0 and "caught_by" not in rec, g
            assert len(modelcheck.NOT_CAUGHT[g]) > 80  # a written reason
        else:
            assert rec["errors"] >= 1, g
            assert rec["caught_by"] in promela.PROPERTIES, (g, rec["caught_by"])
    assert manifest["not_caught"] == modelcheck.NOT_CAUGHT
    # only claim guards may be explained instead of caught, and only in the claims configuration
    assert set(modelcheck.NOT_CAUGHT) <= set(modelcheck.claim_guards())
    for g in modelcheck.claim_guards():
        assert manifest["ablations"][g]["configuration"] == "claims", g


def test_the_claims_configuration_is_checked_and_its_properties_are_caught(manifest):
    rec = manifest["configurations"]["claims"]
    assert rec["errors"] == 0 and rec["flags"] == ["-DCLAIMS"]
    caught = {
        r["caught_by"] for g, r in manifest["ablations"].items() if g in modelcheck.claim_guards() and "caught_by" in r
    }
    # P11 is held by the couplings of the table (no guard adds to it): the broken-coupling variant shows it bites
    assert caught == set(promela.CLAIM_PROPERTIES) - {"P11_sending_claim_freed_only_when_settled"}


def test_the_restore_guards_are_caught_in_the_restore_configuration(table, manifest):
    """The restore configuration is checked, and the guards that only matter after a
    restore are judged there (each without a counterexample in the model proper)."""
    assert manifest["configurations"]["restore"]["errors"] == 0
    assert "-DRESTORES" in manifest["configurations"]["restore"]["flags"]
    for g in modelcheck.RESTORE_GUARDS:
        assert g in table.guards
        assert manifest["ablations"][g]["configuration"] == "restore"
        assert manifest["ablations"][g]["caught_by"] in promela.PROPERTIES
    assert manifest["ablations"]["absence_provable"]["caught_by"] == "P1_at_most_one_effect"
    assert set(manifest["partial_ablations"]) == set(modelcheck.PARTIAL_ABLATIONS)
    for partial in manifest["partial_ablations"].values():
        assert partial["errors"] == 1 and partial["caught_by"] in promela.PROPERTIES
        assert any("database: restored" in line for line in partial["trail"])


def test_the_restore_exploration_shows_why_send_leases_are_waited_out(manifest):
    rec = manifest["explorations"]["restore_anytime"]
    assert "-DRESTORE_ANYTIME" in rec["flags"] and rec["errors"] == 1
    assert rec["duplicate"]["caught_by"] == "P1_at_most_one_effect"
    assert sum("lands" in line for line in rec["duplicate"]["trail"]) == 2


def test_the_manifest_records_a_clean_model_and_a_caught_broken_configuration(manifest):
    assert set(manifest["configurations"]) == set(modelcheck.CONFIGURATIONS)
    for name, rec in manifest["configurations"].items():
        assert rec["errors"] == 0, name
        assert rec["states_stored"] > 100_000, name
    broken = manifest["broken"]["retry_on_unknown"]
    assert broken["caught_by"] == "P3_unknown_never_resent_by_machine"
    assert broken["duplicate"]["caught_by"] == "P1_at_most_one_effect"
    assert any("retry_unknown" in line for line in broken["trail"])
    assert manifest["properties"] == dict(promela.PROPERTIES)
    assert manifest["table"] == f"{load_table(SPEC / 'table.toml').name} {load_table(SPEC / 'table.toml').version}"


def test_the_docs_show_the_recorded_broken_trails(manifest):
    """The counterexamples printed in docs/formal.md are the recorded ones, event line for event line."""
    doc = (ROOT / "docs" / "formal.md").read_text("utf-8")
    trails = [manifest["broken"]["retry_on_unknown"]["trail"], manifest["broken"]["claim_freed_on_unknown"]["trail"]]
    for trail in trails:
        events = [line for line in trail if not line.lstrip().startswith("failed assertion")]
        assert events and "\n".join(events) in doc, events[:3]


def test_the_docs_show_the_recorded_ablation_results(manifest):
    doc = (ROOT / "docs" / "formal.md").read_text("utf-8")
    ablations = doc.split("## Proof that it bites")[1].split("\n## ")[0]
    for g, rec in manifest["ablations"].items():
        row = next((line for line in ablations.splitlines() if line.startswith(f"| `{g}` |")), None)
        assert row is not None, f"docs/formal.md has no ablation row for {g}"
        assert rec.get("caught_by", "not caught") in row, (g, row)
    assert f"{manifest['configurations']['main']['states_stored']:,}" in doc
    assert f"{manifest['configurations']['restore']['states_stored']:,}" in doc
    assert "open findings" not in doc


# ------------------------------------------------------------------------------ report parsing
PAN_ERROR = """\
pan:1: assertion violated ( !(P1_at_most_one_effect)||(g_unexcused<=1)) (at depth 41)
pan: wrote model.pml.trail

(Spin Version 6.5.2 -- 6 December 2019)
Warning: Search not completed
State-vector 156 byte, depth reached 41, errors: 1
   494353 states, stored
\t   95618 nominal states (stored-atomic)
   162040 states, matched
   656393 transitions (= stored+matched)
pan: elapsed time 0.36 seconds
"""

PAN_CLEAN = """\
State-vector 140 byte, depth reached 335, errors: 0
  3179121 states, stored
 38142940 states, matched
 41322061 transitions (= stored+matched)
pan: elapsed time 18.5 seconds
"""

TRAIL = """\
                          MSC: worker 1: begin (pending -> pending)
 12:\tproc  2 (worker:1) model.pml:207 (state 25)\t[printf('MSC: worker %d: begin (%e -> pending)\\\\n',w,t_from)]
spin: model.pml:161, Error: assertion violated
spin: text of failed assertion: assert((!(P1_at_most_one_effect)||(g_unexcused<=1)))
                                  MSC: platform: request 2 lands
 40:\tproc  7 (platform:1) model.pml:155 (state 1)\t[printf('MSC: platform: request %d lands\\\\n',i)]
"""


def test_parse_pan_reads_a_counterexample_report():
    r = modelcheck.parse_pan(PAN_ERROR)
    assert (r.errors, r.states_stored, r.transitions, r.depth) == (1, 494353, 656393, 41)
    assert r.violated == "P1_at_most_one_effect" and r.seconds == pytest.approx(0.36)
    assert not r.truncated


def test_parse_pan_reads_a_clean_report_and_flags_truncation():
    r = modelcheck.parse_pan(PAN_CLEAN)
    assert (r.errors, r.states_stored, r.transitions, r.depth, r.violated) == (0, 3179121, 41322061, 335, None)
    assert modelcheck.parse_pan(PAN_CLEAN + "error: max search depth too small\n").truncated
    with pytest.raises(ValueError):
        modelcheck.parse_pan("not a pan report")
    assert not r.truncated
    # pan stops at its memory bound, says so, prints normal statistics with no error, and exits 0
    memlim = "pan: reached -DMEMLIM bound\n\t64 Mb\nWarning: Search not completed\n" + PAN_CLEAN
    assert modelcheck.parse_pan(memlim).truncated
    assert modelcheck.parse_pan("Warning: Search not completed\n" + PAN_CLEAN).truncated
    # a search that stops at its first counterexample is not "truncated": it found what it looked for
    assert not modelcheck.parse_pan(PAN_ERROR).truncated


def test_only_a_named_property_counts_as_a_catch():
    assert modelcheck._is_property("P10_one_dispatch_per_target")
    for other in (None, "BOUND_request_slots", "invalid end state", "(t_app==0)", "0"):
        assert not modelcheck._is_property(other), other


def test_trimmed_trail_keeps_the_events_and_ends_with_the_failed_assertion():
    assert modelcheck.trimmed_trail(TRAIL) == [
        "  12  worker 1: begin (pending -> pending)",
        "  40  platform: request 2 lands",
        "      failed assertion: assert((!(P1_at_most_one_effect)||(g_unexcused<=1)))",
    ]


_SECTIONS = (
    ("configurations", "configuration"),
    ("coverage", "coverage"),
    ("ablations", "ablation"),
    ("partial_ablations", "partial"),
    ("platform_ablations", "platform"),
    ("broken", "broken"),
    ("explorations", "exploration"),
)


def test_a_slow_run_with_the_recorded_state_counts_exits_0_with_a_warning(manifest, monkeypatch, capsys, tmp_path):
    """Wall time never fails `make model-check`: every job reports exactly the manifest's counts and
    outcomes, but each took ten times as long and the whole run far over the recorded runtime."""
    slow = 10 * manifest["runtime_seconds"] + 600
    outcomes = [
        modelcheck.Outcome(kind, name, True, {**rec, "seconds": 10 * rec.get("seconds", 1.0)})
        for section, kind in _SECTIONS
        for name, rec in manifest[section].items()
    ]
    ticks = iter((0.0, slow))
    monkeypatch.setattr(modelcheck, "_clock", lambda: next(ticks))
    monkeypatch.setattr(modelcheck, "tools", lambda: {"spin": manifest["spin"], "gcc": "gcc"})
    monkeypatch.setattr(modelcheck, "plan", lambda table, only=None, guards=None: [lambda wd, o=o: o for o in outcomes])
    monkeypatch.setattr(modelcheck, "MANIFEST", SPEC / "modelcheck.json")

    assert modelcheck.main(["--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert modelcheck.runtime_warning(slow, manifest["runtime_seconds"]) in out
    assert "matches spec/modelcheck.json" in out
    assert not [line for line in out if line.startswith(("BAD", "MANIFEST"))]


def test_a_run_within_the_recorded_runtime_gives_no_warning(manifest):
    assert modelcheck.runtime_warning(manifest["runtime_seconds"] * 2, manifest["runtime_seconds"]) is None
    assert modelcheck.runtime_warning(10_000.0, None) is None


def test_manifest_comparison_names_what_changed(manifest):
    changed = json.loads(json.dumps(manifest))
    changed["configurations"]["main"]["states_stored"] += 1
    del changed["ablations"]["lease_holder"]["caught_by"]
    diffs = modelcheck.compare_manifest(changed, manifest)
    assert any("main: states_stored" in d for d in diffs)
    assert any("lease_holder: caught_by" in d for d in diffs)
    assert modelcheck.compare_manifest(manifest, manifest) == []


# ------------------------------------------------------------------------------ with Spin
# These run Spin (marker ``spin``): `make model-check` runs them after spec/modelcheck.py, and `make test` leaves
# them out. The ``exhaustive`` ones repeat a job of spec/modelcheck.py (a configuration's full search, one
# ablation) against the same manifest, so `make model-check` skips them; `make formal-tests` runs every one. The
# restore configuration's exhaustive search is left to spec/modelcheck.py alone.
@pytest.mark.slow
@pytest.mark.spin
@pytest.mark.exhaustive
@pytest.mark.parametrize("name", [n for n in modelcheck.CONFIGURATIONS if n != "restore"])
def test_model_check_finds_no_counterexample(table, manifest, tmp_path, name):
    """Each configuration but the restore one, exhaustively, with the state counts of the manifest."""
    out = modelcheck.job_configuration(table, name, tmp_path)
    assert out.ok, out.problems
    assert out.record["errors"] == 0
    assert not modelcheck.parse_pan((tmp_path / f"model__{name}" / "pan.out").read_text()).truncated
    for k in ("states_stored", "transitions", "depth"):
        assert out.record[k] == manifest["configurations"][name][k], (name, k)


@pytest.mark.slow
@pytest.mark.spin
def test_every_event_fires_in_the_checked_model(table, manifest, tmp_path):
    out = modelcheck.job_coverage(table, tmp_path)
    assert out.ok, out.problems
    assert set(out.record["never_fired"]) <= {e.name for e in table.events.values() if "fence_restore" in e.effects}


COUPLED = [e.name for e in load_table(SPEC / "table.toml").events.values() if "claim" in e.couples]
_CLAIM, _APPROVAL = machine("claim"), machine("approval")
STANDALONE = [
    *(
        f"cc_{e}"
        for e in _CLAIM.events
        if e not in {c for ie in load_table(SPEC / "table.toml").events.values() for c in ie.couples.values()}
    ),
    *(
        f"ca_{e}"
        for e in _APPROVAL.events
        if e not in {a for ce in _CLAIM.events.values() for a in ce.couples.values()}
    ),
]


@pytest.mark.slow
@pytest.mark.spin
@pytest.mark.parametrize("inline", STANDALONE)
def test_every_standalone_claim_and_approval_move_fires_in_the_claims_configuration(table, tmp_path, inline):
    """The same for the claim and approval moves no intent event carries: their successful branch is reached."""
    model = promela.generate(table)
    start = model.index(f"inline {inline}()")
    end = model.find("\ninline ", start + 1)
    at = model.index(" ->\n", start) + len(" ->\n")
    assert end == -1 or at < end, f"{inline} has no successful branch"
    probe = model[:at] + " assert(0);\n" + model[at:]
    res = modelcheck.check_one(f"probe/{inline}", probe, ("-DCLAIMS", "-DCUT_AT_BOUND"), tmp_path, full=False)
    assert res.errors == 1 and res.assertion == "0", (inline, res.assertion)


@pytest.mark.slow
@pytest.mark.spin
@pytest.mark.parametrize("event", COUPLED)
def test_every_coupled_claim_move_fires_in_the_claims_configuration(table, tmp_path, event):
    """Vacuity for the claims configuration (it has no coverage run): for every intent event that
    couples a claim move, an assertion placed where the claim move is applied fails, so the coupled
    move is reachable and P10-P16 are not vacuous about it."""
    model = promela.generate(table)
    start = model.index(f"inline ci_{event}()")
    end = model.index("\ninline ", start + 1)
    mark = "t_cfrom = c_st; t_clease = c_lease;"
    at = model.index(mark, start) + len(mark)
    assert at < end, f"ci_{event} applies no claim move"
    probe = model[:at] + " assert(0);" + model[at:]
    res = modelcheck.check_one(f"probe/{event}", probe, ("-DCLAIMS", "-DCUT_AT_BOUND"), tmp_path, full=False)
    assert res.errors == 1 and res.assertion == "0", (event, res.assertion)
    assert any(f"{event} intent" in line for line in res.trail), res.trail[-3:]


@pytest.mark.slow
@pytest.mark.spin
@pytest.mark.exhaustive
def test_removing_the_lease_holder_guard_is_caught(table, manifest, tmp_path):
    out = modelcheck.job_ablation(table, "lease_holder", tmp_path)
    assert out.ok, out.problems
    assert out.record["errors"] >= 1
    assert out.record["caught_by"] == manifest["ablations"]["lease_holder"]["caught_by"]
    assert out.record["caught_by"] == "P5_stale_generation_never_writes"


@pytest.mark.slow
@pytest.mark.spin
@pytest.mark.exhaustive
def test_removing_the_restore_epoch_fence_is_caught_after_a_restore(table, manifest, tmp_path):
    out = modelcheck.job_ablation(table, "restore_epoch_current", tmp_path)
    assert out.ok, out.problems
    assert out.record["configuration"] == "restore"
    assert out.record["caught_by"] == manifest["ablations"]["restore_epoch_current"]["caught_by"]


@pytest.mark.slow
@pytest.mark.spin
def test_the_broken_configuration_is_caught_with_a_duplicate(table, tmp_path):
    out = modelcheck.job_broken(table, tmp_path)
    assert out.ok, out.problems
    assert out.record["caught_by"] == "P3_unknown_never_resent_by_machine"
    dup = out.record["duplicate"]["trail"]
    assert sum("lands" in line for line in dup) == 2 and any("retry_unknown" in line for line in dup)
