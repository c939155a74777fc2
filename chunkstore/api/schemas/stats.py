"""The stats family: StatsPublic (GET /stats) and StatsHistory (GET /stats/history), built from one
BackendSnapshot so that the JSON, the history and the metrics show the same figures."""

from __future__ import annotations

import dataclasses

from pydantic import BaseModel, Field

from chunkstore.cache.stats import TierUsage
from chunkstore.disk.results import SERVER_STALE_S, ServerStats, SharedTierStats
from chunkstore.disk.store import NamespaceStats, StoreStats
from chunkstore.disk.write_health import WriteHealth

from chunkstore.api.backend.base import BackendSnapshot
from chunkstore.api.schemas.common import BackendName, TierName


class TierPublic(BaseModel):
    name: TierName
    capacity_bytes: int | None = Field(description="None: unbounded (a disk tier without a capacity)")
    used_bytes: int = Field(description="memory: allocated slots; disk: stored (compressed) bytes")
    cached_bytes: int | None = Field(None, description="memory tiers: bytes the radix tree holds")
    evictable_bytes: int | None = Field(None, description="memory tiers: cached and unlocked")
    locked_bytes: int | None = Field(None, description="memory tiers: cached and locked by requests or transfers")
    num_chunks: int | None = Field(None, description="disk tier: chunk files")

    @classmethod
    def of_memory(cls, name: TierName, u: TierUsage) -> "TierPublic":
        b = u.page_size_bytes
        return cls(name=name, capacity_bytes=u.capacity_pages * b, used_bytes=u.used_pages * b,
                   cached_bytes=u.cached_pages * b, evictable_bytes=u.evictable_pages * b,
                   locked_bytes=u.locked_pages * b)


class HitsPublic(BaseModel):
    lookups: int
    lookup_tokens: int
    hit_tokens: dict[str, int] = Field(description="used cached tokens by the tier they were found on")
    hit_rate: float = Field(description="hit tokens / looked-up tokens")


class PathPublic(BaseModel):
    num_ops: int
    num_pages: int
    num_bytes: int
    failed_pages: int
    total_s: float
    max_s: float
    gbps: float


class WriteHealthPublic(BaseModel):
    """The disk tier's writes since the store was opened (by this process)."""

    degraded: bool = Field(description="the last write to the disk failed and none has succeeded since (a full "
                                       "disk, say): new pages stay in memory only; serving goes on")
    failures: int = Field(description="failed writes: a chunk file, a batch's publish or index commit, an index "
                                      "flush")
    failed_pages: int = Field(description="pages those failures left unwritten")
    last_error: str | None = Field(description="what failed last and why, e.g. 'chunk file: [ENOSPC] No space left "
                                               "on device'")
    last_error_at: float | None = Field(description="epoch seconds of the last failure")
    last_ok_at: float | None = Field(description="epoch seconds of the last write that succeeded")

    @classmethod
    def of(cls, h: WriteHealth) -> "WriteHealthPublic":
        return cls(degraded=h.degraded, failures=h.failures, failed_pages=h.failed_pages, last_error=h.last_error,
                   last_error_at=h.last_error_at, last_ok_at=h.last_ok_at)


class ServerPublic(BaseModel):
    """One server of a shared tier, as the tier's index counts it (since its row was made)."""

    server: str = Field(description="the server's name, host:pid (its writer id adds a part per store)")
    hits: int = Field(description="pages it read from the tier")
    misses: int = Field(description="pages it asked the tier for and did not find (or found damaged)")
    hit_rate: float | None = Field(description="hits / (hits + misses); None before its first lookup")
    published: int = Field(description="rows it added to the tier: its puts' pages (and chunks its repairs or "
                                       "rebuilds re-indexed)")
    dedup_hits: int = Field(description="pages it did not write: stored already, or claimed by another server")
    write_errors: int = Field(description="pages it failed to write")
    first_seen_at: float | None = Field(description="when its counts were first written (None: not yet)")
    last_seen_at: float | None = Field(description="when its counts were last written (a serving server writes "
                                                   "them every few seconds, and with every flush)")
    is_self: bool = Field(description="the server that answers this request")
    is_stale: bool = Field(description="not seen for stale_after_s: idle, or gone (never the server answering)")

    @classmethod
    def of(cls, s: ServerStats) -> "ServerPublic":
        return cls(server=s.server, hits=s.hits, misses=s.misses, hit_rate=s.hit_rate, published=s.published,
                   dedup_hits=s.dedup_hits, write_errors=s.write_errors, first_seen_at=s.first_seen_at,
                   last_seen_at=s.last_seen_at, is_self=s.is_self, is_stale=s.is_stale)


class LocalCopyPublic(BaseModel):
    """This server's local copy of the shared tier's chunks it read (docs/FLEET.md#the-local-copy),
    since it started; the sizes are now's."""

    folder: str = Field(description="where the copies are (shared-cache/ in the server's store folder)")
    capacity_bytes: int = Field(description="the most bytes of copies kept (local_cache_size)")
    size_bytes: int = Field(description="the copies' bytes now")
    entries: int = Field(description="copies now")
    hits: int = Field(description="reads served from a copy (no GET)")
    misses: int = Field(description="reads that went to the bucket")
    fills: int = Field(description="copies written")
    fill_failures: int = Field(description="copies that could not be written (a full disk); the reads still hit")
    dropped: int = Field(description="copies whose digest did not match, removed (the bucket was read instead)")
    evicted: int = Field(description="copies removed to stay within capacity_bytes, least recently read first")

    @classmethod
    def of(cls, s) -> "LocalCopyPublic":
        return cls(folder=s.folder, capacity_bytes=s.capacity_bytes, size_bytes=s.size_bytes, entries=s.entries,
                   hits=s.hits, misses=s.misses, fills=s.fills, fill_failures=s.fill_failures, dropped=s.dropped,
                   evicted=s.evicted)


class BucketListingPublic(BaseModel):
    """The shared tier's bucket as the last sweep (a gc job, on any server) listed it: objects are
    counted only by listing the bucket, so this is as old as that gc."""

    objects: int = Field(description="chunk objects in the bucket once that sweep had deleted its orphans; "
                                     "compare with the tier's chunks (rows)")
    orphans: int = Field(description="of them, with neither row nor claim: too young to delete (an upload about "
                                     "to be committed) or leaks the next sweep removes")
    listed_at: float = Field(description="when the listing ended (unix seconds)")
    listed_by: str = Field(description="the server that ran the sweep (host:pid)")

    @classmethod
    def of(cls, b) -> "BucketListingPublic":
        return cls(objects=b.objects, orphans=b.orphans, listed_at=b.listed_at, listed_by=b.listed_by)


class LockPublic(BaseModel):
    """This server's passes through one of the shared tier's fleet-wide locks since it started
    (the evictor lock, or the room lock). The fleet passes each one at a time: the rate of held_s
    summed over the servers is the lock's utilisation, which bounds the fleet whatever the
    database's cores (docs/FLEET.md#sizing)."""

    acquired: int = Field(description="times this server took it")
    waited_s: float = Field(description="seconds this server spent waiting for it")
    held_s: float = Field(description="seconds this server held it")

    @classmethod
    def of(cls, s) -> "LockPublic":
        return cls(acquired=s.acquired, waited_s=s.waited_s, held_s=s.held_s)


class SealingWorkPublic(BaseModel):
    """A sealed store's sealing in this server since it started: what it sealed, opened and
    named, and the CPU seconds each took (the sealing code's own threads' CPU: key lookups, the
    cipher, buffers). CPU seconds over bytes is what sealing costs per byte (docs/SECURITY.md)."""

    sealed_chunks: int = Field(description="chunks sealed (puts)")
    sealed_bytes: int = Field(description="bytes sealed: the compressed chunk files")
    seal_cpu_s: float = Field(description="CPU seconds sealing took")
    opened_chunks: int = Field(description="sealed chunks opened (loads, verifies), or refused")
    opened_bytes: int = Field(description="bytes of the sealed chunks opened")
    open_cpu_s: float = Field(description="CPU seconds opening took")
    named_keys: int = Field(description="chain keys turned into their keyed stored names (puts and lookups)")
    name_cpu_s: float = Field(description="CPU seconds naming took")

    @classmethod
    def of(cls, w) -> "SealingWorkPublic":
        return cls(**dataclasses.asdict(w))  # the same fields as the store's SealingWork


class SharedTierPublic(BaseModel):
    """A shared tier (many servers on one PostgreSQL index and one bucket, docs/FLEET.md) as this
    server sees it; the disk figures beside it are the whole tier's."""

    payload_store: str = Field(description="the bucket URL every server of the tier names")
    index: str = Field(description="the index's database, its password hidden")
    writer_id: str = Field(description="this server's name in the publish claims")
    server_name: str = Field(description="this server's row in servers (host:pid)")
    claims: int = Field(description="publish claims held now, by any server")
    lapsed_claims: int = Field(description="of them, past their expiry: dead or stalled writers' (gc sweeps them)")
    read_health: WriteHealthPublic = Field(description="this server's failed index lookups and object reads "
                                                       "(the database or the bucket not answering)")
    servers: list[ServerPublic] = Field(description="every server's counts, this one first, then the most "
                                                    "recently seen")
    stale_after_s: float = Field(description="a server not seen for this long is shown stale")
    local_copy: LocalCopyPublic | None = Field(None, description="this server's local copy of what it read "
                                                                 "(none when local_cache_size is 0)")
    bucket: BucketListingPublic | None = Field(None, description="the bucket as the last gc sweep listed it "
                                                                 "(none before the first)")
    evictor_lock: LockPublic = Field(description="this server's waits for the fleet's one evictor lock and holds "
                                                 "of it, since it started (evictions, and bounded puts that must "
                                                 "evict)")
    room_lock: LockPublic = Field(description="this server's waits for the fleet's room lock and holds of it, "
                                              "since it started (each row commit of a put within a capacity)")

    @classmethod
    def of(cls, s: SharedTierStats) -> "SharedTierPublic":
        return cls(payload_store=s.payload_store, index=s.index, writer_id=s.writer_id, server_name=s.server_name,
                   claims=s.claims, lapsed_claims=s.lapsed_claims, read_health=WriteHealthPublic.of(s.read_health),
                   servers=[ServerPublic.of(x) for x in s.servers], stale_after_s=SERVER_STALE_S,
                   local_copy=LocalCopyPublic.of(s.local_copy) if s.local_copy is not None else None,
                   bucket=BucketListingPublic.of(s.bucket) if s.bucket is not None else None,
                   evictor_lock=LockPublic.of(s.evictor_lock), room_lock=LockPublic.of(s.room_lock))


class DiskPublic(BaseModel):
    num_chunks: int
    raw_bytes: int
    stored_bytes: int
    capacity_bytes: int | None = Field(description="the store's capacity, or a namespace's quota")
    compression_ratio: float
    hits: int
    misses: int
    dedup_hits: int
    evictions: int
    quarantined: int
    sealed: bool = Field(False, description="a sealed store: every chunk encrypted and authenticated, named by keyed "
                                            "hashes")
    auth_failures: int = Field(0, description="a sealed store's chunks that failed authentication (forged, damaged, "
                                              "moved or replayed): security events, never served, kept in the index")
    write_errors: int | None = Field(None, description="failed page writes, kept in the index across restarts; "
                                                      "store-wide only")
    write_health: WriteHealthPublic | None = Field(None, description="store-wide only")
    sealing_work: SealingWorkPublic | None = Field(None, description="a sealed store's sealing in this server "
                                                                     "since it started (store-wide only)")
    shared_tier: SharedTierPublic | None = Field(None, description="a shared tier's own figures (store-wide "
                                                                   "only; none for a store of its own)")
    read_only: bool

    @classmethod
    def of_store(cls, s: StoreStats, read_only: bool) -> "DiskPublic":
        return cls(num_chunks=s.num_chunks, raw_bytes=s.raw_bytes, stored_bytes=s.stored_bytes,
                   capacity_bytes=s.capacity_bytes, compression_ratio=s.compression_ratio, hits=s.hits,
                   misses=s.misses, dedup_hits=s.dedup_hits, evictions=s.evictions, quarantined=s.quarantined,
                   sealed=s.sealed, auth_failures=s.auth_failures, write_errors=s.write_errors,
                   write_health=WriteHealthPublic.of(s.write_health),
                   sealing_work=SealingWorkPublic.of(s.sealing_work) if s.sealing_work is not None else None,
                   shared_tier=SharedTierPublic.of(s.shared) if s.shared is not None else None,
                   read_only=read_only)

    @classmethod
    def of_namespace(cls, n: NamespaceStats, read_only: bool) -> "DiskPublic":
        return cls(num_chunks=n.num_chunks, raw_bytes=n.raw_bytes, stored_bytes=n.stored_bytes,
                   capacity_bytes=n.quota_bytes,
                   compression_ratio=n.raw_bytes / n.stored_bytes if n.stored_bytes else 1.0, hits=n.hits,
                   misses=n.misses, dedup_hits=n.dedup_hits, evictions=n.evictions, quarantined=n.quarantined,
                   auth_failures=n.auth_failures, read_only=read_only)


class ServingPublic(BaseModel):
    """What the engine served since the process started (counters; rates come from the deltas of two
    snapshots). Requests count once they complete; tokens and latencies are of finished requests."""

    requests_total: int = Field(description="completed requests: finished (any finish reason) or failed")
    requests_failed: int = Field(description="completed with an error")
    requests_cancelled: int = Field(description="finished as abort: their client went away (a stream cut "
                                                   "or a connection closed while generating), or the server shut down")
    requests_active: int = Field(description="accepted and not completed (queued or running)")
    prompt_tokens_total: int
    cached_tokens_total: int = Field(description="prompt tokens whose KV came from the cache")
    completion_tokens_total: int
    ttft_sum_s: float = Field(description="sum of the times to first token (submit to first token sampled)")
    ttft_count: int = Field(description="requests that sampled a token (the terms of ttft_sum_s)")
    latency_sum_s: float = Field(description="sum of the request latencies (submit to finished)")
    ttft_avg_s: float | None = Field(description="ttft_sum_s / ttft_count; None before the first")

    @classmethod
    def of(cls, s) -> "ServingPublic":
        """From the engine's ``ServingSnapshot`` (read by attribute: the API never imports the engine)."""
        return cls(requests_total=s.requests_total, requests_failed=s.requests_failed,
                   requests_cancelled=s.requests_cancelled,
                   requests_active=s.requests_active, prompt_tokens_total=s.prompt_tokens_total,
                   cached_tokens_total=s.cached_tokens_total, completion_tokens_total=s.completion_tokens_total,
                   ttft_sum_s=s.ttft_sum_s, ttft_count=s.ttft_count, latency_sum_s=s.latency_sum_s,
                   ttft_avg_s=s.ttft_avg_s)


class StatsPublic(BaseModel):
    backend: BackendName
    namespace: str | None = Field(description="set when the figures are one namespace's (a namespace token)")
    taken_at: float = Field(description="epoch seconds")
    uptime_s: float
    tiers: list[TierPublic]
    hits: HitsPublic | None = Field(description="lookups and hits; None offline and for a namespace")
    paths: dict[str, PathPublic] = Field(description="transfers by path (device_to_host, host_to_disk, ...)")
    queue_depths: dict[str, int]
    evicted_pages: dict[str, int]
    backups_skipped: int | None
    disk: DiskPublic | None = Field(description="None without a disk tier")
    serving: ServingPublic | None = Field(None, description="requests, tokens and latencies the engine served; "
                                                              "None without an engine (`chunkstore admin`) and "
                                                              "for a namespace")

    @classmethod
    def of(cls, snap: BackendSnapshot, backend: BackendName, namespace: str | None = None) -> "StatsPublic":
        """Cache-wide figures, or (``namespace``) only that namespace's disk figures."""
        c, s = snap.cache, snap.store
        if namespace is not None:
            found = [n for n in s.namespaces if n.namespace == namespace] if s is not None else []
            disk = DiskPublic.of_namespace(found[0], snap.store_read_only) if found else None
            tiers = [TierPublic(name="disk", capacity_bytes=disk.capacity_bytes, used_bytes=disk.stored_bytes,
                                num_chunks=disk.num_chunks)] if disk else []
            return cls(backend=backend, namespace=namespace, taken_at=snap.taken_at, uptime_s=snap.uptime_s,
                       tiers=tiers, hits=None, paths={}, queue_depths={}, evicted_pages={}, backups_skipped=None,
                       disk=disk)
        tiers = [TierPublic.of_memory("device", c.device), TierPublic.of_memory("host", c.host)] if c else []
        if s is not None:
            tiers.append(TierPublic(name="disk", capacity_bytes=s.capacity_bytes, used_bytes=s.stored_bytes,
                                    num_chunks=s.num_chunks))
        hits = HitsPublic(lookups=c.lookups, lookup_tokens=c.lookup_tokens, hit_tokens=dict(c.hit_tokens),
                          hit_rate=c.hit_rate) if c else None
        paths = {name: PathPublic(num_ops=p.num_ops, num_pages=p.num_pages, num_bytes=p.num_bytes,
                                  failed_pages=p.failed_pages, total_s=p.total_s, max_s=p.max_s, gbps=p.gbps)
                 for name, p in c.paths.items()} if c else {}
        evicted = dict(c.evicted_pages) if c else {}
        if s is not None:
            evicted["disk_chunks"] = s.evictions
        return cls(backend=backend, namespace=None, taken_at=snap.taken_at, uptime_s=snap.uptime_s, tiers=tiers,
                   hits=hits, paths=paths, queue_depths=dict(c.queue_depths) if c else {}, evicted_pages=evicted,
                   backups_skipped=c.backups_skipped if c else None,
                   disk=DiskPublic.of_store(s, snap.store_read_only) if s else None,
                   serving=ServingPublic.of(snap.serving) if snap.serving is not None else None)


class HistorySample(BaseModel):
    """One sample; memory-tier and lookup figures are None offline. Counters are cumulative since the
    process started (``uptime_s``), so a sample whose uptime went down follows a restart."""

    sampled_at: float
    uptime_s: float
    device_used_bytes: int | None
    device_capacity_bytes: int | None
    host_used_bytes: int | None
    host_capacity_bytes: int | None
    disk_stored_bytes: int | None
    disk_raw_bytes: int | None
    disk_capacity_bytes: int | None
    disk_chunks: int | None
    lookups: int | None
    lookup_tokens: int | None
    hit_tokens_device: int | None
    hit_tokens_host: int | None
    hit_tokens_disk: int | None
    bytes_device_to_host: int | None
    bytes_host_to_disk: int | None
    bytes_disk_to_host: int | None
    bytes_host_to_device: int | None
    evicted_device_pages: int | None
    evicted_host_pages: int | None
    disk_evictions: int | None
    disk_hits: int | None
    disk_misses: int | None
    requests_total: int | None = Field(None, description="serving counters (None without an engine, and in "
                                                          "samples taken before they were recorded)")
    completion_tokens_total: int | None = None
    ttft_sum_s: float | None = None
    ttft_count: int | None = None


class StatsHistory(BaseModel):
    interval_s: float
    max_rows: int
    is_recording: bool = Field(description="False without a writable disk tier: nothing is being sampled")
    server: str = Field("", description="the key of the server whose samples these are: '' for a store of its "
                                        "own, on a shared tier its host name and store folder")
    samples: list[HistorySample]
