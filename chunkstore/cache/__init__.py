"""The tiered KV cache: device and host page pools, the radix tree over pages, the tier controller.

Modules here call the chunk store (the disk tier); nothing below imports them.

Invariant: importing the package imports nothing heavy. Its public names load on first use
(PEP 562), so a module that needs only the settings (``chunkstore.cache.config``, read by
``chunkstore serve --help``) does not import torch through the pools and the layout.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from chunkstore.cache.config import CacheConfig, PoolSize, add_cli_arguments
    from chunkstore.cache.layout import KVLayout
    from chunkstore.cache.policies import Compression, PrefetchPolicy, WritePolicy
    from chunkstore.cache.pools import DevicePool, HostPool, PagePool, PoolExhaustedError, default_device
    from chunkstore.cache.radix import RadixTree
    from chunkstore.cache.radix_policy import EvictionPolicy
    from chunkstore.cache.radix_types import InsertResult, LockHandle, MatchResult, RadixNode, RadixStats
    from chunkstore.cache.tiers import MEMORY_TIERS, Tier

_EXPORTS: dict[str, str] = {
    **dict.fromkeys(("CacheConfig", "PoolSize", "add_cli_arguments"), "config"),
    "KVLayout": "layout",
    **dict.fromkeys(("Compression", "PrefetchPolicy", "WritePolicy"), "policies"),
    **dict.fromkeys(("DevicePool", "HostPool", "PagePool", "PoolExhaustedError", "default_device"), "pools"),
    "RadixTree": "radix",
    "EvictionPolicy": "radix_policy",
    **dict.fromkeys(("InsertResult", "LockHandle", "MatchResult", "RadixNode", "RadixStats"), "radix_types"),
    **dict.fromkeys(("MEMORY_TIERS", "Tier"), "tiers"),
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'chunkstore.cache' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"chunkstore.cache.{module}"), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
