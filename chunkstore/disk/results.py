"""What the store's methods return: put and eviction results, and the store's statistics (made
from the index's counters and per-namespace usage by ``store_stats``)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from chunkstore.disk.index import NamespaceUsage, ServerCounts
from chunkstore.disk.index_dialect import LockStats
from chunkstore.disk.write_health import WriteHealth

if TYPE_CHECKING:
    from chunkstore.disk.payload_cache import LocalCopyStats

STORE_WIDE = ""  # counter namespace for events that belong to no known namespace
COUNTER_NAMES = ("hits", "misses", "dedup_hits", "evictions", "quarantined", "write_errors", "auth_failures")
# A server whose counts were not written for this long is shown stale: idle, or gone (its row is
# pruned after chunkstore.disk.index.SERVER_PRUNE_S). A live server writes them at least every few
# seconds while it serves, and with every flush.
SERVER_STALE_S = 900.0


class ReadOnlyStoreError(PermissionError):
    """A mutation asked of a store opened read-only."""


@dataclass(slots=True)
class PutResult:
    stored: list[bytes] = field(default_factory=list)
    deduplicated: list[bytes] = field(default_factory=list)
    failed: dict[bytes, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


@dataclass(frozen=True, slots=True)
class EvictResult:
    num_chunks: int
    stored_bytes: int
    keys: tuple[bytes, ...] = ()


@dataclass(frozen=True, slots=True)
class BucketListing:
    """A shared tier's bucket as its last sweep listed it (ChunkStore.sweep keeps it in the index,
    so every server of the tier shows it): objects are counted only by listing the bucket, which
    no request can afford, so the figure is as old as the last gc."""

    objects: int  # chunk objects in the bucket once the sweep had deleted what it deleted
    orphans: int  # of them, with neither row nor claim: too young to delete (an upload about to be
    #               committed), or leaks the next sweep removes; many that stay say a server leaks
    listed_at: float  # when the listing ended (unix seconds)
    listed_by: str  # the server that swept (host:pid)


BUCKET_LISTING_META = "bucket_listing"  # the index's store_meta row that keeps the last BucketListing


def listing_text(listing: BucketListing) -> str:
    """``listing`` as the JSON text of its store_meta row."""
    return json.dumps(asdict(listing), sort_keys=True)


def listing_of(text: str | None) -> BucketListing | None:
    """The BucketListing a store_meta row holds; None for none, or for one that does not parse (a
    figure, not data: a bad row is shown as no listing, and the next sweep writes it again)."""
    if text is None:
        return None
    try:
        d = json.loads(text)
        return BucketListing(objects=int(d["objects"]), orphans=int(d["orphans"]),
                             listed_at=float(d["listed_at"]), listed_by=str(d["listed_by"]))
    except (ValueError, TypeError, KeyError):
        return None


@dataclass(frozen=True, slots=True)
class SweepResult:
    """What a shared tier's sweep removed (ChunkStore.sweep), and what its listing found."""

    lapsed_claims: int = 0  # claims of writers that died or stalled, taken over and dropped
    objects_deleted: int = 0  # objects without a row: a dead writer's uploads and old orphans
    listing: BucketListing | None = None  # the bucket as the sweep left it (None: not a shared tier)


@dataclass(frozen=True, slots=True)
class NamespaceStats:
    namespace: str
    num_chunks: int
    raw_bytes: int
    stored_bytes: int
    quota_bytes: int | None
    hits: int
    misses: int
    dedup_hits: int
    evictions: int
    quarantined: int
    auth_failures: int = 0  # a sealed store's chunks that failed authentication (security events)


@dataclass(frozen=True, slots=True)
class ServerStats:
    """One server of a shared tier as the index counts it (its row of ``server_counters``, summed
    over namespaces since the row was made)."""

    server: str  # host:pid
    hits: int  # pages it read from the tier
    misses: int  # pages it asked for and did not find (or found damaged)
    published: int  # rows it added to the tier (its puts' pages; chunks its repairs or rebuilds re-indexed)
    dedup_hits: int  # pages it did not write: stored already, or claimed by another server
    write_errors: int  # pages it failed to write
    first_seen_at: float | None  # when its counts were first written (None: not written yet)
    last_seen_at: float | None  # when its counts were last written
    is_self: bool  # the server these statistics come from
    is_stale: bool  # not written for SERVER_STALE_S (never this server's own)

    @property
    def hit_rate(self) -> float | None:
        """hits / (hits + misses); None before its first lookup."""
        looked = self.hits + self.misses
        return self.hits / looked if looked else None


def server_stats(counts: Iterable[ServerCounts], this_server: str, now: float,
                 stale_s: float = SERVER_STALE_S) -> tuple[ServerStats, ...]:
    """The per-server figures of the index's rows: this server first, then by last seen, newest first."""
    out = [ServerStats(server=c.server, hits=c.hits, misses=c.misses, published=c.published, dedup_hits=c.dedup_hits,
                       write_errors=c.write_errors, first_seen_at=c.first_seen_at, last_seen_at=c.last_seen_at,
                       is_self=c.server == this_server,
                       is_stale=c.server != this_server and (c.last_seen_at is None or now - c.last_seen_at > stale_s))
           for c in counts]
    return tuple(sorted(out, key=lambda s: (not s.is_self, -(s.last_seen_at or 0.0), s.server)))


@dataclass(frozen=True, slots=True)
class SharedTierStats:
    """A shared tier as one of its servers sees it (StoreStats.shared); the rows and bytes of
    StoreStats are the whole tier's."""

    payload_store: str  # the bucket URL every server names
    index: str  # the database, its password hidden
    writer_id: str  # this server's name in the publish claims
    claims: int  # publish claims held now, by any server
    lapsed_claims: int  # of them, past their expiry (dead or stalled writers; the sweeper's)
    read_health: WriteHealth = WriteHealth()  # this process's failed lookups and reads (an outage)
    server_name: str = ""  # this server's row among ``servers`` (host:pid; writer_id adds a part per store)
    servers: tuple[ServerStats, ...] = ()  # every server's counts (server_stats), this one first
    local_copy: LocalCopyStats | None = None  # this server's local copy of what it read (payload_cache.py)
    bucket: BucketListing | None = None  # the bucket as the last sweep, by any server, listed it (None: never)
    evictor_lock: LockStats = LockStats()  # this process's passes through the fleet's evictor lock
    room_lock: LockStats = LockStats()  # ... and through its room lock (bounded commits within a capacity)


@dataclass(frozen=True, slots=True)
class SealingWork:
    """What a sealed store's sealing did in this process since the store opened: chunks and bytes
    sealed and opened, keys named, and the CPU seconds of each (the calling threads' own CPU
    clocks, around the sealing code alone: key lookups, the cipher, buffers), so its cost is
    read where it is spent rather than as the small difference of two stores' totals."""

    sealed_chunks: int = 0
    sealed_bytes: int = 0  # chunk files (header and compressed planes) sealed
    seal_cpu_s: float = 0.0
    opened_chunks: int = 0  # sealed payloads opened, or refused (a failed open costs its CPU too)
    opened_bytes: int = 0
    open_cpu_s: float = 0.0
    named_keys: int = 0  # chain keys turned into stored names (puts and lookups)
    name_cpu_s: float = 0.0


@dataclass(frozen=True, slots=True)
class StoreStats:
    num_chunks: int
    raw_bytes: int
    stored_bytes: int
    capacity_bytes: int | None
    compression_ratio: float
    hits: int
    misses: int
    dedup_hits: int
    evictions: int
    quarantined: int
    write_errors: int  # failed page writes, kept in the index (across restarts)
    namespaces: tuple[NamespaceStats, ...]
    auth_failures: int = 0  # a sealed store's chunks that failed authentication, kept in the index
    sealed: bool = False  # a sealed store (every chunk encrypted and authenticated, keyring.py)
    sealing_work: SealingWork | None = None  # a sealed store's, in this process (None: not sealed)
    write_health: WriteHealth = WriteHealth()  # this process's view: failures since the store opened
    shared: SharedTierStats | None = None  # a shared tier's own figures; None for a store of its own


def store_stats(counts: dict[tuple[str, str], int], usage: Iterable[NamespaceUsage], capacity_bytes: int | None,
                write_health: WriteHealth) -> StoreStats:
    """The statistics of a store from its counters ((namespace, name) -> value) and usage rows."""
    per_ns = []
    by_ns = {u.namespace: u for u in usage}
    names = (set(by_ns) | {ns for ns, _ in counts}) - {STORE_WIDE}
    for ns in sorted(names):
        u = by_ns.get(ns)
        c = {name: counts.get((ns, name), 0) for name in COUNTER_NAMES}
        per_ns.append(NamespaceStats(
            namespace=ns, num_chunks=u.num_chunks if u else 0, raw_bytes=u.raw_bytes if u else 0,
            stored_bytes=u.stored_bytes if u else 0, quota_bytes=u.quota_bytes if u else None,
            hits=c["hits"], misses=c["misses"], dedup_hits=c["dedup_hits"], evictions=c["evictions"],
            quarantined=c["quarantined"], auth_failures=c["auth_failures"],
        ))
    total = {name: sum(v for (_, n), v in counts.items() if n == name) for name in COUNTER_NAMES}
    raw = sum(n.raw_bytes for n in per_ns)
    stored = sum(n.stored_bytes for n in per_ns)
    return StoreStats(
        num_chunks=sum(n.num_chunks for n in per_ns), raw_bytes=raw, stored_bytes=stored,
        capacity_bytes=capacity_bytes, compression_ratio=raw / stored if stored else 1.0,
        hits=total["hits"], misses=total["misses"], dedup_hits=total["dedup_hits"],
        evictions=total["evictions"], quarantined=total["quarantined"],
        write_errors=total["write_errors"], namespaces=tuple(per_ns), write_health=write_health,
        auth_failures=total["auth_failures"],
    )
