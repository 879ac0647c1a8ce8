"""A declared restore fences ``parked`` intents too: the move guard gains ``parked -> indeterminate``.

``restore_fence`` now moves a ``parked`` intent to ``indeterminate`` with at least one lookup left in its
budget (effect ``grant_reconcile``): a parked intent that a person settled and had sent after the backup comes
back parked, with evidence older than that send, and a lookup must run before a person is asked again
(docs/design.md#what-a-restore-cannot-know). The database's move guard (``atmostonce_sql.moves``, migration
0006) lists the moves the table allows; this revision installs it again from the current table, on both
dialects. No row is changed. Forward-only.

Revision ID: 0017
Revises: 0016
"""

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    from atmostonce_sql.moves import install_move_guard

    install_move_guard(op.get_bind())


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
