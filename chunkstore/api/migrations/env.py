"""Alembic environment of the management API's own tables (its stats history), kept in the store's
index database beside the disk tier's and versioned apart from them, in ``api_alembic_version``.
chunkstore passes an open connection in ``config.attributes["connection"]``
(chunkstore/api/history_db.py); it imports the API's schema only."""

from alembic import context

from chunkstore.api.history_schema import API_VERSION_TABLE, metadata

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=metadata, version_table=API_VERSION_TABLE,
                  render_as_batch=True)
with context.begin_transaction():
    context.run_migrations()
