"""Formerly: the stats history gained the engine's serving counters. The table is the management
API's own now (chunkstore/api/migrations; its revision h0001 adds the columns to a table made
before): this revision changes nothing.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass  # the management API's own migrations keep its table


def downgrade() -> None:
    pass
