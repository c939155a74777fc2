"""CacheBackend: the management API over a live TieredCache (what `chunkstore serve` mounts).

Invariants: everything goes through the cache's public methods (stats, flush) and its admin
operations (``CacheAdmin``: evict, clear, resident_keys, residency_by_namespace, reconfigure) and
its store's; the store is the cache's own
and is never closed or replaced here, so an index rebuild is refused (it needs the store offline).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from chunkstore.cache.admin import CacheAdmin, MemoryEviction, MemorySelection, ResidentPage
from chunkstore.cache.stats import NamespaceLookups, TierUsage
from chunkstore.cache.tiered import TieredCache
from chunkstore.cache.tiers import MEMORY_TIERS, Tier
from chunkstore.disk.maintenance import Progress, RebuildReport
from chunkstore.disk.store import ChunkStore

from chunkstore.api.backend.base import (
    AdminBackend, BackendError, BackendKind, BackendSnapshot, Decode, FlushOutcome, NoDiskTierError, ReadOnlyError,
    ServingSource, StoreUnavailableError,
)


class CacheBackend(AdminBackend):
    """The running ``cache``; ``decode`` (a tokenizer's decode) lets chunk details show their text;
    ``serving`` (the engine's ``ServingStats.snapshot``, a callable so that this package never
    imports the engine) adds the requests, tokens and latencies served to the stats."""

    kind = BackendKind.CACHE
    memory_tiers = MEMORY_TIERS

    def __init__(self, cache: TieredCache, *, decode: Decode | None = None,
                 serving: ServingSource | None = None) -> None:
        self.cache = cache
        self.admin: CacheAdmin = cache.admin
        self.identity = cache.identity
        self.decode = decode
        self.serving = serving
        self._explicit = set(cache.config.model_fields_set)  # before any reconfigure replaces the config

    @property
    def data_dir(self) -> Path | None:
        return self.cache.store.root if self.cache.store is not None else None

    @contextmanager
    def using_store(self, *, write: bool = False) -> Iterator[ChunkStore]:
        if self.cache.is_closed:
            raise StoreUnavailableError("the cache is closed")
        store = self.cache.store
        if store is None:
            raise NoDiskTierError("this cache has no disk tier (use_disk is off)")
        if write and store.read_only:
            raise ReadOnlyError("the cache's store is open read-only")
        yield store

    def snapshot(self) -> BackendSnapshot:
        if self.cache.is_closed:
            raise StoreUnavailableError("the cache is closed")
        stats = self.cache.stats()
        store = self.cache.store
        return BackendSnapshot(time.time(), stats.uptime_s, stats, store.stats() if store is not None else None,
                               store.read_only if store is not None else False,
                               self.serving() if self.serving is not None else None)

    def is_ready(self) -> bool:
        return not self.cache.is_closed

    def settings(self) -> dict[str, Any]:
        return self.cache.config.model_dump(mode="json")

    def explicit_settings(self) -> set[str]:
        return set(self._explicit)

    def reconfigure(self, changes: dict[str, Any]) -> None:
        self.admin.reconfigure(**changes)

    def flush(self, timeout_s: float | None) -> FlushOutcome:
        result = self.cache.flush(timeout_s)
        if self.cache.store is not None:
            self.cache.store.flush()
        return FlushOutcome(result.persisted_pages, result.failed_pages)

    def check_rebuild(self) -> None:
        raise self._no_rebuild()

    def rebuild(self, progress: Progress) -> RebuildReport:
        raise self._no_rebuild()

    @staticmethod
    def _no_rebuild() -> BackendError:
        return BackendError("rebuilding the index needs the store offline: stop the server, then run "
                            "`chunkstore rebuild` (or `chunkstore admin` and POST /api/v1/jobs/rebuild); on a "
                            "live cache, POST /api/v1/jobs/verify with {\"repair\": true} re-indexes chunk files "
                            "that lost their rows and drops rows whose files are gone")

    # -- memory tiers ----------------------------------------------------------------------------

    def resident_keys(self, tier: Tier | str, namespace: str | None = None) -> set[bytes]:
        return self.admin.resident_keys(tier, namespace)

    def resident_pages(self, tier: Tier | str, namespace: str | None = None) -> list[ResidentPage]:
        return self.admin.resident_pages(tier, namespace)

    def lookups_by_namespace(self) -> dict[str, NamespaceLookups]:
        return self.admin.lookups_by_namespace()

    def residency_by_namespace(self) -> dict[str, tuple[int, int]]:
        return {ns: (r.device_pages, r.host_pages) for ns, r in self.admin.residency_by_namespace().items()}

    def _usage(self, tier: Tier | str) -> TierUsage:
        stats = self.cache.stats()
        return stats.device if Tier.parse_memory(tier) is Tier.DEVICE else stats.host

    def evictable_pages(self, tier: Tier | str) -> int:
        return self._usage(tier).evictable_pages

    def cached_pages(self, tier: Tier | str) -> int:
        return self._usage(tier).cached_pages

    def evict_memory(self, tier: Tier | str, num_pages: int) -> int:
        return self.admin.evict(tier, num_pages)

    def evict_memory_selected(self, tier: Tier | str, selection: MemorySelection, dry_run: bool) -> MemoryEviction:
        return self.admin.evict_selected(tier, selection, dry_run=dry_run)

    def clear_memory(self, tier: Tier | str) -> int:
        return self.admin.clear(tier)
