"""The stats history gains the engine's serving counters (requests, completion tokens, time to first token).

Nullable: samples taken before, offline (`chunkstore admin`) or over a cache without an engine have none.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Spelled out (not imported from chunkstore.disk.schema): a migration is frozen once released.
_COLUMNS = (("requests_total", sa.Integer), ("completion_tokens_total", sa.Integer), ("ttft_sum_s", sa.Float),
            ("ttft_count", sa.Integer))


def upgrade() -> None:
    with op.batch_alter_table("stats_history") as batch:
        for name, kind in _COLUMNS:
            batch.add_column(sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("stats_history") as batch:
        for name, _ in reversed(_COLUMNS):
            batch.drop_column(name)
