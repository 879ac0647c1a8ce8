"""End-to-end tests of the Matrix transport against a real Synapse behind a fault proxy (docs/matrix.md).

Until pyproject.toml maps ``atmostonce_matrix`` (adapters/atmostonce_matrix) like the other
adapters, the package is loaded from its source folder here, so the tests run from a checkout.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

if importlib.util.find_spec("atmostonce_matrix") is None:  # pragma: no cover - only before the pyproject patch
    _pkg = Path(__file__).resolve().parents[2] / "adapters" / "atmostonce_matrix"
    _spec = importlib.util.spec_from_file_location(
        "atmostonce_matrix", _pkg / "__init__.py", submodule_search_locations=[str(_pkg)]
    )
    assert _spec is not None and _spec.loader is not None
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["atmostonce_matrix"] = _module
    _spec.loader.exec_module(_module)
