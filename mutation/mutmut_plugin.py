"""pytest plugin loaded only by mutmut runs (``[tool.mutmut] pytest_add_cli_args``).

Hypothesis draws fresh examples on every run by default; under mutmut a mutant would then be
killed on one run and survive the next. This profile derandomizes Hypothesis (examples derived
from each test's name) and switches its example database off, so a verdict is reproducible.
"""

from __future__ import annotations

from hypothesis import settings

settings.register_profile("mutmut", derandomize=True, database=None, print_blob=False)
settings.load_profile("mutmut")
