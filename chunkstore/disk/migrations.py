"""Applies the alembic migrations under alembic/ to a chunk index.

Invariants: an index is always at the newest revision before the store uses it; the migration
scripts are found beside the package (editable install or source tree) or under
``<prefix>/share/chunkstore/alembic`` (wheel install). Opening an index that is already current
runs no alembic migration context, so it logs nothing; an upgrade logs one line at info, and alembic's own
lines (each step, "Context impl") at debug only. alembic is imported only for an
upgrade, never to open a current index. An index that a newer release migrated (a revision none
of the installed scripts names) is neither used nor migrated: SchemaTooNewError names both
revisions (an older server of a fleet restarted after a newer one upgraded the shared index).
"""

from __future__ import annotations

import ast
import functools
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

if TYPE_CHECKING:
    from alembic.config import Config

_HERE = Path(__file__).resolve().parent.parent  # chunkstore/ (the package)
log = logging.getLogger(__name__)
# alembic logs one INFO line per plugin it sets up on import: noise in a server's log (it is
# imported lazily, so after the server configured logging).
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)


class _AtDebug(logging.Filter):
    """alembic's own lines (its "Context impl" ones and one per step, with the step's whole
    docstring) at debug level, shown only when this module's logger shows debug: an upgrade says
    one line at info (``upgrade``), not 25 before a server says where it listens."""

    def filter(self, record: logging.LogRecord) -> bool:
        if not log.isEnabledFor(logging.DEBUG):
            return False
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return True


logging.getLogger("alembic.runtime.migration").addFilter(_AtDebug())
VERSION_TABLE = "alembic_version"  # alembic's default, where it keeps an index's revision


class SchemaTooNewError(RuntimeError):
    """The index was migrated by a newer release of chunkstore, to a revision this one does not
    know: this release neither uses nor migrates it."""


def script_location() -> Path:
    for candidate in (_HERE.parent / "alembic", Path(sys.prefix) / "share" / "chunkstore" / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise FileNotFoundError("chunkstore's alembic migrations are not installed")


def _config() -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    return cfg


def _script_revision(path: Path) -> tuple[str, str | None] | None:
    """(revision, down_revision) of one migration script, read from its source without running it."""
    found: dict[str, str | None] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and node.targets[0].id in ("revision", "down_revision"):
            found[node.targets[0].id] = ast.literal_eval(node.value)
    return (found["revision"], found.get("down_revision")) if "revision" in found else None


@functools.cache
def _revisions() -> tuple[tuple[str, str | None], ...]:
    """(revision, down_revision) of every installed script, read once per process."""
    return tuple(r for f in sorted((script_location() / "versions").glob("*.py")) if (r := _script_revision(f)))


def known_revisions() -> frozenset[str]:
    return frozenset(rev for rev, _ in _revisions())


@functools.cache
def head_revision() -> str:
    """The newest revision of the installed scripts, read once per process. Parsed from the
    scripts' ``revision`` / ``down_revision`` lines (the chain is linear) rather than through
    alembic's ScriptDirectory, so that opening a current index never imports alembic (a test
    checks both agree)."""
    revisions = _revisions()
    downs = {down for _, down in revisions}
    heads = [rev for rev, _ in revisions if rev not in downs]
    if len(heads) != 1:
        raise RuntimeError(f"expected one alembic head revision, found {heads}")
    return heads[0]


def current_revision(connection: Connection) -> str | None:
    """The index's revision, None for an index never migrated. Read from alembic's version table
    directly: alembic's MigrationContext would log its "Context impl" lines for every check."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    revisions = connection.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()
    if len(revisions) > 1:
        raise RuntimeError(f"the index has several alembic heads: {sorted(revisions)}")
    return revisions[0] if revisions else None


def check_known(revision: str | None, where: str) -> None:
    """Raise SchemaTooNewError when ``revision`` (an index's, at ``where``) is none of this
    release's: a newer release migrated it."""
    if revision is not None and revision not in known_revisions():
        raise SchemaTooNewError(
            f"the index {where} is at schema revision {revision}, which this chunkstore does not know (its newest "
            f"is {head_revision()}): a newer release of chunkstore migrated it; upgrade chunkstore here to use it")


def upgrade(connection: Connection) -> tuple[str | None, str]:
    """Upgrade to head inside the caller's transaction; returns (revision before, head). Logs one
    line at info when it changed anything (alembic's own lines are at debug). Raises
    SchemaTooNewError for an index a newer release migrated (nothing changes)."""
    before = current_revision(connection)
    head = head_revision()
    url = connection.engine.url  # a SQLite index by its file, a server's without its password
    where = url.database if url.get_backend_name() == "sqlite" else url.render_as_string(hide_password=True)
    check_known(before, where)
    if before != head:
        from alembic import command

        cfg = _config()
        cfg.attributes["connection"] = connection
        command.upgrade(cfg, "head")
        log.info("chunk index %s: %s", where, f"schema created (revision {head})" if before is None
                 else f"schema upgraded from revision {before} to {head}")
    return before, head
