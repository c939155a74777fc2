"""Alembic environment for the chunk index. chunkstore passes an open connection in
``config.attributes["connection"]``; the alembic CLI uses ``sqlalchemy.url`` from alembic.ini."""

from alembic import context
from sqlalchemy import create_engine

from chunkstore.disk.schema import metadata

config = context.config


def _run(connection) -> None:
    context.configure(connection=connection, target_metadata=metadata, render_as_batch=True)
    with context.begin_transaction():
        context.run_migrations()


connection = config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    engine = create_engine(config.get_main_option("sqlalchemy.url"))
    with engine.begin() as conn:
        _run(conn)
