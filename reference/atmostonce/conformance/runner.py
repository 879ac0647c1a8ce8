"""Run cases against a driver; report per case, grouped by the rule each case checks.

A case passes when every step's result is what it expects. A case whose ``requires`` names a
feature the driver lacks is *not applicable*: it is listed in every report and never counted
as passed. A driver failure or a broken case is an *error*, which fails the run like a failure.
"""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .cases import Case, CaseError, match, resolve
from .drivers import RUNTIME_OPS, Driver, DriverError

__all__ = ["ERROR", "FAILED", "NOT_APPLICABLE", "PASSED", "CaseResult", "Report", "run_case", "run_suite"]

PASSED, FAILED, ERROR, NOT_APPLICABLE = "passed", "failed", "error", "not applicable"

SETUP_ACCOUNT, SETUP_KIND, SETUP_TARGET, SETUP_OPERATOR = "acct", "post", "room-1", "setup-operator"
SETUP_PATHS: dict[str, tuple[str, ...]] = {
    # state -> the moves after begin + authorize_dispatch that reach it
    "authorized": (),
    "published": ("record_success", "confirm_read_back"),
    "failed": ("record_not_sent",),
    "indeterminate": ("record_unknown",),
    "parked": ("record_unknown", "park"),
}


@dataclass
class CaseResult:
    """``status`` is one of passed, failed, error, not applicable. For a failure, ``step`` is the
    1-based first step that differed, ``op`` its operation, ``expected`` and ``got`` its outcomes
    (``accepted``, ``refused:<guard>`` or ``error:<type>``) and ``message`` every difference of
    every step that differed: a case runs on after a failing step, and stops early only when a
    later step needs a value the failing one did not give."""

    case: Case
    status: str
    message: str = ""
    step: int | None = None
    op: str | None = None
    expected: str | None = None
    got: str | None = None
    seconds: float = 0.0


@dataclass
class Report:
    driver: str
    results: list[CaseResult] = field(default_factory=list)
    seconds: float = 0.0
    bundle: str | None = None
    """The case bundle's line (``atmostonce conformance --bundle-version``), shown in the summary."""

    def _with(self, *statuses: str) -> list[CaseResult]:
        return [r for r in self.results if r.status in statuses]

    @property
    def passed(self) -> list[CaseResult]:
        return self._with(PASSED)

    @property
    def failed(self) -> list[CaseResult]:
        """Failures and errors: everything that makes the run fail."""
        return self._with(FAILED, ERROR)

    @property
    def not_applicable(self) -> list[CaseResult]:
        return self._with(NOT_APPLICABLE)

    @property
    def ok(self) -> bool:
        return not self.failed and bool(self.passed)

    def by_rule(self) -> dict[str, list[CaseResult]]:
        groups: dict[str, list[CaseResult]] = {}
        for r in self.results:
            groups.setdefault(r.case.rule, []).append(r)
        return dict(sorted(groups.items()))

    def counts(self) -> dict[str, int]:
        return {s: len(self._with(s)) for s in (PASSED, FAILED, ERROR, NOT_APPLICABLE)}

    def summary(self, *, verbose: bool = False) -> str:
        c = self.counts()
        lines = [
            f"atmostonce conformance: {self.driver}",
            f"  {c[PASSED]} passed, {c[FAILED]} failed, {c[ERROR]} errors, {c[NOT_APPLICABLE]} not applicable "
            f"({len(self.results)} cases, {self.seconds:.1f} s)",
            *([f"  {self.bundle}"] if self.bundle else []),
            "",
        ]
        for rule, results in self.by_rule().items():
            applicable = [r for r in results if r.status != NOT_APPLICABLE]
            good = sum(r.status == PASSED for r in applicable)
            if not applicable:
                tag = "N/A "
            else:
                tag = "PASS" if good == len(applicable) else "FAIL"
            extra = len(results) - len(applicable)
            tail = f", {extra} not applicable" if extra else ""
            lines.append(f"[{tag}] {rule} ({good}/{len(applicable)} passed{tail})")
            for r in results:
                if r.status in (FAILED, ERROR):
                    lines.append(f"    {r.status.upper()} {r.case.id}: {r.case.description}")
                    lines.extend(f"        {m}" for m in r.message.splitlines())
                elif verbose and r.status == PASSED:
                    lines.append(f"    {r.status} {r.case.id}: {r.case.description}")
        na = self.not_applicable
        if na:
            lines += ["", f"not applicable ({len(na)}, listed, not counted as passed):"]
            lines += [f"  {r.case.id} [{r.case.source}]: {r.message}" for r in na]
        lines += ["", "result: " + ("PASS" if self.ok else "FAIL")]
        return "\n".join(lines)

    def junit_xml(self) -> str:
        """JUnit XML: one test suite per rule; not-applicable cases are ``<skipped>``."""
        c = self.counts()
        root = ET.Element(
            "testsuites",
            name=f"atmostonce conformance: {self.driver}",
            tests=str(len(self.results)),
            failures=str(c[FAILED]),
            errors=str(c[ERROR]),
            skipped=str(c[NOT_APPLICABLE]),
            time=f"{self.seconds:.3f}",
        )
        for rule, results in self.by_rule().items():
            suite = ET.SubElement(
                root,
                "testsuite",
                name=rule,
                tests=str(len(results)),
                failures=str(sum(r.status == FAILED for r in results)),
                errors=str(sum(r.status == ERROR for r in results)),
                skipped=str(sum(r.status == NOT_APPLICABLE for r in results)),
                time=f"{sum(r.seconds for r in results):.3f}",
            )
            for r in results:
                tc = ET.SubElement(
                    suite,
                    "testcase",
                    classname=f"atmostonce.conformance.{r.case.source.removesuffix('.json').replace('/', '.')}",
                    name=f"{r.case.id}: {r.case.description}",
                    time=f"{r.seconds:.3f}",
                )
                if r.status == FAILED:
                    ET.SubElement(tc, "failure", message=r.message.splitlines()[0], type="conformance").text = r.message
                elif r.status == ERROR:
                    ET.SubElement(tc, "error", message=r.message.splitlines()[0], type="driver").text = r.message
                elif r.status == NOT_APPLICABLE:
                    ET.SubElement(tc, "skipped", message=r.message)
        ET.indent(root)
        return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


# ------------------------------------------------------------------------------ running
def _describe(result: Mapping[str, Any]) -> str:
    if "refused" in result:
        return f"refused:{result['refused']}"
    if "error" in result:
        err = result["error"]
        return f"error:{err.get('type', '?') if isinstance(err, Mapping) else err}"
    return "accepted"


def _wanted(expect: Mapping[str, Any]) -> str:
    if "refused" in expect:
        return f"refused:{expect['refused']}"
    if "refused_by_any" in expect:  # the refusing set: any one of these guards is right
        return "refused:" + "|".join(expect["refused_by_any"])
    if "error" in expect:
        return f"error:{expect['error']}"
    return "accepted"


def _agrees(wanted: str, got: str) -> bool:
    """``got`` is what ``wanted`` asks for; a refusing set (``refused:a|b``) takes any of its guards."""
    if wanted.startswith("refused:") and got.startswith("refused:"):
        return got.removeprefix("refused:") in wanted.removeprefix("refused:").split("|")
    return wanted == got


def _shown(outcome: str) -> str:
    kind, _, name = outcome.partition(":")
    if not name:
        return kind
    return f"{kind} by {'any of ' + ', '.join(name.split('|')) if '|' in name else name}"


def _subject_of(args: Mapping[str, Any]) -> str | None:
    key = args.get("key")
    if isinstance(key, str):
        return key
    for holder in ("lease", "plan", "intent", "claim"):
        v = args.get(holder)
        if isinstance(v, Mapping) and isinstance(v.get("key"), str):
            return str(v["key"])
    return None


class _NotImplemented(Exception):
    """The implementation answered ``unsupported`` where the case did not expect it: it lacks the operation."""

    def __init__(self, op: str, message: str):
        super().__init__(f"not applicable: operation not implemented ({op}: {message})")
        self.op = op


def _unsupported(op: str, out: Mapping[str, Any]) -> None:
    err = out.get("error")
    if isinstance(err, Mapping) and err.get("type") == "unsupported":
        raise _NotImplemented(op, str(err.get("message", "")))


class _StepFailed(Exception):
    def __init__(self, problems: list[str], expected: str, got: str):
        super().__init__("; ".join(problems))
        self.problems, self.expected, self.got = problems, expected, got


class _CaseRun:
    def __init__(self, driver: Driver, case: Case):
        self.driver, self.case = driver, case
        self.env: dict[str, Any] = {}
        self.default_subject: str | None = None

    # -- reads -----------------------------------------------------------------------------
    def read(self, op: str, args: Mapping[str, Any]) -> Any:
        out = self.driver.call(op, args)
        if "error" in out:
            _unsupported(op, out)
            raise DriverError(f"read {op} failed: {out['error']}")
        return out

    def snapshot(self, key: str | None) -> dict[str, Any]:
        if key is None:
            return {"count_by_state": self.read("count_by_state", {})}
        out = {op: self.driver.call(op, {"key": key}) for op in ("get", "history", "attempts", "reconciliations")}
        if "claims" in self.driver.features:  # the intent's target claim, its history, the approvals
            target = out["get"].get("target")
            out["approvals"] = self.driver.call("approvals", {"key": key})
            out["claim"] = self.driver.call("claim", {"target": target})
            out["claim_history"] = self.driver.call("claim_history", {"target": target})
        return out

    def target_of(self, key: str | None) -> str:
        if key is None:
            raise CaseError("claim expectations need a subject intent (add 'of')")
        return str(self.read("get", {"key": key})["target"])

    def count(self, name: str, key: str | None) -> int:
        if name == "intents":
            return sum(self.read("count_by_state", {}).values())
        if name in ("due_leases", "claimable"):
            return len(self.read(name, {"limit": 1000})["items"])
        if name in ("sends", "objects"):
            return int(self.read("platform", {} if key is None else {"key": key})[name])
        if key is None:
            raise CaseError(f"count {name!r} needs a subject intent (add 'of')")
        if name == "open_attempts":
            return sum(not a["outcomes"] for a in self.read("attempts", {"key": key})["items"])
        if name in ("attempts", "history", "reconciliations"):
            return len(self.read(name, {"key": key})["items"])
        if name == "claims":  # dispatch claims held on the subject's target: 0 or 1
            return int(self.read("claim", {"target": self.target_of(key)}).get("key") is not None)
        if name == "audit":  # rows of the subject's target claim history (claim and approval moves)
            return len(self.read("claim_history", {"target": self.target_of(key)})["items"])
        raise CaseError(f"unknown count {name!r}")

    # -- steps -----------------------------------------------------------------------------
    def seconds(self, advance: Any) -> float:
        if isinstance(advance, Mapping):
            base = resolve(advance["ref"], self.env)
            if not isinstance(base, (int, float)):
                raise CaseError(f"advance ref {advance['ref']} is not a number: {base!r}")
            return float(base) + float(advance.get("plus", 0))
        return float(advance)

    def step(self, step: Mapping[str, Any]) -> dict[str, Any] | None:
        if "advance" in step:
            self.driver.advance(self.seconds(step["advance"]))
        op = step.get("op")
        if op is None:
            return None
        args = dict(resolve(step.get("args", {}), self.env))
        if "fault" in step and op in RUNTIME_OPS:
            args["fault"] = step["fault"]
        expect: Mapping[str, Any] = step.get("expect", {"accepted": True})
        subject = resolve(expect["of"], self.env) if "of" in expect else _subject_of(args)
        before = self.snapshot(subject) if expect.get("unchanged") else None
        result = self.driver.call(op, args)
        wanted, got = _wanted(expect), _describe(result)
        if got == "error:unsupported" and wanted != got:
            _unsupported(op, result)
        if not _agrees(wanted, got):
            detail = f" ({result['error'].get('message', '')})" if got.startswith("error:") else ""
            raise _StepFailed([f"expected {_shown(wanted)}, got {_shown(got)}{detail}"], wanted, got)
        if got == "accepted" and op == "submit" and subject is None:
            subject = result.get("key")
        if self.default_subject is None and op == "submit" and got == "accepted":
            self.default_subject = result.get("key")
        subject = subject or self.default_subject
        problems = self.check(expect, result, subject, before)
        if "bind" in step:  # bound even when a check differs, so the later steps still run
            self.env[step["bind"]] = result
        if problems:
            raise _StepFailed(problems, wanted, got)
        return result

    def check(self, expect: Mapping[str, Any], result: Any, subject: str | None, before: Any) -> list[str]:
        problems: list[str] = []
        exp = resolve({k: v for k, v in expect.items() if k != "of"}, self.env)
        if "result" in exp:
            problems += match(exp["result"], result, "result")
        if "state" in exp or "intent" in exp:
            if subject is None:
                raise CaseError("state/intent expectations need a subject intent (add 'of')")
            intent = self.read("get", {"key": subject})
            if "state" in exp and intent.get("state") != exp["state"]:
                problems.append(f"state is {intent.get('state')!r}, wanted {exp['state']!r}")
            if "intent" in exp:
                problems += match(exp["intent"], intent, "intent")
        for name, want in exp.get("counts", {}).items():
            problems += match(want, self.count(name, subject), name)
        if "claim" in exp:
            problems += match(exp["claim"], self.read("claim", {"target": self.target_of(subject)}), "claim")
        if "history_events" in exp:
            events = [h["event"] for h in self.read("history", {"key": subject})["items"]]
            problems += match(exp["history_events"], events, "history events")
        if "attempt_outcomes" in exp:
            outs = [list(a["outcomes"]) for a in self.read("attempts", {"key": subject})["items"]]
            problems += match(exp["attempt_outcomes"], outs, "attempt outcomes")
        if before is not None:
            after = self.snapshot(subject)
            changed = [part for part in before if before[part] != after[part]]
            if changed:
                problems.append("the step changed " + ", ".join(changed) + " although it was not accepted")
        return problems

    # -- setup -----------------------------------------------------------------------------
    def setup(self) -> None:
        setup = self.case.setup
        if "platform" in setup:
            self.must("configure_platform", setup["platform"])
        for spec in setup.get("intents", ()):
            self.setup_intent(spec)

    def must(self, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
        out = self.driver.call(op, args)
        if _describe(out) != "accepted":
            _unsupported(op, out)
            raise CaseError(f"setup {op} was not accepted: {out}")
        return out

    def setup_intent(self, spec: Mapping[str, Any]) -> None:
        name = spec["name"]
        args: dict[str, Any] = {
            "account": spec.get("account", SETUP_ACCOUNT),
            "action_kind": spec.get("kind", SETUP_KIND),
            "target": spec.get("target", SETUP_TARGET),
            "request": spec.get("request", {"text": spec.get("text", f"text of {name}")}),
        }
        args.update({k: spec[k] for k in ("max_attempts", "max_reconciles") if k in spec})
        it = self.must("submit", args)
        key = it["key"]
        if self.default_subject is None:
            self.default_subject = key
        state = spec.get("state", "pending")
        if state != "pending":
            lease = self.must("begin", {"key": key, "lease_seconds": 30})
            self.env[f"{name}_lease"] = lease
            self.must(
                "authorize_dispatch",
                {"lease": lease, "request_digest": it["request_digest"], "send_lease_seconds": 30},
            )
            for op in SETUP_PATHS[state]:
                extra = {
                    "record_success": {"remote_id": f"r-{name}"},
                    "park": {"key": key, "operator": SETUP_OPERATOR},
                }.get(op, {})
                self.must(op, extra if op == "park" else {"lease": lease, **extra})
        self.env[name] = self.must("get", {"key": key})


def run_case(driver: Driver, case: Case) -> CaseResult:
    """Run one case on a fresh implementation (``driver.reset()`` first)."""
    missing = [f for f in case.requires if f not in driver.features]
    if missing:
        return CaseResult(case, NOT_APPLICABLE, f"not applicable: feature not implemented ({', '.join(missing)})")
    t0 = time.perf_counter()
    run = _CaseRun(driver, case)
    at: dict[str, Any] = {"index": 0, "op": None}  # the step being run, for the report

    def where() -> str:
        if not at["index"]:
            return "setup"
        note = case.steps[at["index"] - 1].get("note")
        return f"step {at['index']} {at['op']}" + (f" ({note})" if note else "")

    def result(status: str, msg: str, expected: str | None = None, got: str | None = None) -> CaseResult:
        return CaseResult(case, status, msg, at["index"] or None, at["op"], expected, got, time.perf_counter() - t0)

    failures: list[tuple[str, int, str | None, _StepFailed]] = []  # every step that differed, in order

    def failed(stopped: str | None = None) -> CaseResult:
        lines: list[str] = []
        for place, _, _, exc in failures:
            lines += [f"{place}: {exc.problems[0]}", *exc.problems[1:]]
        if stopped:
            lines.append(f"the steps after that could not run ({stopped})")
        _, index, op, first = failures[0]
        return CaseResult(
            case, FAILED, "\n".join(lines), index, op, first.expected, first.got, time.perf_counter() - t0
        )

    try:
        driver.reset()
        run.setup()
        for index, step in enumerate(case.steps, 1):
            at.update(index=index, op=step.get("op"))
            try:
                run.step(step)
            except _StepFailed as exc:  # reported with every later failing step: the case runs on
                failures.append((where(), index, at["op"], exc))
                if not _agrees(exc.expected, exc.got) and "bind" in step:
                    break  # what later steps refer to was never bound
    except _NotImplemented as exc:  # an operation the implementation does not have: not applicable, never an error
        if failures:
            return failed(f"{where()}: {exc}")
        return result(NOT_APPLICABLE, str(exc))
    except (CaseError, DriverError) as exc:
        if failures:  # a divergent implementation may leave later steps without what they need
            return failed(f"{where()}: {exc}")
        return result(ERROR, f"{where()}: {exc}")
    except (KeyError, IndexError, TypeError, AttributeError) as exc:  # an answer without the fields it must have
        if failures:
            return failed(f"{where()}: malformed driver answer ({type(exc).__name__}: {exc})")
        return result(ERROR, f"{where()}: malformed driver answer ({type(exc).__name__}: {exc})")
    if failures:
        return failed()
    return CaseResult(case, PASSED, seconds=time.perf_counter() - t0)


def run_suite(
    driver: Driver,
    cases: Iterable[Case],
    *,
    on_result: Callable[[CaseResult], None] | None = None,
) -> Report:
    """Run every case on ``driver`` (each on a fresh implementation) and collect a :class:`Report`."""
    report = Report(driver=getattr(driver, "name", type(driver).__name__))
    t0 = time.perf_counter()
    for case in cases:
        r = run_case(driver, case)
        report.results.append(r)
        if on_result is not None:
            on_result(r)
    report.seconds = time.perf_counter() - t0
    return report
