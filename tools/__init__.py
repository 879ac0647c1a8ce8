"""Repository tools that are not shipped in the wheel: the docs generator and lint (``python -m tools.docgen``,
run by ``make docs`` and ``make docs-check``)."""
