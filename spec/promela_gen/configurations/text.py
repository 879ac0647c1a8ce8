"""Configuration `text`: the main model plus another intent of the same account with the same text.

Checks the duplicate-text window (P9): the other intent runs the same protocol and claims the
account's text slot at its authorization when this intent does not hold it, then its effect lands.
Its process is ``templates/text.pml`` (fixed text), compiled in with ``-DOTHER_INTENT``; one
operator move keeps the search small.
"""

from __future__ import annotations

from ..base import render

__all__ = ["FLAGS", "NAME", "process"]

NAME = "text"
FLAGS: tuple[str, ...] = ("-DOTHER_INTENT", "-DOPERATOR_MOVES=1")


def process() -> str:
    """The other intent's process (inside ``#ifdef OTHER_INTENT`` of the main model)."""
    return render("text")
