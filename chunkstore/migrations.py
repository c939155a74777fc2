"""Applies the alembic migrations under alembic/ to a chunk index.

Invariant: an index is always at the newest revision before the store uses it; the migration
scripts are found beside the package (editable install or source tree) or under
``<prefix>/share/chunkstore/alembic`` (wheel install).
"""

from __future__ import annotations

import sys
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Connection

_HERE = Path(__file__).resolve().parent


def script_location() -> Path:
    for candidate in (_HERE.parent / "alembic", Path(sys.prefix) / "share" / "chunkstore" / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("chunkstore's alembic migrations are not installed")


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    return cfg


def head_revision() -> str:
    head = ScriptDirectory.from_config(_config()).get_current_head()
    if head is None:
        raise RuntimeError("no alembic head revision")
    return head


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(connection: Connection) -> tuple[str | None, str]:
    """Upgrade to head inside the caller's transaction; returns (revision before, head)."""
    before = current_revision(connection)
    head = head_revision()
    if before != head:
        cfg = _config()
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")
    return before, head
