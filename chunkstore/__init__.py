"""chunkstore: a tiered KV cache for LLM inference.

Layers, each a package: ``disk`` (the persistent chunk store) <- ``cache`` (device and host pools,
the radix tree, the tier controller) <- ``engine`` (the reference engine) <- ``server``
(``chunkstore serve``); ``api`` (the management REST API) and ``webui`` (its dashboard) use the
cache's and the store's public methods; ``bench`` and ``testing`` drive them.

Invariant: importing the package imports nothing heavy. The disk tier's public names are
re-exported here and loaded on first use (PEP 562), so ``from chunkstore import ChunkStore`` works
while ``chunkstore --help`` and the store commands never import torch, transformers or fastapi.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from chunkstore.disk import EXPORTS as _DISK_EXPORTS

__version__ = "0.1.0"

__all__ = sorted(_DISK_EXPORTS)

if TYPE_CHECKING:
    from chunkstore.disk import (DEFAULT_NAMESPACE, ChunkStore, Codec, CorruptChunkError, Durability, EvictResult,
                                 ModelIdentity, ModelMismatchError, PageRef, PutResult, StoreBusyError, StoreStats,
                                 chain_pages, engine_pages, page_key, root_key, store_root)


def __getattr__(name: str) -> Any:
    if name not in _DISK_EXPORTS:
        raise AttributeError(f"module 'chunkstore' has no attribute {name!r}")
    value = getattr(importlib.import_module("chunkstore.disk"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_DISK_EXPORTS})
