"""Prometheus metrics: the backend's figures read at each scrape, plus the API's own request latencies.

Invariants: one registry per app (nothing global, so apps and tests never share counters); every
metric name starts with ``chunkstore_``; cache and serving counters are exposed as counters (they
only grow within a process), usage as gauges, and the latency buckets counted by the cache and the
engine as histograms; a scrape that cannot read the backend exposes the request
metrics only, never an error.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from chunkstore.api.backend.base import AdminBackend, BackendError

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_REQUEST_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def _gauge(name: str, doc: str, labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"chunkstore_{name}", doc, labels=list(labels))


def _counter(name: str, doc: str, labels: tuple[str, ...] = ()) -> CounterMetricFamily:
    return CounterMetricFamily(f"chunkstore_{name}", doc, labels=list(labels))


def _histogram(name: str, doc: str, labels: tuple[str, ...] = ()) -> HistogramMetricFamily:
    return HistogramMetricFamily(f"chunkstore_{name}", doc, labels=list(labels))


def _add_histogram(family: HistogramMetricFamily, labels: list[str], h) -> None:
    """``h``: a chunkstore.cache.stats.Histogram (fixed buckets, counted where the figure is made)."""
    buckets = [("+Inf" if bound == float("inf") else repr(float(bound)), n) for bound, n in h.cumulative()]
    family.add_metric(labels, buckets, h.total)


class SnapshotCollector(Collector):
    """Reads one backend snapshot per scrape."""

    def __init__(self, backend: AdminBackend) -> None:
        self.backend = backend

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.backend.snapshot()
        except BackendError:
            return
        up = _gauge("uptime_seconds", "seconds since the cache (or the admin API over a store) started")
        up.add_metric([], snap.uptime_s)
        yield up
        c, s = snap.cache, snap.store
        if c is not None:
            yield from self._cache(c)
        if s is not None:
            yield from self._store(s)
        if snap.serving is not None:
            yield from self._serving(snap.serving)

    @staticmethod
    def _cache(c) -> Iterator[Metric]:
        lookups = _counter("lookups", "prefix lookups (match calls)")
        lookups.add_metric([], c.lookups)
        tokens = _counter("lookup_tokens", "tokens looked up")
        tokens.add_metric([], c.lookup_tokens)
        hits = _counter("hit_tokens", "cached tokens used, by the tier they were found on", ("tier",))
        for tier, n in c.hit_tokens.items():
            hits.add_metric([tier], n)
        rate = _gauge("hit_rate", "hit tokens / looked-up tokens since start")
        rate.add_metric([], c.hit_rate)
        yield from (lookups, tokens, hits, rate)
        families = {
            "bytes": _counter("transfer_bytes", "bytes moved, by path", ("path",)),
            "pages": _counter("transfer_pages", "pages moved, by path", ("path",)),
            "ops": _counter("transfer_ops", "transfer operations completed, by path", ("path",)),
            "failed": _counter("transfer_failed_pages", "pages a transfer failed to move, by path", ("path",)),
        }
        seconds = _histogram("transfer_seconds", "wall time of each transfer, by path (its _sum: all the time "
                                                 "spent moving pages)", ("path",))
        longest = _gauge("transfer_max_seconds", "longest single transfer, by path", ("path",))
        queue = _gauge("queue_depth", "operations queued or running, by path", ("path",))
        for path, p in c.paths.items():
            for family, value in zip(families.values(), (p.num_bytes, p.num_pages, p.num_ops, p.failed_pages)):
                family.add_metric([path], value)
            _add_histogram(seconds, [path], p.latency)
            longest.add_metric([path], p.max_s)
            queue.add_metric([path], c.queue_depths.get(path, 0))
        yield from families.values()
        yield from (seconds, longest, queue)
        usage = {
            "capacity": _gauge("tier_capacity_bytes", "capacity of a tier", ("tier",)),
            "used": _gauge("tier_used_bytes", "allocated bytes of a tier", ("tier",)),
            "cached": _gauge("tier_cached_bytes", "bytes the radix tree holds on a memory tier", ("tier",)),
            "evictable": _gauge("tier_evictable_bytes", "unlocked cached bytes of a memory tier", ("tier",)),
            "locked": _gauge("tier_locked_bytes", "locked cached bytes of a memory tier", ("tier",)),
        }
        for tier, u in (("device", c.device), ("host", c.host)):
            b = u.page_size_bytes
            for family, pages in zip(usage.values(), (u.capacity_pages, u.used_pages, u.cached_pages,
                                                      u.evictable_pages, u.locked_pages)):
                family.add_metric([tier], pages * b)
        yield from usage.values()
        evicted = _counter("evicted_pages", "pages evicted from a memory tier", ("tier",))
        for tier, n in c.evicted_pages.items():
            evicted.add_metric([tier], n)
        skipped = _counter("backups_skipped", "write-throughs not done for want of host room")
        skipped.add_metric([], c.backups_skipped)
        yield from (evicted, skipped)
        if c.disk is not None:
            lookup = _histogram("disk_lookup_seconds", "wall time of each lookup of the disk tier's index (on a "
                                                       "shared tier, a round trip to its database)")
            _add_histogram(lookup, [], c.disk_lookup)
            yield lookup

    @staticmethod
    def _serving(v) -> Iterator[Metric]:
        """The engine's ServingSnapshot (requests completed since the process started)."""
        for name, value, doc in (
                ("requests", v.requests_total, "requests completed (finished or failed)"),
                ("requests_failed", v.requests_failed, "requests completed with an error"),
                ("requests_cancelled", v.requests_cancelled, "requests ended as abort: their client went away, "
                                                             "or the server shut down"),
                ("prompt_tokens", v.prompt_tokens_total, "prompt tokens of finished requests"),
                ("cached_tokens", v.cached_tokens_total, "prompt tokens whose KV came from the cache"),
                ("completion_tokens", v.completion_tokens_total, "tokens generated by finished requests")):
            family = _counter(name, doc)
            family.add_metric([], value)
            yield family
        active = _gauge("requests_active", "requests accepted and not completed (queued or running)")
        active.add_metric([], v.requests_active)
        yield active
        ttft = _histogram("ttft_seconds", "time to first token: submit to the first token sampled")
        _add_histogram(ttft, [], v.ttft)
        latency = _histogram("request_latency_seconds", "request latency: submit to finished")
        _add_histogram(latency, [], v.latency)
        yield from (ttft, latency)

    @staticmethod
    def _store(s) -> Iterator[Metric]:
        used = _gauge("disk_stored_bytes", "stored (compressed) bytes of the disk tier")
        used.add_metric([], s.stored_bytes)
        raw = _gauge("disk_raw_bytes", "raw bytes of the chunks on disk")
        raw.add_metric([], s.raw_bytes)
        chunks = _gauge("disk_chunks", "chunks on disk")
        chunks.add_metric([], s.num_chunks)
        ratio = _gauge("disk_compression_ratio", "raw / stored bytes")
        ratio.add_metric([], s.compression_ratio)
        sealed = _gauge("disk_sealed", "1 for a sealed store (chunks encrypted and authenticated)")
        sealed.add_metric([], 1 if s.sealed else 0)
        yield from (used, raw, chunks, ratio, sealed)
        if s.capacity_bytes is not None:
            cap = _gauge("disk_capacity_bytes", "capacity of the disk tier in stored bytes")
            cap.add_metric([], s.capacity_bytes)
            yield cap
        for name, value, doc in (("disk_hits", s.hits, "chunks loaded"), ("disk_misses", s.misses, "chunks missed"),
                                 ("disk_dedup_hits", s.dedup_hits, "puts of chunks already stored"),
                                 ("disk_evictions", s.evictions, "chunks evicted"),
                                 ("disk_quarantined", s.quarantined, "corrupt chunks moved to quarantine"),
                                 ("disk_auth_failures", s.auth_failures,
                                  "sealed chunks that failed authentication: security events, never served"),
                                 ("disk_write_errors", s.write_errors, "chunk writes that failed")):
            family = _counter(name, doc + " (persists across restarts)")
            family.add_metric([], value)
            yield family
        yield from SnapshotCollector._write_health(s.write_health)
        if s.sealing_work is not None:
            yield from SnapshotCollector._sealing(s.sealing_work)
        if s.shared is not None:
            yield from SnapshotCollector._lock("evictor_lock", "evictor lock", s.shared.evictor_lock)
            yield from SnapshotCollector._lock("room_lock", "room lock (bounded row commits)", s.shared.room_lock)

    @staticmethod
    def _sealing(w) -> Iterator[Metric]:
        """A sealed store's sealing since the server started: the rate of a ``*_cpu_seconds`` over
        its bytes' rate is what sealing costs a byte, the cores it takes at the server's load."""
        for name, value, doc in (("disk_sealed_bytes", w.sealed_bytes, "bytes of chunk files sealed"),
                                 ("disk_seal_cpu_seconds", w.seal_cpu_s, "CPU seconds spent sealing chunks"),
                                 ("disk_opened_bytes", w.opened_bytes, "bytes of sealed chunks opened"),
                                 ("disk_open_cpu_seconds", w.open_cpu_s, "CPU seconds spent opening sealed chunks"),
                                 ("disk_named_keys", w.named_keys, "chain keys turned into keyed stored names"),
                                 ("disk_name_cpu_seconds", w.name_cpu_s, "CPU seconds spent naming keys")):
            family = _counter(name, doc + " (since the server started)")
            family.add_metric([], value)
            yield family

    @staticmethod
    def _lock(prefix: str, what: str, lock) -> Iterator[Metric]:
        """One of a shared tier's fleet-wide locks, this server's passes since it started: the rate
        of ``held_seconds`` summed over the fleet is the lock's utilisation."""
        for name, value, doc in ((f"{prefix}_acquired", lock.acquired, f"times this server took the shared tier's "
                                  f"{what}"),
                                 (f"{prefix}_wait_seconds", lock.waited_s, "seconds this server waited for it"),
                                 (f"{prefix}_held_seconds", lock.held_s, "seconds this server held it")):
            family = _counter(name, doc + " (since the server started)")
            family.add_metric([], value)
            yield family

    @staticmethod
    def _write_health(h) -> Iterator[Metric]:
        """The store's WriteHealth (since this process opened it)."""
        failures = _counter("disk_write_failures", "failed writes to the disk tier since the store was opened "
                                                   "(chunk files, publishes, index commits and flushes)")
        failures.add_metric([], h.failures)
        degraded = _gauge("disk_degraded", "1 while the last write to the disk failed and none has succeeded since")
        degraded.add_metric([], 1 if h.degraded else 0)
        yield from (failures, degraded)
        if h.last_error_at is not None:
            last = _gauge("disk_last_write_failure_timestamp_seconds", "epoch seconds of the last failed write")
            last.add_metric([], h.last_error_at)
            yield last


class AdminMetrics:
    """The registry of one admin app."""

    def __init__(self, backend: AdminBackend) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(SnapshotCollector(backend))
        self.request_seconds = Histogram(
            "chunkstore_admin_request_duration_seconds", "time to the start of each admin API response",
            ("route", "method", "status"), registry=self.registry, buckets=_REQUEST_BUCKETS_S)

    def observe(self, route: str, method: str, status: int, seconds: float) -> None:
        self.request_seconds.labels(route, method, str(status)).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
