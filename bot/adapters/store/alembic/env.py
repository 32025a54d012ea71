"""Alembic's environment for gpubot: always run from bot.adapters.store.migrate, which passes the open connection
in `config.attributes["connection"]` (no alembic.ini, no URL here). Batch mode, so that SQLite's missing ALTERs
are done by copying the table (https://alembic.sqlalchemy.org/en/latest/batch.html)."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None, render_as_batch=True,
                  transaction_per_migration=True)
with context.begin_transaction():
    context.run_migrations()
