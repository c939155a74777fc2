"""The disk tier: a crash-safe, content-addressed store of KV pages (``ChunkStore``), its chunk
files, codecs, keys, model identity and SQLite index.

Invariant: importing the package imports nothing heavy. Every public name below is loaded on first
use (PEP 562), so ``from chunkstore.disk import ChunkStore`` (or ``from chunkstore import
ChunkStore``) works while the store commands import only the modules they use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# the module that defines them -> public names
_OWNERS = {
    "chunkstore.disk.codec": ("Codec", "CorruptChunkError"),
    "chunkstore.disk.identity": ("ModelIdentity", "ModelMismatchError"),
    "chunkstore.disk.keys": ("DEFAULT_NAMESPACE", "PageRef", "chain_pages", "engine_pages", "page_key", "root_key"),
    "chunkstore.disk.store": ("ChunkStore",),
    "chunkstore.disk.results": ("EvictResult", "PutResult", "StoreStats", "ReadOnlyStoreError"),
    "chunkstore.disk.store_folder": ("StoreBusyError", "store_root", "read_identity"),
    # the seams: where the index and the payloads are; owner-only files (the store's own, and any
    # other a caller keeps beside it)
    "chunkstore.disk.index": ("sqlite_url", "index_backend", "display_url", "ChunkOrder", "ChunkQuery", "ChunkRow",
                              "IndexMissingError"),
    "chunkstore.disk.payloads": ("PayloadStore", "PayloadsUnavailable", "Staged"),
    "chunkstore.disk.objects": ("ObjectPayloads", "ObjectStoreConfig", "parse_object_url"),
    "chunkstore.disk.payload_cache": ("CachedPayloads",),
    # the one door: where a store is and how it opens
    "chunkstore.disk.store_spec": ("DEFAULT_LOCAL_COPY_BYTES", "StoreSpec", "check_folder", "check_index_url",
                                   "check_object_store", "open_store"),
    "chunkstore.disk.files": ("ChunkFiles", "Durability", "PRIVATE_FILE_MODE", "make_private", "write_private_file"),
    # a sealed store's master key (where it comes from) and its key operations' results
    "chunkstore.disk.seal_keys": ("KeyProvider", "FileKeyProvider", "EnvKeyProvider", "MasterKey", "SealKeyError",
                                  "seal_key_provider", "write_key_file"),
    "chunkstore.disk.store_sealing": ("NamespaceKeyInfo", "RotateResult", "ShredResult"),
    # the other types the store's methods take and return
    "chunkstore.disk.chunkfile": ("ChunkHeader",),
    "chunkstore.disk.file_check": ("FileCheck", "FileStatus"),
    "chunkstore.disk.eviction": ("EvictionPlan", "EvictionSelection", "ChunkNotStoredError",
                                 "StrandedDescendantsError"),
}
# public name -> the module that defines it
EXPORTS = {name: module for module, names in _OWNERS.items() for name in names}

__all__ = sorted(EXPORTS)

if TYPE_CHECKING:
    from chunkstore.disk.chunkfile import ChunkHeader
    from chunkstore.disk.codec import Codec, CorruptChunkError
    from chunkstore.disk.eviction import ChunkNotStoredError, EvictionPlan, EvictionSelection, StrandedDescendantsError
    from chunkstore.disk.file_check import FileCheck, FileStatus
    from chunkstore.disk.files import PRIVATE_FILE_MODE, ChunkFiles, Durability, make_private, write_private_file
    from chunkstore.disk.identity import ModelIdentity, ModelMismatchError
    from chunkstore.disk.index import (ChunkOrder, ChunkQuery, ChunkRow, IndexMissingError, display_url,
                                       index_backend, sqlite_url)
    from chunkstore.disk.keys import DEFAULT_NAMESPACE, PageRef, chain_pages, engine_pages, page_key, root_key
    from chunkstore.disk.objects import ObjectPayloads, ObjectStoreConfig, parse_object_url
    from chunkstore.disk.payload_cache import CachedPayloads
    from chunkstore.disk.payloads import PayloadStore, PayloadsUnavailable, Staged
    from chunkstore.disk.results import EvictResult, PutResult, ReadOnlyStoreError, StoreStats
    from chunkstore.disk.seal_keys import (EnvKeyProvider, FileKeyProvider, KeyProvider, MasterKey, SealKeyError,
                                           seal_key_provider, write_key_file)
    from chunkstore.disk.store import ChunkStore
    from chunkstore.disk.store_sealing import NamespaceKeyInfo, RotateResult, ShredResult
    from chunkstore.disk.store_folder import StoreBusyError, read_identity, store_root
    from chunkstore.disk.store_spec import (DEFAULT_LOCAL_COPY_BYTES, StoreSpec, check_folder, check_index_url,
                                            check_object_store, open_store)


def __getattr__(name: str) -> Any:
    module = EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chunkstore.disk' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *EXPORTS})
