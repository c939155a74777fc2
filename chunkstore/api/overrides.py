"""Settings changed through PATCH /config, kept in the data folder so that the next start applies them.

Invariants: the file (``admin-settings.json`` in the store's folder) is replaced atomically (a
temp file created with mode 0600 in the same folder, fsync, rename, fsync of the folder), so a
crash leaves the old file or the new one, never half of one; only live settings are kept; at a
start they are applied below what the flags and the environment set explicitly (explicit >
persisted > default); a file or value that cannot be used is logged and skipped, never fatal.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from chunkstore.disk import PRIVATE_FILE_MODE, make_private, write_private_file

log = logging.getLogger(__name__)

FILE_NAME = "admin-settings.json"
_VERSION = 1
# A persisted setting yields to these explicit ones (disk_size also to disk_ratio, which it would override).
_SHADOWED_BY = {"disk_size": ("disk_size", "disk_ratio")}


def shadowed(names: Iterable[str], explicit: set[str]) -> list[str]:
    """The persisted ``names`` that explicit settings (flags, environment) win over."""
    return sorted(n for n in names if any(e in explicit for e in _SHADOWED_BY.get(n, (n,))))


class SettingsFile:
    """The persisted overrides of one data folder (``path`` None: nothing is kept)."""

    def __init__(self, data_dir: Path | None) -> None:
        self.path = data_dir / FILE_NAME if data_dir is not None else None

    def read(self) -> dict[str, Any]:
        """The kept settings; {} when there is no file, or (logged) when it cannot be read."""
        if self.path is None or not self.path.is_file():
            return {}
        make_private(self.path, PRIVATE_FILE_MODE)  # a file kept before it was written 0600
        try:
            data = json.loads(self.path.read_text())
            if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("settings"),
                                                                                                dict):
                raise ValueError(f"not a version-{_VERSION} settings file")
            return dict(data["settings"])
        except (OSError, ValueError) as exc:
            log.warning("ignoring the persisted settings in %s: %s", self.path, exc)
            return {}

    def write(self, settings: dict[str, Any]) -> None:
        """Replace the file with ``settings`` (JSON values), atomically. Raises OSError, or
        PermissionError when there is no data folder."""
        if self.path is None:
            raise PermissionError("no data folder to keep settings in (no disk tier)")
        body = json.dumps({"version": _VERSION, "settings": settings}, indent=2, sort_keys=True) + "\n"
        write_private_file(self.path, body.encode())
