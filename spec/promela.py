"""Generate the Spin (Promela) model of the delivery-intent protocol from ``spec/table.toml`` (docs/formal.md).

``python spec/promela.py --write`` rewrites ``spec/atmostonce.pml``; ``--check`` exits 1 when the
committed file differs from what the current table gives; ``--print`` writes it to stdout.
``python spec/modelcheck.py`` runs Spin on it and on one variant per guard with that guard removed.

This file is the command and the generator's public face; the generator lives in
``spec/promela_gen/``:

* ``templates/*.pml``: the fixed environment (workers, sweeper, reconciler, operator, store clock,
  transport, platform, another intent sharing the account's text, the database that is restored,
  the claims configuration's processes), Promela text with ``${name}`` placeholders;
* ``configurations/main.py``, ``text.py``, ``restore.py``, ``claims.py``: one module per
  configuration of ``spec/modelcheck.py`` (its cpp flags, and what it generates from the table:
  one ``inline`` per event, the actors' alternatives, effects, evidence, properties);
* ``guards.py``: every guard's Promela translation, beside the model's and the SQL store's guard
  registries.

Taken from the table: the states (an ``mtype``); every event (one ``d_step``: source states, the
conjunction of its guards, its effects, its target); which actor calls it; which states are
initial / in flight / terminal / unknown / retryable (the properties are phrased over those kinds,
not over state names); which outcome each event records (that decides what evidence a caller must
hold before making the call); which event carries the restore fence. The generator raises
:class:`GenerationError` for any name it cannot translate, so a new guard, effect, outcome, actor or
event cannot enter the model untranslated. Properties are assertions named ``P1_...`` to
``P16_...`` (:data:`PROPERTIES`); ``spin -DCHECK=n`` keeps only property ``n``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:  # promela_gen sits beside this file, which runs as a script or is loaded by path
    sys.path.insert(0, str(HERE))

from promela_gen.base import Bounds, GenerationError  # noqa: E402
from promela_gen.configurations import CONFIGURATIONS  # noqa: E402
from promela_gen.configurations.claims import (  # noqa: E402
    CLAIM_EFFECTS_PML,
    CLAIM_PROPERTIES,
    CLAIMS_ACTOR_ARGS,
    CLAIMS_APPROVALS,
    CLAIMS_ATTEMPTS,
    CLAIMS_INTENT_EFFECTS,
    CLAIMS_INTENTS,
    CLAIMS_TAKES,
    broken_claim_freed_on_unknown,
    generate_claims,
)
from promela_gen.configurations.main import (  # noqa: E402
    ACTION_EVIDENCE,
    ACTOR_ARGS,
    BROKEN_EVIDENCE,
    EFFECTS,
    OUTCOME_CHECKS,
    OUTCOME_EVIDENCE,
    broken_retry_on_unknown,
)
from promela_gen.guards import (  # noqa: E402
    APPROVAL_PROMELA_GUARDS,
    CLAIM_GUARDS_PML,
    CLAIM_PROMELA_GUARDS,
    CLAIMS_INTENT_GUARDS,
    PROMELA_GUARDS,
)
from promela_gen.model import PROPERTIES, generate  # noqa: E402

from atmostonce.table import Table, load_table  # noqa: E402

__all__ = [
    "ACTION_EVIDENCE",
    "ACTOR_ARGS",
    "APPROVAL_PROMELA_GUARDS",
    "BROKEN_EVIDENCE",
    "CLAIMS_ACTOR_ARGS",
    "CLAIMS_APPROVALS",
    "CLAIMS_ATTEMPTS",
    "CLAIMS_INTENTS",
    "CLAIMS_INTENT_EFFECTS",
    "CLAIMS_INTENT_GUARDS",
    "CLAIMS_TAKES",
    "CLAIM_EFFECTS_PML",
    "CLAIM_GUARDS_PML",
    "CLAIM_PROMELA_GUARDS",
    "CLAIM_PROPERTIES",
    "CONFIGURATIONS",
    "EFFECTS",
    "MODEL_PATH",
    "OUTCOME_CHECKS",
    "OUTCOME_EVIDENCE",
    "PROMELA_GUARDS",
    "PROPERTIES",
    "TABLE_PATH",
    "Bounds",
    "GenerationError",
    "broken_claim_freed_on_unknown",
    "broken_retry_on_unknown",
    "default_model",
    "generate",
    "generate_claims",
    "main",
]

MODEL_PATH = HERE / "atmostonce.pml"
TABLE_PATH = HERE / "table.toml"


def default_model(table: Table | None = None) -> str:
    """The committed model: the current table, default bounds, nothing removed."""
    return generate(table or load_table(TABLE_PATH))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python spec/promela.py", description=__doc__.split("\n\n")[0])
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", action="store_true", help=f"rewrite spec/{MODEL_PATH.name}")
    g.add_argument("--check", action="store_true", help=f"exit 1 if spec/{MODEL_PATH.name} is stale")
    g.add_argument("--print", action="store_true", help="write the model to stdout")
    args = ap.parse_args(argv)
    try:
        text = default_model()
    except GenerationError as exc:
        print(f"promela: {exc}", file=sys.stderr)
        return 2
    if args.print:
        sys.stdout.write(text)
        return 0
    if args.write:
        MODEL_PATH.write_text(text, "utf-8")
        print(f"wrote {MODEL_PATH}")
        return 0
    if not MODEL_PATH.exists() or MODEL_PATH.read_text("utf-8") != text:
        print(f"{MODEL_PATH} is stale: run `python spec/promela.py --write`", file=sys.stderr)
        return 1
    print(f"{MODEL_PATH.name} matches the table")
    return 0


if __name__ == "__main__":
    sys.exit(main())
