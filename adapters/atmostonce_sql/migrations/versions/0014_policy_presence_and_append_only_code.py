"""A kill switch is a row, and the append-only trigger has its own SQLSTATE.

- ``aom_kill_switches.engaged`` is dropped. A switch is engaged while its row exists: releasing it deletes the
  row, so the column was true on every row the store wrote (a row written false by hand is removed first, so
  it stays released)
  (docs/design.md#the-gate-is-the-conditional-write).
- PostgreSQL: ``aom_refuse_change()``, which every append-only table's trigger calls, raises SQLSTATE ``AOM02``
  (the table in the error's detail) instead of ``insufficient_privilege``. A grant's refusal keeps ``42501``,
  so the store tells the two apart by code alone (``atmostonce_sql.execution.APPEND_ONLY_SQLSTATE``).

Forward-only.

Revision ID: 0014
Revises: 0013
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("DELETE FROM aom_kill_switches WHERE NOT engaged")  # none the store wrote; a hand-made one stays off
    with op.batch_alter_table("aom_kill_switches") as batch:
        batch.drop_column("engaged")
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE OR REPLACE FUNCTION aom_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              RAISE EXCEPTION 'atmostonce: % on append-only table % refused', TG_OP, TG_TABLE_NAME
                USING ERRCODE = 'AOM02', DETAIL = TG_TABLE_NAME;
            END $$
            """
        )


def downgrade() -> None:
    raise RuntimeError("atmostonce migrations are forward-only: history is append-only")
