"""Alembic environment for the chunk index. chunkstore passes an open connection in
``config.attributes["connection"]``; the alembic CLI uses ``sqlalchemy.url`` from alembic.ini.
The index file holds the disk tier's tables and the management API's own (its stats history):
one linear history, each part's tables in its own migrations, which spell their tables out. The
disk tier runs this environment whenever an index is upgraded, so it imports the disk tier's
schema only, never the API's (which is above it): ``target_metadata`` serves only
``alembic revision --autogenerate``, and a migration of the API's table is written against
chunkstore/api/history_schema.py by hand (tests/test_schema.py compares both with a migrated index)."""

from alembic import context
from sqlalchemy import create_engine

from chunkstore.disk.schema import metadata as disk_metadata

config = context.config


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=disk_metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        _run(conn)
