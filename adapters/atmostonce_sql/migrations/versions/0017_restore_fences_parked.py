"""A declared restore fences ``parked`` intents too: the move guard gains ``parked -> indeterminate``.

``restore_fence`` now moves a ``parked`` intent to ``indeterminate`` with at least one lookup left in its
budget (effect ``grant_reconcile``): a parked intent that a person settled and had sent after the backup comes
back parked, with evidence older than that send, and a lookup must run before a person is asked again
(docs/design.md#what-a-restore-cannot-know). The database's move guard (``atmostonce_sql.moves``, migration
0006) lists the moves the table allows; this revision installs it again from the current table, on both
dialects, and on SQLite the state checks after it (migration 0013), which keeps them firing first. No row is
changed. Forward-only.

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
    from atmostonce_sql.state_checks import state_check_statements, state_checks

    install_move_guard(op.get_bind())
    if op.get_bind().dialect.name == "sqlite":
        # SQLite runs the newest trigger first: the state checks (migration 0013) are made again after the
        # move guard, so that a write of a state no table declares is still refused naming its own check
        for c in state_checks():
            op.execute(f"DROP TRIGGER IF EXISTS {c.name}_insert")
            op.execute(f"DROP TRIGGER IF EXISTS {c.name}_update")
        for statement in state_check_statements("sqlite"):
            op.execute(statement)


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
