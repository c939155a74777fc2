"""chunkstore: a tiered KV cache for LLM inference; this package holds the persistent disk tier.

Invariant: importing the package imports nothing heavy. Every public name below is loaded on first
use (PEP 562), so ``from chunkstore import ChunkStore`` works as before while ``chunkstore --help``
and the store commands never import torch, transformers or fastapi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "Codec": "chunkstore.codec", "CorruptChunkError": "chunkstore.codec",
    "Durability": "chunkstore.files",
    "ModelIdentity": "chunkstore.identity", "ModelMismatchError": "chunkstore.identity",
    "DEFAULT_NAMESPACE": "chunkstore.keys", "PageRef": "chunkstore.keys", "chain_pages": "chunkstore.keys",
    "page_key": "chunkstore.keys", "root_key": "chunkstore.keys",
    "ChunkStore": "chunkstore.store", "EvictResult": "chunkstore.store", "PutResult": "chunkstore.store",
    "StoreBusyError": "chunkstore.store", "StoreStats": "chunkstore.store",
}

__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from chunkstore.codec import Codec, CorruptChunkError
    from chunkstore.files import Durability
    from chunkstore.identity import ModelIdentity, ModelMismatchError
    from chunkstore.keys import DEFAULT_NAMESPACE, PageRef, chain_pages, page_key, root_key
    from chunkstore.store import ChunkStore, EvictResult, PutResult, StoreBusyError, StoreStats


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chunkstore' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
