"""pytest plugin: run the conformance suite against your implementation.

Registered through the ``pytest11`` entry point (or load it with ``-p atmostonce.conformance.plugin``)::

    pytest --atmostonce-impl=mypackage.conformance:factory -m atmostonce_conformance
    pytest --atmostonce-driver="node driver.js" -m atmostonce_conformance

``--atmostonce-impl`` names a factory returning a fresh implementation per call (an object with
``store``, ``advance(seconds)`` and ``close()``, such as ``atmostonce.testing.stateful.StoreUnderTest``
or ``atmostonce.conformance.Implementation``), or returning a driver. Each case becomes a test
item named after its id; with a store factory, the shipped stateful machine
(``atmostonce.testing.stateful``) runs too, comparing your store to the reference model step by
step. Cases needing a feature your implementation lacks are reported as skipped with the reason
"not applicable: feature not implemented": listed, never passed. Without either option the
plugin does nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

MARKER = "atmostonce_conformance"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("atmostonce", "atmostonce conformance suite")
    group.addoption("--atmostonce-impl", metavar="MODULE:FACTORY", help="run the conformance suite on this factory")
    group.addoption("--atmostonce-driver", metavar="COMMAND", help="run it on this JSON-lines driver program")
    group.addoption("--atmostonce-cases", metavar="DIR", help="case folder (default: the shipped spec/conformance)")
    group.addoption(
        "--atmostonce-stateful-examples",
        type=int,
        default=30,
        metavar="N",
        help="examples for the stateful machine (default 30; a CI budget: 30 examples of 40 steps)",
    )
    group.addoption(
        "--atmostonce-stateful-trace",
        action="store_true",
        help="on a stateful failure, show Hypothesis's whole output and the traceback (default: the minimal "
        "failing program and the first disagreement)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a case of the atmostonce conformance suite")


class _State:
    """One driver per session (per xdist worker), started on first use and closed at the end."""

    def __init__(self, config: pytest.Config):
        self.impl: str | None = config.getoption("--atmostonce-impl")
        self.command: str | None = config.getoption("--atmostonce-driver")
        self.examples: int = config.getoption("--atmostonce-stateful-examples")
        self.trace: bool = config.getoption("--atmostonce-stateful-trace")
        self._driver: Any = None
        self.factory: Any = None
        self.results: list[Any] = []
        self.stateful: str | None = None

    def driver(self) -> Any:
        if self._driver is None:
            from .cli import driver_for_impl
            from .drivers import SubprocessDriver

            if self.command:
                self._driver = SubprocessDriver(self.command)
            else:
                assert self.impl is not None
                self._driver, self.factory = driver_for_impl(self.impl)
        return self._driver

    def close(self) -> None:
        if self._driver is not None:
            self._driver.close()
            self._driver = None


_STATE = pytest.StashKey[_State]()


class ConformanceFailure(AssertionError):
    pass


class ConformanceCase(pytest.Item):
    def __init__(self, *, case: Any, state: _State, **kw: Any):
        super().__init__(**kw)
        self.case, self.state = case, state
        self.add_marker(MARKER)

    def runtest(self) -> None:
        from .runner import NOT_APPLICABLE, PASSED, run_case

        result = run_case(self.state.driver(), self.case)
        self.state.results.append(result)
        if result.status == NOT_APPLICABLE:
            pytest.skip(result.message)
        if result.status != PASSED:
            raise ConformanceFailure(f"{self.case.rule}\n{self.case.description} [{self.case.id}]\n{result.message}")

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"conformance case {self.case.id} ({self.case.source})"


class StatefulMachine(pytest.Item):
    """The shipped Hypothesis machine: the implementation against the reference model, step by step."""

    def __init__(self, *, state: _State, **kw: Any):
        super().__init__(**kw)
        self.state = state
        self.add_marker(MARKER)

    def runtest(self) -> None:
        try:
            from hypothesis import HealthCheck, Phase, settings
        except ImportError as exc:
            raise ConformanceFailure(
                "the stateful machine needs Hypothesis: pip install 'atmostonce[test]' (or hypothesis)"
            ) from exc

        from ..testing.stateful import make_machine

        self.state.driver()
        if self.state.factory is None:
            self.state.stateful = "not applicable: the stateful machine needs a Python store factory"
            pytest.skip(self.state.stateful)
        machine = make_machine(self.state.factory)
        machine.TestCase.settings = settings(
            max_examples=self.state.examples,
            stateful_step_count=40,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            report_multiple_bugs=False,  # one minimal failing program, not a group of them
            phases=[p for p in Phase if p is not Phase.explain],  # the explain phase traces every line: slow
        )
        try:
            machine.TestCase().runTest()
        except Exception as exc:
            self.state.stateful = "failed"
            if self.state.trace:
                raise
            raise ConformanceFailure(short_failure(exc)) from None
        self.state.stateful = f"passed ({self.state.examples} examples)"

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> Any:
        if isinstance(excinfo.value, ConformanceFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo)

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, "conformance: stateful machine against the reference model"


def short_failure(exc: BaseException) -> str:
    """The minimal failing program Hypothesis found (its notes: the shrunk steps) and the first
    disagreement (the assertion's first line), without the traceback."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    notes = [n for n in getattr(exc, "__notes__", ()) if n.strip()]
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    lines = ["the stateful machine found a disagreement with the reference model", ""]
    lines += notes or ["(no minimal program recorded)"]
    lines += ["", f"first disagreement: {type(exc).__name__}: {first}", "(full trace: --atmostonce-stateful-trace)"]
    return "\n".join(lines)


class ConformanceSuite(pytest.Collector):
    def __init__(self, *, state: _State, cases_dir: str | None, **kw: Any):
        super().__init__(**kw)
        self.state, self.cases_dir = state, cases_dir

    def collect(self) -> list[pytest.Item]:
        from .cases import load_cases

        items: list[pytest.Item] = [
            ConformanceCase.from_parent(self, name=case.id, case=case, state=self.state)
            for case in load_cases(Path(self.cases_dir) if self.cases_dir else None)
        ]
        if self.state.impl:
            items.append(StatefulMachine.from_parent(self, name="stateful-machine", state=self.state))
        return items


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    if not (config.getoption("--atmostonce-impl") or config.getoption("--atmostonce-driver")):
        return
    if config.getoption("--atmostonce-impl") and config.getoption("--atmostonce-driver"):
        raise pytest.UsageError("give --atmostonce-impl or --atmostonce-driver, not both")
    state = config.stash.setdefault(_STATE, _State(config))
    suite = ConformanceSuite.from_parent(
        session, name="atmostonce-conformance", state=state, cases_dir=config.getoption("--atmostonce-cases")
    )
    items.extend(suite.collect())


def pytest_sessionfinish(session: pytest.Session) -> None:
    state = session.config.stash.get(_STATE, None)
    if state is not None:
        state.close()


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    state = config.stash.get(_STATE, None)
    if state is None or not state.results:
        return
    from .runner import Report

    name = state.command or state.impl or "implementation"
    report = Report(driver=name, results=state.results)
    terminalreporter.section("atmostonce conformance, by rule")
    for line in report.summary().splitlines()[1:]:
        terminalreporter.write_line(line)
    if state.stateful:
        terminalreporter.write_line(f"stateful machine: {state.stateful}")
