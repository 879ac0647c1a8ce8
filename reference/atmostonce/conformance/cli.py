"""``atmostonce conformance``: run the cases against an implementation and report by the rule each case cites.

Exit codes: 0 every applicable case passed; 1 a case failed or errored; 2 bad usage (no
such factory, a driver that does not start, an invalid case file).
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeGuard

from .cases import Case, CaseError, bundle, load_cases
from .drivers import FEATURES, Driver, DriverError, StoreDriver, SubprocessDriver

__all__ = ["add_arguments", "driver_for_impl", "load_factory", "run_cli", "select"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    target = p.add_mutually_exclusive_group()
    target.add_argument(
        "--driver",
        metavar="COMMAND",
        help='a program that speaks the JSON-lines protocol, e.g. "node driver.js" (split like a shell)',
    )
    target.add_argument(
        "--impl",
        metavar="MODULE:FACTORY",
        help="a Python factory returning a fresh Implementation/StoreUnderTest per call (or a Driver)",
    )
    p.add_argument("--cases", metavar="DIR", help="case folder (default: the shipped spec/conformance)")
    p.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report here")
    p.add_argument("--case", dest="case_ids", action="append", metavar="ID", help="run only this case (repeatable)")
    p.add_argument("--rule", metavar="TEXT", help="run only cases whose rule contains TEXT")
    p.add_argument(
        "--feature",
        dest="features",
        action="append",
        choices=FEATURES,
        help="run only cases needing this feature (store: the cases needing no other feature; repeatable)",
    )
    p.add_argument(
        "--file",
        dest="files",
        action="append",
        metavar="FILE",
        help="run only the cases of this case file, e.g. guards.json (repeatable)",
    )
    p.add_argument(
        "--bundle-version",
        action="store_true",
        help="print the case bundle's version and digest and exit (1 when the cases differ from the pinned bundle)",
    )
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a --driver may take per answer")
    p.add_argument("--verbose", "-v", action="store_true", help="list passing cases too")
    return p


def _parser() -> argparse.ArgumentParser:
    return add_arguments(
        argparse.ArgumentParser(
            prog="atmostonce conformance",
            description="Run the atmostonce conformance cases against an implementation.",
        )
    )


def load_factory(spec: str) -> Any:
    """The object named by ``module:attribute`` (the attribute may be dotted).

    The current directory is importable, as with ``python -m``. Raises ``ValueError``.
    """
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:FACTORY, got {spec!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError as exc:
            raise ValueError(f"{module_name!r} has no attribute {attr!r}") from exc
    return obj


def _is_driver(obj: Any) -> TypeGuard[Driver]:
    """A :class:`Driver`, or any object with its three methods (duck-typed drivers are used as is)."""
    return isinstance(obj, Driver) or all(callable(getattr(obj, m, None)) for m in ("reset", "call", "advance"))


def driver_for_impl(spec: str | Callable[[], Any]) -> tuple[Driver, Callable[[], Any] | None]:
    """A driver for ``module:factory`` (or the factory itself), and the factory when it builds stores.

    The factory is called once here: if it returns a driver, that driver is used as is;
    otherwise it must return Implementation-like objects and is wrapped in a :class:`StoreDriver`.
    """
    factory = load_factory(spec) if isinstance(spec, str) else spec
    name = spec if isinstance(spec, str) else getattr(spec, "__qualname__", "factory")
    if _is_driver(factory):
        return factory, None
    if not callable(factory):
        raise ValueError(f"{name} is not callable")
    first = factory()
    if _is_driver(first):
        return first, None
    return StoreDriver(factory, name=name, first=first), factory


def select(
    cases: Sequence[Case],
    *,
    ids: Sequence[str] | None = None,
    rule: str | None = None,
    features: Sequence[str] | None = None,
    files: Sequence[str] | None = None,
) -> list[Case]:
    """The cases every given filter keeps (each filter takes any of its values). ``features``: cases
    needing that feature (``store``: those needing no other one). ``files``: a case file's name or its path
    under the case folder. Raises ``ValueError`` for an unknown case id or file."""
    out = list(cases)
    if ids:
        unknown = set(ids) - {c.id for c in out}
        if unknown:
            raise ValueError(f"no such case: {', '.join(sorted(unknown))}")
        out = [c for c in out if c.id in ids]
    if files:
        known = {c.source for c in cases} | {Path(c.source).name for c in cases}
        unknown = set(files) - known
        if unknown:
            raise ValueError(f"no such case file: {', '.join(sorted(unknown))} (known: {', '.join(sorted(known))})")
        out = [c for c in out if c.source in files or Path(c.source).name in files]
    if rule:
        out = [c for c in out if rule.lower() in c.rule.lower()]
    if features:
        out = [c for c in out if any((f == "store" and not c.requires) or f in c.requires for f in features)]
    return out


def run_cli(args: Sequence[str] | argparse.Namespace | None = None) -> int:
    """``atmostonce conformance ...``: takes an argv list (or a namespace from :func:`add_arguments`)."""
    ns = args if isinstance(args, argparse.Namespace) else _parser().parse_args(args)
    folder = Path(ns.cases) if ns.cases else None
    if getattr(ns, "bundle_version", False):
        try:
            b = bundle(folder)
        except CaseError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(b.line())
        return EXIT_FAILED if b.modified else EXIT_OK
    if not (ns.driver or ns.impl):
        print("error: give --driver COMMAND or --impl MODULE:FACTORY (or --bundle-version)", file=sys.stderr)
        return EXIT_USAGE
    try:
        cases = load_cases(folder)
    except CaseError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        cases = select(cases, ids=ns.case_ids, rule=ns.rule, features=ns.features, files=ns.files)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if not cases:
        print("error: no case selected", file=sys.stderr)
        return EXIT_USAGE
    try:
        driver = SubprocessDriver(ns.driver, timeout=ns.timeout) if ns.driver else driver_for_impl(ns.impl)[0]
    except (DriverError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    from .runner import run_suite

    try:
        report = run_suite(driver, cases)
    finally:
        driver.close()
    try:
        report.bundle = bundle(folder).line()
    except CaseError:
        report.bundle = None
    print(report.summary(verbose=ns.verbose))
    if ns.junit:
        Path(ns.junit).write_text(report.junit_xml(), "utf-8")
        print(f"JUnit XML written to {ns.junit}")
    return EXIT_OK if report.ok else EXIT_FAILED
