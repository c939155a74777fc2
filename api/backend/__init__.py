"""What the management API manages: a live TieredCache (CacheBackend) or a store on disk (StoreBackend)."""

from api.backend.base import (
    AdminBackend, BackendError, BackendKind, BackendSnapshot, Decode, FlushOutcome, NoDiskTierError,
    ReadOnlyError, StoreUnavailableError, UnsupportedError,
)
from api.backend.cache_backend import CacheBackend
from api.backend.store_backend import StoreBackend

__all__ = [
    "AdminBackend", "BackendError", "BackendKind", "BackendSnapshot", "CacheBackend", "Decode", "FlushOutcome",
    "NoDiskTierError", "ReadOnlyError", "StoreBackend", "StoreUnavailableError", "UnsupportedError",
]
