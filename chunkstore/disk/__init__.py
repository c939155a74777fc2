"""The disk tier: a crash-safe, content-addressed store of KV pages (``ChunkStore``), its chunk
files, codecs, keys, model identity and SQLite index.

Invariant: importing the package imports nothing heavy. Every public name below is loaded on first
use (PEP 562), so ``from chunkstore.disk import ChunkStore`` (or ``from chunkstore import
ChunkStore``) works while the store commands import only the modules they use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# public name -> the module that defines it
EXPORTS = {
    "Codec": "chunkstore.disk.codec", "CorruptChunkError": "chunkstore.disk.codec",
    "Durability": "chunkstore.disk.files",
    "ModelIdentity": "chunkstore.disk.identity", "ModelMismatchError": "chunkstore.disk.identity",
    "DEFAULT_NAMESPACE": "chunkstore.disk.keys", "PageRef": "chunkstore.disk.keys",
    "chain_pages": "chunkstore.disk.keys", "page_key": "chunkstore.disk.keys", "root_key": "chunkstore.disk.keys",
    "ChunkStore": "chunkstore.disk.store", "EvictResult": "chunkstore.disk.store", "PutResult": "chunkstore.disk.store",
    "StoreBusyError": "chunkstore.disk.store", "StoreStats": "chunkstore.disk.store",
    "store_root": "chunkstore.disk.store", "ReadOnlyStoreError": "chunkstore.disk.store",
    # the types the store's methods take and return
    "ChunkHeader": "chunkstore.disk.chunkfile",
    "FileCheck": "chunkstore.disk.file_check", "FileStatus": "chunkstore.disk.file_check",
    "ChunkOrder": "chunkstore.disk.index", "ChunkQuery": "chunkstore.disk.index", "ChunkRow": "chunkstore.disk.index",
    "IndexMissingError": "chunkstore.disk.index",
    "EvictionPlan": "chunkstore.disk.eviction", "EvictionSelection": "chunkstore.disk.eviction",
    "ChunkNotStoredError": "chunkstore.disk.eviction", "StrandedDescendantsError": "chunkstore.disk.eviction",
    # owner-only files (the store's own, and any other a caller keeps beside it)
    "PRIVATE_FILE_MODE": "chunkstore.disk.files", "make_private": "chunkstore.disk.files",
    "write_private_file": "chunkstore.disk.files",
}

__all__ = sorted(EXPORTS)

if TYPE_CHECKING:
    from chunkstore.disk.chunkfile import ChunkHeader
    from chunkstore.disk.codec import Codec, CorruptChunkError
    from chunkstore.disk.eviction import ChunkNotStoredError, EvictionPlan, EvictionSelection, StrandedDescendantsError
    from chunkstore.disk.file_check import FileCheck, FileStatus
    from chunkstore.disk.files import PRIVATE_FILE_MODE, Durability, make_private, write_private_file
    from chunkstore.disk.identity import ModelIdentity, ModelMismatchError
    from chunkstore.disk.index import ChunkOrder, ChunkQuery, ChunkRow, IndexMissingError
    from chunkstore.disk.keys import DEFAULT_NAMESPACE, PageRef, chain_pages, page_key, root_key
    from chunkstore.disk.store import (ChunkStore, EvictResult, PutResult, ReadOnlyStoreError, StoreBusyError,
                                       StoreStats, store_root)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chunkstore.disk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS})
