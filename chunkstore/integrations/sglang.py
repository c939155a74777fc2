"""chunkstore as SGLang's HiCache storage tier (L3): a ``HiCacheStorage`` backend over a ChunkStore.

SGLang loads it with ``--hicache-storage-backend dynamic --hicache-storage-backend-extra-config
'{"backend_name": "chunkstore", "module_path": "chunkstore.integrations.sglang", "class_name":
"ChunkstoreHiCache", "interface_v1": 1, "disk_path": "/data/kv"}'`` (docs/INTEGRATIONS.md has the
settings). Invariants: a page is stored under a key bound to the model identity SGLang describes
(model, TP/PP/CP/DP ranks, KV dtype and shape) and the namespace, beside SGLang's own page hash,
so two models, ranks or tenants never share a chunk; every read is verified (a bad chunk is a miss
for it and the pages after it, never wrong bytes); a set returns once its pages are copied out of
the host pool, and the writer thread publishes them (a write that fails is a miss later, never
garbage). What SGLang's tree assumes once a backup is acked holds: it lets go of the node's host
pages and may prefetch them from storage at once, so an acked page is a hit at once, read from its
queued copy until the store has it (as SGLang's own file backend, which writes before it acks).
Uses the store's public methods only.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage, HiCacheStorageConfig

from chunkstore.disk import (DEFAULT_LOCAL_COPY_BYTES, DEFAULT_NAMESPACE, ChunkStore, Codec, Durability, KeyProvider,
                             ModelIdentity, PageRef, engine_pages, store_root)
from chunkstore.disk.namespaces import check_namespace
from chunkstore.integrations.settings import (STORE_KEYS, check_keys, extra_dict, open_reader, open_writer, parsed,
                                             store_fields)
from chunkstore.integrations.writer import PageWriter
from chunkstore.priority import ThreadPriority
from chunkstore.sizes import parse_bytes

log = logging.getLogger(__name__)

BACKEND_NAME = "chunkstore"
CLEAR_FLUSH_TIMEOUT_S = 60.0  # clear runs on SGLang's control path: it waits this long for queued sets
LAYOUTS = ("layer_first", "page_first", "page_first_direct")
# The extra-config keys SGLang itself reads (the factory's and the controller's), left alone here.
# (SGLang's server removes its prefetch keys before the backend sees them; its PD decode offload
# does not, and --file-storage-path adds its own.)
_SGLANG_KEYS = {"backend_name", "module_path", "class_name", "interface_v1", "tp_lcm_size", "prefetch_threshold",
                "prefetch_timeout_base", "prefetch_timeout_per_ki_token", "hicache_storage_pass_prefix_keys",
                "file_storage_path"}


@dataclass(frozen=True, slots=True)
class BackendSettings:
    """What the extra config sets; ``from_extra_config`` raises ValueError naming a bad key and its
    value (a namespace breaking the rule of chunkstore/disk/namespaces.py among them), so a
    backend SGLang cannot use is refused when SGLang builds it."""

    disk_path: Path = Path("chunkstore-data")
    disk_size_bytes: int | None = None  # the store's capacity (None: unbounded)
    namespace: str = DEFAULT_NAMESPACE
    quota_bytes: int | None = None  # this namespace's share of the store
    compression: Codec | None = None  # None: by dtype (zstd_split for 16-bit KV)
    durability: Durability = Durability.FSYNC
    background_priority: ThreadPriority = ThreadPriority.LOW
    max_pending_bytes: int = 1 << 30  # pages copied out and not yet written; a set waits above it
    index_url: str | None = None  # a shared tier's index (PostgreSQL); None: index.db in the store's folder
    object_store: str | None = None  # a shared tier's bucket (s3://bucket/prefix); None: the folder tree
    local_cache_bytes: int = DEFAULT_LOCAL_COPY_BYTES  # with object_store: the local copy of what was read
    seal_key: KeyProvider | None = None  # a sealed store's master key (None: $CHUNKSTORE_SEAL_KEY_FILE's, or unsealed)

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> "BackendSettings":
        extra = extra_dict(extra, "the extra config")
        check_keys(extra, [*STORE_KEYS, "namespace", "quota"], _SGLANG_KEYS, "the extra config")
        kw = store_fields(extra, "the extra config")
        if extra.get("quota") is not None:
            kw["quota_bytes"] = parsed("the extra config", "quota", parse_bytes, extra["quota"])
        if "namespace" in extra:  # the rule every layer keeps (chunkstore/disk/namespaces.py)
            kw["namespace"] = parsed("the extra config", "namespace", check_namespace, extra["namespace"])
        return cls(**kw)


def identity_for(config: HiCacheStorageConfig, host_pool: Any) -> ModelIdentity:
    """The model identity of the pages ``host_pool`` holds on this rank: SGLang's keys name a prefix
    only, so the model, every parallel rank that splits the KV and the pool's geometry go here. An
    MLA model's KV is the same on every tensor-parallel rank (SGLang's "rank-replicated" pools), so
    its identity has no TP rank: every rank reads the one store its storage-writer rank writes; its
    latent row of C values is stored as two halves, (layers, 2, page, 1, C/2), a view of the same
    bytes. Raises ValueError for a pool this backend cannot store (a layout other than LAYOUTS, a K
    width unlike the V width, an odd MLA width, decode-context-parallel shards, a dtype the store
    has no code for)."""
    layout = getattr(host_pool, "layout", None)
    if layout not in LAYOUTS:
        raise ValueError(f"host pool layout {layout!r} is not one of {', '.join(LAYOUTS)}")
    if config.dcp_size > 1:
        raise ValueError("decode-context-parallel KV shards are not supported by the chunkstore backend yet")
    model = config.model_name or "unnamed"
    # TP is the identity's own field; the other ranks that split or replicate the KV go in the id.
    ranks = (f"pp={config.pp_rank}/{config.pp_size}:cp={config.attn_cp_rank}/{config.attn_cp_size}:"
             f"dp={config.dp_rank}")
    dtype = str(host_pool.dtype).removeprefix("torch.")  # ModelIdentity refuses one it has no code for
    if config.is_mla_model:
        width = host_pool.kv_cache_dim
        if width % 2:
            raise ValueError(f"an MLA row of {width} values does not split in two halves")
        return ModelIdentity(model_id=f"sglang:{model}:mla:{ranks}", kv_dtype=dtype, num_layers=host_pool.layer_num,
                             num_kv_heads=1, head_dim=width // 2, page_size=host_pool.page_size,
                             key_scheme="engine")
    if getattr(host_pool, "v_head_dim", host_pool.head_dim) != host_pool.head_dim:
        raise ValueError(f"K width {host_pool.head_dim} and V width {host_pool.v_head_dim} differ")
    return ModelIdentity(model_id=f"sglang:{model}:{ranks}", kv_dtype=dtype, num_layers=host_pool.layer_num,
                         num_kv_heads=host_pool.head_num, head_dim=host_pool.head_dim,
                         page_size=host_pool.page_size, tp_rank=config.tp_rank, tp_size=config.tp_size,
                         key_scheme="engine")


class PageViews:
    """The host pool's pages as tensors of the store's page shape ``(layers, 2, page, heads, dim)``:
    views into the pool's buffer (no copy), for each of SGLang's host layouts, MHA or MLA (whose
    latent row of C values is viewed as two halves of C/2: ``(layers, 2, page, 1, C/2)``), and the
    same for SGLang's flat page (``get_data_page``'s layout-dependent order)."""

    def __init__(self, host_pool: Any, is_mla: bool):
        self.pool, self.layout, self.page_size, self.is_mla = host_pool, host_pool.layout, host_pool.page_size, is_mla
        layers, size = host_pool.layer_num, self.page_size
        if is_mla:
            width = host_pool.kv_cache_dim
            self.flat_shape = {"layer_first": (layers, size, 1, width), "page_first": (size, layers, 1, width),
                               "page_first_direct": (1, layers, size, 1, width)}[self.layout]
        else:
            heads, dim = host_pool.head_num, host_pool.head_dim
            self.flat_shape = {"layer_first": (2, layers, size, heads, dim), "page_first": (2, size, layers, heads, dim),
                               "page_first_direct": (2, 1, layers, size, heads, dim)}[self.layout]

    def page(self, first_slot: int) -> torch.Tensor:
        """The page whose first token slot is ``first_slot`` (page-aligned), as a view."""
        if first_slot % self.page_size:
            raise ValueError(f"host index {first_slot} is not the start of a page of {self.page_size}")
        kv, end = self.pool.kv_buffer, first_slot + self.page_size
        if self.is_mla:  # layer_first (L, slots, 1, C), page_first (slots, L, 1, C), direct (pages, L, P, 1, C)
            if self.layout == "page_first":
                return self._mla(kv[first_slot:end].transpose(0, 1))
            page = kv[:, first_slot:end] if self.layout == "layer_first" else kv[first_slot // self.page_size]
            return self._mla(page)
        if self.layout == "layer_first":  # (2, L, slots, H, D)
            return kv[:, :, first_slot:end].transpose(0, 1)
        if self.layout == "page_first":  # (2, slots, L, H, D)
            return kv[:, first_slot:end].permute(2, 0, 1, 3, 4)
        return kv[:, first_slot // self.page_size].transpose(0, 1)  # (2, pages, L, P, H, D)

    @staticmethod
    def _mla(page: torch.Tensor) -> torch.Tensor:
        """(L, P, 1, C) -> (L, 2, P, 1, C/2): the two halves of each latent row."""
        return page.unflatten(-1, (2, page.shape[-1] // 2)).permute(0, 3, 1, 2, 4)

    def pages(self, host_indices: torch.Tensor, num_pages: int) -> list[torch.Tensor]:
        """The views of the ``num_pages`` pages that ``host_indices`` (token slots, as SGLang
        passes them: ``page_size`` per page) start."""
        if len(host_indices) < num_pages * self.page_size:
            raise ValueError(f"{len(host_indices)} host indices for {num_pages} pages of {self.page_size}")
        firsts = host_indices[::self.page_size][:num_pages].tolist()
        return [self.page(int(s)) for s in firsts]

    def from_flat(self, flat: torch.Tensor) -> torch.Tensor:
        """SGLang's flat page (``get_data_page(flat=True)``) as a page-shaped view."""
        page = flat.view(self.flat_shape)
        if self.is_mla:
            if self.layout == "page_first":
                return self._mla(page.transpose(0, 1))
            return self._mla(page if self.layout == "layer_first" else page[0])
        if self.layout == "layer_first":
            return page.transpose(0, 1)
        if self.layout == "page_first":
            return page.permute(2, 0, 1, 3, 4)
        return page[:, 0].transpose(0, 1)


@dataclass(slots=True)
class _Counters:
    """SGLang's storage metrics since the last ``get_stats``: pages per call and GB/s."""

    prefetch_pgs: list[int] = field(default_factory=list)
    backup_pgs: list[int] = field(default_factory=list)
    prefetch_bandwidth: list[float] = field(default_factory=list)
    backup_bandwidth: list[float] = field(default_factory=list)


class ChunkstoreHiCache(HiCacheStorage):
    """SGLang's L3 storage on a chunkstore ChunkStore. Thread-safe (SGLang calls it from its
    prefetch and backup threads at once). The store opens once the host pool is registered (its
    geometry is the identity): for writing on SGLang's storage-writer rank, read-only on the
    others (MLA replicas, which read what the writer rank stores: until it has made the store,
    every page is a miss there)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: dict | None = None):
        self.storage_config = storage_config
        self.settings = BackendSettings.from_extra_config(storage_config.extra_config)
        self.is_writer = storage_config.is_storage_writer
        self.store: ChunkStore | None = None
        self.identity: ModelIdentity | None = None
        self.views: PageViews | None = None
        self._root: Path | None = None
        self._opening = threading.Lock()
        self._counting = threading.Lock()  # guards the counters
        self._counters = _Counters()
        self._is_closed = False
        self._writer: PageWriter | None = None

    # ---- set-up ----------------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Open the store of this rank's identity in ``disk_path`` (``store_root``: one data folder
        holds any model and rank) and, on the writer rank, start the writer. Raises ValueError for a
        pool it cannot store, and what ChunkStore raises (a store that another process is writing:
        StoreBusyError)."""
        super().register_mem_pool_host(mem_pool_host)
        identity = identity_for(self.storage_config, mem_pool_host)
        self.views = PageViews(mem_pool_host, self.storage_config.is_mla_model)
        self.identity = identity
        self._root = store_root(self.settings.disk_path, identity)
        if self.is_writer:
            s = self.settings
            self.store = open_writer(s, identity)
            self._root = self.store.root
            if s.quota_bytes is not None:
                self.store.set_quota(s.namespace, s.quota_bytes)
            self._writer = PageWriter(self.store, priority=s.background_priority,
                                      max_pending_bytes=s.max_pending_bytes, name="chunkstore-sglang-writer")
        log.info("chunkstore HiCache backend: %s at %s (%s)", identity.model_id, self._root,
                 "writer" if self.is_writer else "reader")

    def _reader(self) -> ChunkStore | None:
        """The store to read; on a reader rank opened read-only once the writer rank has made it
        (None before). Raises RuntimeError before the host pool is registered."""
        if self.identity is None:
            raise RuntimeError("the chunkstore backend has no host pool registered yet")
        if self.store is None:
            with self._opening:
                if self.store is None and not self._is_closed:
                    # looked up each time: the writer rank decides the folder when it makes it
                    self.store = open_reader(self.settings, self.identity)
        return self.store

    def _pages(self, keys: Sequence[str]) -> list[PageRef]:
        if self.identity is None:
            raise RuntimeError("the chunkstore backend has no host pool registered yet")
        return engine_pages(self.identity, [bytes.fromhex(k) for k in keys], self.settings.namespace)

    # ---- the zero-copy interface (interface_v1) --------------------------------------------------

    def _stored_prefix(self, store: ChunkStore, pages: list[PageRef]) -> int:
        """How many of ``pages``, from the first, are stored or queued to be (one index query when
        nothing is queued)."""
        keys = [p.key for p in pages]
        n = store.longest_prefix(keys, self.settings.namespace)
        while self._writer is not None and n < len(keys):
            queued = self._writer.pending(keys[n:])
            num_queued = next((i for i, copy in enumerate(queued) if copy is None), len(queued))
            if not num_queued:
                break
            n += num_queued
            if n < len(keys):
                n += store.longest_prefix(keys[n:], self.settings.namespace)
        return n

    def _read_into(self, store: ChunkStore, pages: list[PageRef], outs: list[torch.Tensor]) -> list[bool]:
        """Each page into its tensor of ``outs``: a page still queued for the writer from its copy
        (what an acked backup promised), the others from the store (verified); whether each was
        found."""
        queued = self._writer.pending([p.key for p in pages]) if self._writer is not None else [None] * len(pages)
        hits = [copy is not None for copy in queued]
        for out, copy in zip(outs, queued):
            if copy is not None:
                out.copy_(copy)
        rest = [i for i, hit in enumerate(hits) if not hit]
        if rest:
            for i, hit in zip(rest, store.get_into([pages[i] for i in rest], [outs[i] for i in rest])):
                hits[i] = hit
        return hits

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many of ``keys``, from the first, are stored or queued to be (acked: SGLang may
        have let go of the host copy already): one index query."""
        store = self._reader()
        if not keys or store is None:
            return 0
        return self._stored_prefix(store, self._pages(keys))

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Read ``keys`` into the host pool's pages at ``host_indices`` (in place, verified, on the
        store's read threads). A page after a miss is reported missed too (SGLang uses the
        contiguous prefix only)."""
        store = self._reader()
        if not keys or store is None:
            return [False] * len(keys)
        started = time.perf_counter()
        pages = self._pages(keys)
        hits = self._read_into(store, pages, self.views.pages(host_indices, len(keys)))
        if False in hits:
            first = hits.index(False)
            hits = hits[:first] + [False] * (len(hits) - first)
        self._count(self._counters.prefetch_pgs, self._counters.prefetch_bandwidth, sum(hits), started)
        return hits

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor, extra_info: Any = None) -> list[bool]:
        """Copy the pages at ``host_indices`` out of the host pool and queue them for the writer;
        returns once copied (waits first while ``max_pending`` bytes are queued). A rank that is
        not SGLang's storage writer (MLA replicas) stores nothing and reports success."""
        if not keys:
            return []
        if not self.is_writer:
            return [True] * len(keys)
        started = time.perf_counter()
        copies = [v.clone(memory_format=torch.contiguous_format) for v in self.views.pages(host_indices, len(keys))]
        self._writer.submit(self._pages(keys), copies)
        self._count(self._counters.backup_pgs, self._counters.backup_bandwidth, len(keys), started)
        return [True] * len(keys)

    # ---- the copying interface -------------------------------------------------------------------

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> torch.Tensor | None:
        got = self.batch_get([key], [target_location] if target_location is not None else None)
        return got[0]

    def batch_get(self, keys: list[str], target_locations: Any = None,
                  target_sizes: Any = None) -> list[torch.Tensor | None]:
        """Each key's page as SGLang's flat page (into ``target_locations`` when given), or None;
        None for every page after the first miss."""
        store = self._reader()
        if not keys or store is None:
            return [None] * len(keys)
        started = time.perf_counter()
        flats = list(target_locations) if target_locations is not None else [
            torch.empty(self.views.flat_shape, dtype=store.torch_dtype).flatten() for _ in keys]
        hits = self._read_into(store, self._pages(keys), [self.views.from_flat(f) for f in flats])
        out: list[torch.Tensor | None] = []
        for flat, hit in zip(flats, hits):
            if not hit or (out and out[-1] is None):
                out.append(None)
            else:
                out.append(flat)
        self._count(self._counters.prefetch_pgs, self._counters.prefetch_bandwidth,
                    sum(o is not None for o in out), started)
        return out

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Store SGLang's flat pages ``values`` (copied, then written by the writer thread)."""
        if not keys:
            return True
        if not self.is_writer:
            return True
        if values is None or len(values) != len(keys):
            raise ValueError(f"{len(keys)} keys but {0 if values is None else len(values)} values")
        started = time.perf_counter()
        # Always a copy of our own: a flat page may be a view of the host pool (MLA, page_first), and
        # the writer encodes it later, after SGLang may have reused the slot.
        copies = [self.views.from_flat(v.detach().to("cpu")).clone(memory_format=torch.contiguous_format)
                  for v in values]
        self._writer.submit(self._pages(keys), copies)
        self._count(self._counters.backup_pgs, self._counters.backup_bandwidth, len(keys), started)
        return True

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # ---- maintenance and metrics -----------------------------------------------------------------

    def clear(self) -> bool:
        """Drop every page of this backend's namespace (after the queued writes land); on a reader
        rank nothing (the writer rank's clear does it)."""
        if not self.flush(timeout_s=CLEAR_FLUSH_TIMEOUT_S):
            log.warning("chunkstore: clear did not wait for every queued set; later ones may stay stored")
        if self.is_writer and self.store is not None:
            self.store.delete_namespace(self.settings.namespace)
        return True

    def get_stats(self):
        """SGLang's ``StorageMetrics`` since the last call: pages per get/set call and GB/s."""
        from sglang.srt.observability.metrics_collector import StorageMetrics

        metrics = StorageMetrics()
        with self._counting:
            counters, self._counters = self._counters, _Counters()
        metrics.prefetch_pgs.extend(counters.prefetch_pgs)
        metrics.backup_pgs.extend(counters.backup_pgs)
        metrics.prefetch_bandwidth.extend(counters.prefetch_bandwidth)
        metrics.backup_bandwidth.extend(counters.backup_bandwidth)
        return metrics

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued set is written (published or failed); False on timeout."""
        return self._writer.flush(timeout_s) if self._writer is not None else True

    def close(self) -> None:
        """Write what is queued, stop the writer, close the store. Idempotent."""
        with self._opening:
            if self._is_closed:
                return
            self._is_closed = True
        if self._writer is not None:
            self._writer.close()
        with self._opening:
            if self.store is not None:
                self.store.close()

    def _count(self, pages_list: list[int], bandwidth: list[float], num_pages: int, started: float) -> None:
        if not self.storage_config.enable_storage_metrics:
            return
        elapsed = max(time.perf_counter() - started, 1e-9)
        with self._counting:
            pages_list.append(num_pages)
            bandwidth.append(num_pages * self.identity.page_size_bytes / elapsed / 1e9)
