"""Every column that holds a state accepts only the states the tables declare.

``CHECK (state IN (...))`` on ``aom_intents`` (``state``, ``prev_state``), ``aom_history`` (``from_state``,
``to_state``), ``aom_claims``, ``aom_approvals`` and ``aom_claim_history`` (by its ``machine``), generated
from ``spec/table.toml``, ``spec/claim.toml`` and ``spec/approval.toml`` by
:func:`atmostonce_sql.state_checks.state_check_statements`, not typed here: PostgreSQL constraints, SQLite
triggers (SQLite cannot add a constraint to a table that exists). A write of a state no table declares is
refused by the database, whoever writes it (docs/design.md#one-table-read-by-everything).

Forward-only.

Revision ID: 0013
Revises: 0012
"""

from alembic import op

from atmostonce_sql.state_checks import state_check_statements

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    for statement in state_check_statements(op.get_bind().dialect.name):
        op.execute(statement)


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
