"""The whole generated file: the header, the claims configuration, the intent configurations.

``templates/model.pml`` is its skeleton: one header comment, then ``#ifdef CLAIMS`` the claims
configuration (``configurations/claims.py``) ``#else`` the intent configurations (main, with the
processes of text and restore inside their own ``#ifdef``) ``#endif``.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from atmostonce.table import Table, machine

from .base import DEFAULT_BOUNDS, Bounds, GenerationError, property_doc, render
from .configurations import claims, main, restore, text

__all__ = ["PROPERTIES", "generate"]

PROPERTIES: Mapping[str, str] = MappingProxyType({**main.INTENT_PROPERTIES, **claims.CLAIM_PROPERTIES})


def generate(
    t: Table,
    *,
    bounds: Bounds = DEFAULT_BOUNDS,
    drop_guard: str | None = None,
    extra_evidence: Mapping[str, str] | None = None,
    note: str = "",
    coverage: bool = False,
) -> str:
    """The Promela model for table ``t``.

    ``drop_guard``: a catalogued guard to remove from every event's enabling condition (an
    ablation: the properties and the callers stay as they are). ``extra_evidence``: caller
    preconditions for events outside ``ACTION_EVIDENCE`` (the broken configuration).
    ``coverage``: events as ``atomic`` instead of ``d_step`` sequences, so that pan's report of
    unreached statements shows any event whose move never happens (a vacuity check).
    Raises :class:`GenerationError` for any name without a translation.
    """
    extra = dict(extra_evidence or {})
    main.validate(t)
    claim_t, approval_t = machine("claim"), machine("approval")
    if drop_guard is not None and drop_guard not in {*t.guards, *claim_t.guards, *approval_t.guards}:
        raise GenerationError(f"cannot drop {drop_guard!r}: not in the guard catalogue")
    claims_text = claims.generate_claims(
        t, claim_t, approval_t, drop_guard=drop_guard, bounds=bounds, extra_evidence=extra
    )
    # a claim or approval guard's ablation changes the claims configuration only
    intent_drop = drop_guard if drop_guard in t.guards else None
    intent_text = main.generate_intent(
        t,
        bounds=bounds,
        drop_guard=intent_drop,
        extra_evidence=extra,
        coverage=coverage,
        other_intent=text.process(),
        restore=restore.process(t),
    )
    return render(
        "model",
        table_name=t.name,
        table_version=t.version,
        ablation_note=f"\n * ABLATION: guard `{intent_drop}` removed from every event." if intent_drop else "",
        note=f"\n * {note}" if note else "",
        workers=bounds.workers,
        max_attempts=bounds.max_attempts,
        max_reconciles=bounds.max_reconciles,
        operator_moves=bounds.operator_moves,
        property_doc=property_doc(main.INTENT_PROPERTIES),
        claims=claims_text,
        intent=intent_text,
    )
