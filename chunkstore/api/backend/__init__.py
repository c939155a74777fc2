"""What the management API manages: a live TieredCache (CacheBackend) or a store on disk (StoreBackend)."""

from chunkstore.api.backend.base import (
    AdminBackend, BackendError, BackendKind, BackendSnapshot, Decode, FlushOutcome, NoDiskTierError,
    ReadOnlyError, StoreUnavailableError, UnsupportedError,
)
from chunkstore.api.backend.cache_backend import CacheBackend
from chunkstore.api.backend.store_backend import StoreBackend

__all__ = [
    "AdminBackend", "BackendError", "BackendKind", "BackendSnapshot", "CacheBackend", "Decode", "FlushOutcome",
    "NoDiskTierError", "ReadOnlyError", "StoreBackend", "StoreUnavailableError", "UnsupportedError",
]
