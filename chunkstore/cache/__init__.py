"""The tiered KV cache: device and host page pools, the radix tree over pages, the tier controller.

Modules here call the chunk store (the disk tier); nothing below imports them.
"""

from chunkstore.cache.config import CacheConfig, PoolSize, add_cli_arguments
from chunkstore.cache.layout import KVLayout
from chunkstore.cache.policies import Compression, PrefetchPolicy, WritePolicy
from chunkstore.cache.pools import DevicePool, HostPool, PagePool, PoolExhaustedError, default_device
from chunkstore.cache.radix import RadixTree
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.cache.radix_types import InsertResult, LockHandle, MatchResult, RadixNode, RadixStats
from chunkstore.cache.tiers import MEMORY_TIERS, Tier

__all__ = [
    "CacheConfig", "Compression", "DevicePool", "EvictionPolicy", "HostPool", "InsertResult", "KVLayout",
    "LockHandle", "MEMORY_TIERS", "MatchResult", "PagePool", "PoolExhaustedError", "PoolSize", "PrefetchPolicy",
    "RadixNode", "RadixStats", "RadixTree", "Tier", "WritePolicy", "add_cli_arguments", "default_device",
]
