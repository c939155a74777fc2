"""chunkstore: a tiered KV cache for LLM inference; this package holds the persistent disk tier."""

from chunkstore.codec import Codec, CorruptChunkError
from chunkstore.files import Durability
from chunkstore.identity import ModelIdentity, ModelMismatchError
from chunkstore.keys import DEFAULT_NAMESPACE, PageRef, chain_pages, page_key, root_key
from chunkstore.store import ChunkStore, EvictResult, PutResult, StoreBusyError, StoreStats

__version__ = "0.1.0"

__all__ = [
    "ChunkStore", "Codec", "CorruptChunkError", "DEFAULT_NAMESPACE", "Durability", "EvictResult",
    "ModelIdentity", "ModelMismatchError", "PageRef", "PutResult", "StoreBusyError", "StoreStats",
    "chain_pages", "page_key", "root_key",
]
