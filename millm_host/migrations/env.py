"""Alembic environment shared by every plugin's migrations (see millm_host.db)."""

from alembic import context

config = context.config
connection = config.attributes["connection"]
context.configure(
    connection=connection,
    version_table=config.attributes["version_table"],
    target_metadata=None,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
