"""The conformance suite other implementations adopt (docs/conformance.md).

* ``spec/conformance/*.json``: language-neutral cases, validated by ``case.schema.json``; a case
  that needs a feature a driver does not declare (``runtime``, ``claims``) is listed as not
  applicable, never passed (``spec/conformance/pending/`` would hold cases for features that do
  not exist yet; it is empty now).
* :mod:`.drivers`: the driver protocol, :class:`StoreDriver` (any Python store) and
  :class:`SubprocessDriver` (any language, over JSON lines).
* :mod:`.runner`: runs cases, reports per case grouped by the rule each case cites, writes JUnit XML.
* :mod:`.cli`: ``atmostonce conformance``; :mod:`.plugin`: ``pytest --atmostonce-impl``.

See ``docs/conformance.md``.
"""

from .cases import Case, CaseError, cases_dir, load_cases, load_schema, validate_document
from .cli import load_factory, run_cli
from .drivers import (
    RUNTIME_OPS,
    STORE_OPS,
    Driver,
    DriverError,
    Implementation,
    ManualClock,
    StoreDriver,
    SubprocessDriver,
)
from .runner import CaseResult, Report, run_case, run_suite

__all__ = [
    "RUNTIME_OPS",
    "STORE_OPS",
    "Case",
    "CaseError",
    "CaseResult",
    "Driver",
    "DriverError",
    "Implementation",
    "ManualClock",
    "Report",
    "StoreDriver",
    "SubprocessDriver",
    "cases_dir",
    "load_cases",
    "load_factory",
    "load_schema",
    "run_case",
    "run_cli",
    "run_suite",
    "validate_document",
]
