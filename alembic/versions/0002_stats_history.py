"""Formerly the management API's stats history. That table is the API's own now, with migrations of
its own (chunkstore/api/migrations, versioned in api_alembic_version): this revision makes
nothing, and the API adopts the table an index made before already holds (its revision h0001).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-07
"""

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # the management API's own migrations make its table


def downgrade() -> None:
    pass
