"""AdminBackend: the management API's one door to what it manages (a live cache, or a store on disk).

Invariants: the API reaches the cache and the chunk store only through a backend, and the backend
only through their public methods; every store access goes through ``using_store``, which raises
instead of yielding while there is no store (NoDiskTierError), it is being replaced
(StoreUnavailableError), or a write is asked of a read-only store (ReadOnlyError). A backend never
closes what it was given.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chunkstore.cache.admin import MemoryEviction, MemorySelection, ResidentPage
from chunkstore.cache.stats import CacheStats, NamespaceLookups
from chunkstore.cache.tiers import Tier
from chunkstore.choices import Choice
from chunkstore.disk.identity import ModelIdentity
from chunkstore.disk.maintenance import Progress, RebuildReport
from chunkstore.disk.store import ChunkStore, StoreStats

if TYPE_CHECKING:  # the engine package is heavy (torch, transformers) and above the API's imports
    from chunkstore.engine.serving_stats import ServingSnapshot

Decode = Callable[[Sequence[int]], str]  # token ids -> text (a tokenizer's decode)
ServingSource = Callable[[], "ServingSnapshot"]  # the engine's ServingStats.snapshot


class BackendKind(Choice):
    CACHE = "cache"  # a live TieredCache (mounted in `chunkstore serve`)
    STORE = "store"  # a ChunkStore on disk (`chunkstore admin`)


class BackendError(Exception):
    """An operation the backend cannot do now; ``status`` and ``code`` say how the API answers."""

    status = 409
    code = "conflict"


class NoDiskTierError(BackendError):
    code = "no_disk_tier"


class ReadOnlyError(BackendError):
    code = "read_only"


class StoreUnavailableError(BackendError):
    status = 503
    code = "unavailable"


class UnsupportedError(BackendError):
    """The request is valid but asks what this kind of backend does not have (memory tiers offline)."""

    status = 422
    code = "unsupported"


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    """The figures of one moment: the cache's (None offline), the store's (None without a disk tier)
    and the engine's serving figures (None without an engine: offline, or a cache alone)."""

    taken_at: float  # epoch seconds
    uptime_s: float
    cache: CacheStats | None
    store: StoreStats | None
    store_read_only: bool = False
    serving: ServingSnapshot | None = None


@dataclass(frozen=True, slots=True)
class FlushOutcome:
    persisted_pages: int
    failed_pages: int


class AdminBackend(ABC):
    """What the routes call. Thread-safe: routes run on the server's thread pool."""

    kind: BackendKind
    identity: ModelIdentity
    decode: Decode | None = None
    memory_tiers: tuple[Tier, ...] = ()  # MEMORY_TIERS (device, host) for a live cache

    @property
    @abstractmethod
    def data_dir(self) -> Path | None:
        """The store's folder (where a generated admin token is kept); None without a disk tier."""

    @abstractmethod
    def using_store(self, *, write: bool = False) -> AbstractContextManager[ChunkStore]:
        """The chunk store for the length of a ``with`` block. Raises NoDiskTierError,
        StoreUnavailableError, or (``write``) ReadOnlyError."""

    @abstractmethod
    def snapshot(self) -> BackendSnapshot:
        """The current figures (reads only). Raises StoreUnavailableError while a rebuild runs."""

    @abstractmethod
    def is_ready(self) -> bool:
        """Whether requests can be served now."""

    @abstractmethod
    def settings(self) -> dict[str, Any]:
        """The effective settings of the cache (CacheConfig fields), or {} offline."""

    def explicit_settings(self) -> set[str]:
        """The settings the flags or the environment gave explicitly at start (they win over
        persisted overrides); none offline."""
        return set()

    @abstractmethod
    def reconfigure(self, changes: dict[str, Any]) -> None:
        """Apply live-safe setting changes. Raises ValueError (bad value, not live) or UnsupportedError."""

    @abstractmethod
    def flush(self, timeout_s: float | None) -> FlushOutcome:
        """Write what memory holds down to disk (a live cache) and the index's buffered counters."""

    @abstractmethod
    def check_rebuild(self) -> None:
        """Raises BackendError when this backend cannot rebuild its index (a live cache, read-only)."""

    @abstractmethod
    def rebuild(self, progress: Progress) -> RebuildReport:
        """Recreate the store's index from its chunk files. Raises as ``check_rebuild``."""

    # -- memory tiers: a live cache only ---------------------------------------------------------

    def _no_memory(self, tier: Tier | str) -> UnsupportedError:
        return UnsupportedError(f"tier {tier}: this backend has no memory tiers (an offline store); "
                                f"its only tier is disk")

    def resident_keys(self, tier: Tier | str, namespace: str | None = None) -> set[bytes]:
        raise self._no_memory(tier)

    def resident_pages(self, tier: Tier | str, namespace: str | None = None) -> list[ResidentPage]:
        raise self._no_memory(tier)

    def lookups_by_namespace(self) -> dict[str, NamespaceLookups]:
        """Per namespace, the cache's lookups and hit tokens since it started; {} offline."""
        return {}

    def residency_by_namespace(self) -> dict[str, tuple[int, int]]:
        """Per namespace, (device pages, host pages) held in memory; {} offline."""
        return {}

    def evictable_pages(self, tier: Tier | str) -> int:
        raise self._no_memory(tier)

    def cached_pages(self, tier: Tier | str) -> int:
        raise self._no_memory(tier)

    def evict_memory(self, tier: Tier | str, num_pages: int) -> int:
        raise self._no_memory(tier)

    def evict_memory_selected(self, tier: Tier | str, selection: MemorySelection, dry_run: bool) -> MemoryEviction:
        """``TieredCache.evict_selected``: by key (and descendants), namespace or age."""
        raise self._no_memory(tier)

    def clear_memory(self, tier: Tier | str) -> int:
        raise self._no_memory(tier)

    def close(self) -> None:
        """Release what this backend opened (nothing it was given)."""


class StartClock:
    """Uptime of a backend that has no cache counters of its own."""

    def __init__(self) -> None:
        self._started = time.monotonic()

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self._started
