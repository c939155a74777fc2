"""The management REST API (FastAPI): stats, history, metrics, chunk browsing, eviction, jobs, config.

``create_app(backend, settings)`` builds the application over a ``CacheBackend`` (a live
TieredCache, as `chunkstore serve` mounts it with ``mount``) or a ``StoreBackend`` (a store on disk,
as `chunkstore admin` serves it). Importing this package imports nothing heavy: the names below are
loaded on first use, so the command line stays quick. See docs/API.md.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "create_app": "chunkstore.api.app", "mount": "chunkstore.api.app", "API_PREFIX": "chunkstore.api.app",
    "AdminSettings": "chunkstore.api.settings", "TOKEN_FILENAME": "chunkstore.api.settings",
    "CacheBackend": "chunkstore.api.backend", "StoreBackend": "chunkstore.api.backend",
    "AdminBackend": "chunkstore.api.backend",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'chunkstore.api' has no attribute {name!r}")
