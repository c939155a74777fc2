"""The tiered cache's statistics: thread-safe counters, and the plain frozen snapshot the API serves.

Invariants: counters only grow (a snapshot minus an earlier one is the activity between them);
every update and every snapshot happens under one lock, so a snapshot is never half of an update;
snapshots are plain dataclasses of numbers and strings (tiers and paths are str enums, keyed as
their names; ``as_dict`` gives JSON-ready data);
latency histograms have fixed bucket bounds (``LATENCY_BUCKETS_S``), so recording one costs a
bisect and a tuple copy.
"""

from __future__ import annotations

import bisect
import dataclasses
import threading
import time
from dataclasses import dataclass, field

from chunkstore.cache.ops import Ack, TransferPath
from chunkstore.cache.tiers import ALL_TIERS, MEMORY_TIERS, Tier

HIT_TIERS: tuple[Tier, ...] = ALL_TIERS  # where a used cached token was found: device, host, disk
# Upper bounds (seconds) of the latency buckets: transfers (sub-millisecond to seconds) and requests.
# Namespaces counted one by one (lookups by namespace); lookups in namespaces beyond these count
# in the totals only, so a client inventing namespaces cannot grow the counters without bound.
MAX_COUNTED_NAMESPACES = 10_000
LATENCY_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


@dataclass(frozen=True, slots=True)
class Histogram:
    """Observations counted by bucket: ``counts[i]`` are those <= ``bounds[i]`` and above the bound
    before; the last count is above every bound. ``observed`` returns a new histogram."""

    bounds: tuple[float, ...] = LATENCY_BUCKETS_S
    counts: tuple[int, ...] = (0,) * (len(LATENCY_BUCKETS_S) + 1)
    total: float = 0.0  # the sum of the observations

    def __post_init__(self) -> None:
        if len(self.counts) != len(self.bounds) + 1 or list(self.bounds) != sorted(self.bounds):
            raise ValueError("a histogram needs sorted bounds and one count more than bounds")

    @property
    def count(self) -> int:
        return sum(self.counts)

    def observed(self, value: float) -> "Histogram":
        i = bisect.bisect_left(self.bounds, value)
        counts = list(self.counts)
        counts[i] += 1
        return Histogram(self.bounds, tuple(counts), self.total + value)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= it) per bucket, the last bound ``inf`` (Prometheus' form)."""
        out, total = [], 0
        for bound, n in zip((*self.bounds, float("inf")), self.counts):
            total += n
            out.append((bound, total))
        return out


@dataclass(frozen=True, slots=True)
class TierUsage:
    """One memory tier, in pages (``page_size_bytes`` each)."""

    capacity_pages: int
    used_pages: int  # allocated slots (tree-held, in flight, or held by requests)
    cached_pages: int  # held by the tree
    evictable_pages: int  # tree-held and unlocked
    locked_pages: int  # tree-held and locked (by requests or transfers)
    page_size_bytes: int

    @property
    def capacity_bytes(self) -> int:
        return self.capacity_pages * self.page_size_bytes

    @property
    def used_bytes(self) -> int:
        return self.used_pages * self.page_size_bytes


@dataclass(frozen=True, slots=True)
class DiskUsage:
    num_chunks: int
    raw_bytes: int
    stored_bytes: int
    capacity_bytes: int | None
    compression_ratio: float
    quarantined: int
    evictions: int
    write_errors: int = 0  # failed page writes (kept in the index)
    degraded: bool = False  # the last write to the disk failed and none has succeeded since


@dataclass(frozen=True, slots=True)
class PathStats:
    """One transfer path: operations, pages and bytes moved, failures, and wall time."""

    num_ops: int = 0
    num_pages: int = 0
    num_bytes: int = 0
    failed_pages: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    latency: Histogram = field(default_factory=Histogram)  # seconds per transfer (one ack each)

    @property
    def gbps(self) -> float:
        return self.num_bytes / self.total_s / 1e9 if self.total_s > 0 else 0.0


@dataclass(frozen=True, slots=True)
class NamespaceLookups:
    """The lookups of one namespace since the cache started."""

    lookups: int = 0
    lookup_tokens: int = 0
    hit_tokens: int = 0  # used cached tokens, from any tier

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.lookup_tokens if self.lookup_tokens else 0.0


@dataclass(frozen=True, slots=True)
class CacheStats:
    page_size: int
    uptime_s: float
    device: TierUsage
    host: TierUsage
    disk: DiskUsage | None  # None without a disk tier
    lookups: int  # match calls
    lookup_tokens: int  # tokens asked for (the requests' lengths)
    hit_tokens: dict[Tier, int]  # used cached tokens by the tier they were found on (a str enum key)
    paths: dict[str, PathStats]  # by TransferPath value
    queue_depths: dict[str, int]  # queued or running operations, by TransferPath value
    evicted_pages: dict[Tier, int]  # device, host
    backups_skipped: int  # write-throughs not done for want of host room
    # seconds of each lookup of the disk tier's index (the store's longest_prefix): on a shared
    # tier, a round trip to its database on the path before a request's first token
    disk_lookup: Histogram = field(default_factory=Histogram)

    @property
    def hit_rate(self) -> float:
        return sum(self.hit_tokens.values()) / self.lookup_tokens if self.lookup_tokens else 0.0

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["hit_tokens"] = {tier.value: n for tier, n in self.hit_tokens.items()}  # plain str keys
        out["evicted_pages"] = {tier.value: n for tier, n in self.evicted_pages.items()}
        out["hit_rate"] = self.hit_rate
        for name in ("device", "host"):
            usage = getattr(self, name)
            out[name].update(capacity_bytes=usage.capacity_bytes, used_bytes=usage.used_bytes)
        for name, path in self.paths.items():
            out["paths"][name]["gbps"] = path.gbps
        return out


class CacheCounters:
    """What the cache counts as it runs; ``record_*`` from any thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.started_at = time.monotonic()
        self._lookups = 0
        self._lookup_tokens = 0
        self._hit_tokens = dict.fromkeys(HIT_TIERS, 0)
        self._paths = {p.value: PathStats() for p in TransferPath}
        self._evicted: dict[Tier, int] = dict.fromkeys(MEMORY_TIERS, 0)
        self._backups_skipped = 0
        self._by_namespace: dict[str, NamespaceLookups] = {}
        self._disk_lookup = Histogram()

    def record_lookup(self, num_tokens: int, device_tokens: int, host_tokens: int, disk_tokens: int,
                      namespace: str | None = None) -> None:
        with self._lock:
            self._lookups += 1
            self._lookup_tokens += num_tokens
            for tier, n in zip(HIT_TIERS, (device_tokens, host_tokens, disk_tokens)):
                self._hit_tokens[tier] += n
            if namespace is None:
                return
            n = self._by_namespace.get(namespace)
            if n is None:
                if len(self._by_namespace) >= MAX_COUNTED_NAMESPACES:
                    return
                n = NamespaceLookups()
            self._by_namespace[namespace] = NamespaceLookups(
                n.lookups + 1, n.lookup_tokens + num_tokens, n.hit_tokens + device_tokens + host_tokens + disk_tokens)

    def lookups_by_namespace(self) -> dict[str, NamespaceLookups]:
        """Per namespace (the first ``MAX_COUNTED_NAMESPACES`` seen), its lookups since the start."""
        with self._lock:
            return dict(self._by_namespace)

    def record_ack(self, ack: Ack) -> None:
        name = ack.op.path.value
        with self._lock:
            s = self._paths[name]
            self._paths[name] = PathStats(
                num_ops=s.num_ops + (1 if ack.is_last else 0), num_pages=s.num_pages + ack.num_ok,
                num_bytes=s.num_bytes + ack.num_bytes, failed_pages=s.failed_pages + len(ack.ok) - ack.num_ok,
                total_s=s.total_s + ack.elapsed_s, max_s=max(s.max_s, ack.elapsed_s),
                latency=s.latency.observed(ack.elapsed_s))

    def record_eviction(self, tier: Tier | str, num_pages: int) -> None:
        """Count pages evicted from a memory tier. Raises ValueError for another tier."""
        tier = Tier.parse_memory(tier)
        if num_pages:
            with self._lock:
                self._evicted[tier] += num_pages

    def record_disk_lookup(self, seconds: float) -> None:
        with self._lock:
            self._disk_lookup = self._disk_lookup.observed(seconds)

    def record_backup_skipped(self) -> None:
        with self._lock:
            self._backups_skipped += 1

    def snapshot(self, *, page_size: int, device: TierUsage, host: TierUsage, disk: DiskUsage | None,
                 queue_depths: dict[str, int]) -> CacheStats:
        with self._lock:
            return CacheStats(
                page_size=page_size, uptime_s=time.monotonic() - self.started_at, device=device, host=host,
                disk=disk, lookups=self._lookups, lookup_tokens=self._lookup_tokens,
                hit_tokens=dict(self._hit_tokens), paths=dict(self._paths), queue_depths=queue_depths,
                evicted_pages=dict(self._evicted), backups_skipped=self._backups_skipped,
                disk_lookup=self._disk_lookup)
