"""One module per model-check configuration, in the order ``spec/modelcheck.py`` runs them.

Each module names its configuration (``NAME``) and the cpp flags Spin compiles the one generated
model with for it (``FLAGS``); ``spec/modelcheck.py`` ``CONFIGURATIONS`` is built from them.
"""

from __future__ import annotations

from types import ModuleType

from . import claims, main, restore, text

__all__ = ["CONFIGURATIONS", "claims", "main", "restore", "text"]

CONFIGURATIONS: tuple[ModuleType, ...] = (main, text, restore, claims)
