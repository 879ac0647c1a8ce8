"""Alembic environment: runs on the connection handed over in ``config.attributes``."""

from alembic import context

from atmostonce_sql.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only programmatic use is supported
    raise RuntimeError("run migrations through atmostonce_sql.migrate.upgrade()")
context.configure(connection=connection, target_metadata=metadata, transaction_per_migration=False)
with context.begin_transaction():
    context.run_migrations()
