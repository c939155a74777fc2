"""Alembic environment for the chunk index: the disk tier's tables. chunkstore passes an open
connection in ``config.attributes["connection"]``; the alembic CLI uses ``sqlalchemy.url`` from
alembic.ini. The disk tier runs this environment whenever an index is made or upgraded, so it
imports the disk tier's schema only. The management API keeps its own tables in the same
database with migrations of its own (chunkstore/api/migrations, in its own version table)."""

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
