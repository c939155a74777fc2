"""ChunkstoreConnector: chunkstore's tiered cache under vLLM's KV cache, as a ``KVConnectorBase_V1``.

Invariants: a vLLM block of a request is one chunkstore page, keyed by chunkstore's own chain over
its tokens from a root that binds the rank's model identity (options.py) and the namespace (the
request's ``cache_salt``: two salts never share a block); the scheduler reports as matched only
whole blocks that every rank holding the KV can load (its host tier when the worker shares the
scheduler's process, else the stores' indexes), never the prompt's last token; it records per
step the loads (matched and allocated) and the saves (blocks of the request's tokens, prompt and
output, that the step's forward completes), sending token ids, never keys, so each rank keys its
pages with its own identity; a load that fails is reported as block errors (vLLM recomputes
them); a request whose synchronous load failed saves nothing until vLLM has recomputed those
blocks (its forwards ran on top of them); requests whose token ids do not name their KV are
neither looked up nor saved, nor are models whose KV cache is not one group of full attention.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                             KVConnectorRole)

from chunkstore.cache.config import CacheConfig
from chunkstore.cache.policies import WritePolicy
from chunkstore.cache.tiered import TieredCache
from chunkstore.disk import ChunkStore, ModelIdentity, chain_pages, store_root
from chunkstore.integrations.settings import open_reader, open_writer
from chunkstore.integrations.vllm.options import (ConnectorSettings, check_kv_cache_groups, identity_for, is_mla,
                                                  is_writer, namespace_for, store_ranks)
from chunkstore.integrations.vllm.paged_kv import PagedKV
from chunkstore.integrations.vllm.transfers import BlockTransfer, WorkerTransfers, local_cache

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)


@dataclass
class ChunkstoreConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class _Match:
    """A lookup: the pages vLLM had computed, and the tokens found in memory and in all."""

    computed_pages: int
    memory_tokens: int
    found_tokens: int


@dataclass(slots=True)
class _Tracked:
    """A running request (the scheduler's live object: its token ids grow as it decodes), its
    namespace, its blocks, and how many of its pages are saved."""

    request: "Request"
    namespace: str
    block_ids: list[int]
    num_saved: int


def cache_config(settings: ConnectorSettings, identity: ModelIdentity, vllm_config: "VllmConfig") -> CacheConfig:
    """The tiered cache of a writing rank: a staging pool on vLLM's device that holds two of the
    longest prompts by default (a load holds its whole prefix there while it copies), the host
    tier (twice that by default), write-through to the store. Raises ValueError for sizes that do
    not fit together."""
    pages = 2 * -(-vllm_config.model_config.max_model_len // identity.page_size)
    return CacheConfig(page_size=identity.page_size, device_size=settings.device_size or f"{pages}pages",
                       host_size=settings.host_size, disk_path=settings.disk_path,
                       write_policy=WritePolicy.WRITE_THROUGH, background_priority=settings.background_priority,
                       prefetch_host_share=0.0)


class ChunkstoreConnector(KVConnectorBase_V1):
    """The scheduler side looks up and plans; the worker side (one per TP rank) moves the blocks
    through its WorkerTransfers."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.settings = ConnectorSettings.from_extra_config(self._kv_transfer_config.kv_connector_extra_config)
        check_kv_cache_groups(kv_cache_config)
        self.block_size = vllm_config.cache_config.block_size
        self.identity = identity_for(vllm_config, tp_rank=0)
        if role == KVConnectorRole.SCHEDULER and self._kv_transfer_config.kv_load_failure_policy != "recompute":
            log.warning("chunkstore: kv_load_failure_policy is %r: a block that fails to load (a damaged "
                        "chunk) fails its request; \"recompute\" recomputes it",
                        self._kv_transfer_config.kv_load_failure_policy)
        # scheduler side
        self._readers: dict[int, ChunkStore] = {}  # TP rank -> its store, read-only, once it exists
        self._local_root: str | None = None  # the store folder of the worker in this process
        self._opening = threading.Lock()
        self._matched: dict[str, _Match] = {}
        self._loads: list[BlockTransfer] = []
        self._tracked: dict[str, _Tracked] = {}
        self._namespaces: dict[str, str] = {}  # req_id -> namespace (of its cache_salt), until it finishes
        self._requests: dict[str, "Request"] = {}
        self._last_match: dict[str, _Match] = {}  # req_id -> the lookup its load came from (for vLLM's metrics)
        # worker side
        self.transfers: WorkerTransfers | None = None

    # ---- scheduler side ------------------------------------------------------------------------------

    @staticmethod
    def is_cacheable(request: Any) -> bool:
        """Whether a request's KV is named by its token ids alone: not with images or other
        multimodal inputs (their placeholder tokens repeat across inputs), prompt embeddings or a
        LoRA adapter, whose KV the token ids do not determine. Works on a ``Request`` and on the
        scheduler's ``NewRequestData``."""
        return not (getattr(request, "mm_features", None) or getattr(request, "lora_request", None)
                    or getattr(request, "prompt_embeds", None) is not None)

    def get_num_new_matched_tokens(self, request: "Request", num_computed_tokens: int) -> tuple[int, bool]:
        """The prompt tokens past ``num_computed_tokens`` in whole blocks that can be loaded, never
        the prompt's last token (vLLM needs its logits), and whether they load asynchronously. A
        lookup that fails is no match (logged), never an error in vLLM's scheduler."""
        if not self.is_cacheable(request):
            return 0, False
        namespace = namespace_for(getattr(request, "cache_salt", None))
        self._namespaces[request.request_id] = namespace
        self._requests[request.request_id] = request
        tokens = list(request.prompt_token_ids or [])
        lookable = max(len(tokens) - 1, 0) // self.block_size
        computed = num_computed_tokens // self.block_size
        memory = found = 0
        if lookable > computed:
            try:
                memory, found = self._loadable_tokens(tokens[:lookable * self.block_size], namespace)
            except Exception:  # an index mid-creation, a damaged database: recompute
                log.exception("chunkstore: lookup failed; the request is computed")
        self._matched[request.request_id] = _Match(computed, memory, found)
        matched = max(found - num_computed_tokens, 0)
        return matched, self.settings.async_load and matched > 0

    def get_external_cache_hit_sources(self, request: "Request", num_external_tokens: int) -> dict:
        """vLLM's hit metrics by tier: what the lookup found in the cache's memory (``host``) and on disk."""
        from vllm.v1.metrics.cache_hit_source import CacheHitSource

        if num_external_tokens <= 0:
            return {}
        m = self._last_match.get(request.request_id)
        if m is None:
            return {CacheHitSource.DISK: num_external_tokens}
        start = m.found_tokens - num_external_tokens  # where vLLM's own hit ended
        memory = min(max(m.memory_tokens - start, 0), num_external_tokens)
        return {k: n for k, n in ((CacheHitSource.HOST, memory), (CacheHitSource.DISK, num_external_tokens - memory))
                if n}

    @property
    def requires_kv_delivery(self) -> bool:
        return False  # a best-effort cache: a save dropped by a preemption is a miss later

    def _loadable_tokens(self, tokens: list[int], namespace: str) -> tuple[int, int]:
        """(tokens in memory, tokens in all) of the whole pages of ``tokens`` every rank can load:
        from the worker's cache when it runs in this process (tensor parallel size 1), else the
        fewest any rank's store index holds (none of them counted as memory)."""
        if self._vllm_config.parallel_config.tensor_parallel_size == 1:
            if self._local_root is None:  # store_root reads store.json: once, when the worker has made it
                root = str(store_root(self.settings.disk_path, self.identity))
                self._local_root = root if local_cache(root) is not None else None
            cache = local_cache(self._local_root) if self._local_root is not None else None
            if cache is not None:
                device, host, disk = cache.peek(tokens, namespace)
                return device + host, device + host + disk
        return 0, self._indexed_pages(tokens, namespace) * self.block_size

    def _indexed_pages(self, tokens: list[int], namespace: str) -> int:
        hits = []
        for rank in store_ranks(self._vllm_config):
            store = self._reader(rank)
            if store is None:
                return 0  # that rank has not made its store yet
            identity = identity_for(self._vllm_config, tp_rank=rank)
            hits.append(store.longest_prefix([p.key for p in chain_pages(identity, tokens, namespace)], namespace))
        return min(hits)

    def _reader(self, rank: int) -> ChunkStore | None:
        """Rank ``rank``'s store, opened read-only once its worker has made it."""
        with self._opening:
            if rank not in self._readers:
                identity = identity_for(self._vllm_config, tp_rank=rank)
                store = open_reader(self.settings, identity)
                if store is None:
                    return None
                self._readers[rank] = store
            return self._readers[rank]

    def update_state_after_alloc(self, request: "Request", blocks: Any, num_external_tokens: int) -> None:
        match = self._matched.pop(request.request_id, None)
        if num_external_tokens <= 0 or match is None:
            return
        self._last_match[request.request_id] = match
        first = match.computed_pages
        end = first + num_external_tokens // self.block_size
        self._loads.append(BlockTransfer(request.request_id, self._namespaces[request.request_id],
                                         tuple(request.prompt_token_ids[:end * self.block_size]),
                                         list(blocks.get_block_ids()[0][:end]), first))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """This step's loads (blocks matched and allocated since the last step) and saves (blocks
        this step's forward completes)."""
        meta = ChunkstoreConnectorMetadata(loads=self._loads)
        self._loads = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            namespace, request = self._namespaces.get(new.req_id), self._requests.get(new.req_id)
            if namespace is None or request is None or not self.is_cacheable(new):
                self._tracked.pop(new.req_id, None)  # e.g. a session back with images: no more saves
                continue  # never looked up (not cacheable), or already finished
            tracked = self._tracked[new.req_id] = _Tracked(request, namespace, list(new.block_ids[0]),
                                                          new.num_computed_tokens // self.block_size)
            self._save_computed(meta, new.req_id, tracked, new.num_computed_tokens + scheduled.get(new.req_id, 0))
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            tracked = self._tracked.get(req_id)
            if tracked is None:
                continue
            new_ids = cached.new_block_ids[i]
            if req_id in cached.resumed_req_ids:  # preempted and back: its blocks are all new
                tracked.block_ids = list(new_ids[0]) if new_ids is not None else []
                tracked.num_saved = min(tracked.num_saved, cached.num_computed_tokens[i] // self.block_size)
            elif new_ids is not None:
                tracked.block_ids.extend(new_ids[0])
            self._save_computed(meta, req_id, tracked, cached.num_computed_tokens[i] + scheduled.get(req_id, 0))
        return meta

    def _save_computed(self, meta: ChunkstoreConnectorMetadata, req_id: str, tracked: _Tracked,
                       num_computed: int) -> None:
        """Queue the pages ``num_computed`` completes: their tokens were this step's input, so
        their KV is in the blocks after the forward."""
        if not self.is_cacheable(tracked.request):
            return
        tokens = tracked.request.all_token_ids
        done = min(num_computed, len(tokens)) // self.block_size
        done = min(done, len(tracked.block_ids))
        if done > tracked.num_saved:
            meta.saves.append(BlockTransfer(req_id, tracked.namespace, tuple(tokens[:done * self.block_size]),
                                            tracked.block_ids[:done], tracked.num_saved))
            tracked.num_saved = done

    def update_connector_output(self, connector_output: Any) -> None:
        """Blocks that did not load are recomputed by vLLM: save them again once they are (a
        damaged chunk's page is then whole in the store again)."""
        invalid = getattr(connector_output, "invalid_block_ids", None)
        if not invalid:
            return
        for tracked in self._tracked.values():
            bad = [i for i, block in enumerate(tracked.block_ids[:tracked.num_saved]) if block in invalid]
            if bad:
                tracked.num_saved = bad[0]

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict | None]:
        """Forget the request; its saves were made step by step, so its blocks may be freed now."""
        for table in (self._tracked, self._matched, self._namespaces, self._requests, self._last_match):
            table.pop(request.request_id, None)
        return False, None

    # ---- worker side ---------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Take vLLM's paged KV and open this rank's cache and store (for writing, or read-only
        on an MLA replica). Raises ValueError for a KV layout it does not know or sizes that do
        not fit, and what ChunkStore raises (another process writes the store)."""
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        rank = get_tensor_model_parallel_rank()
        self.identity = identity = identity_for(self._vllm_config, tp_rank=rank)
        from vllm.platforms import current_platform

        paged = PagedKV(kv_caches, identity, kv_split="rows" if current_platform.is_cpu() else "token",
                        is_mla=is_mla(self._vllm_config))
        s = self.settings
        if not is_writer(self._vllm_config, rank):
            self.transfers = WorkerTransfers(paged, identity, cache=None, open_reader=lambda: open_reader(s, identity),
                                             async_load=s.async_load)
            return
        config = cache_config(s, identity, self._vllm_config)
        store = open_writer(s, identity)
        try:
            cache = TieredCache(config, identity, device=paged.device, store=store)
        except BaseException:
            store.close()
            raise
        self.transfers = WorkerTransfers(paged, identity, cache=cache, async_load=s.async_load)

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Start this step's loads: in the background (asynchronous loads; vLLM calls this after
        the forward starts), else now, before the forward, in which case a failed load makes this
        step save nothing."""
        meta = self._get_connector_metadata()
        if not meta.loads:
            return
        if self.settings.async_load:
            self.transfers.start_loads(meta.loads)
        else:
            self.transfers.load_now(meta.loads)

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # loads fill every layer at once, before the forward or in the background

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # whole blocks are saved after the forward, in wait_for_save

    def wait_for_save(self) -> None:
        """Copy the blocks this step completed into the cache (not those of a request whose
        synchronous load failed, until vLLM has recomputed it: WorkerTransfers.save)."""
        self.transfers.save(self._get_connector_metadata().saves)

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        """(None: no save holds a request's blocks; the requests whose background loads are done)."""
        if self.transfers is None:
            return None, None
        self.transfers.forget(finished_req_ids)
        return None, self.transfers.take_finished() or None

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.transfers.take_errors() if self.transfers is not None else set()

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the saved blocks are on disk (tests, and before a planned restart)."""
        return self.transfers.flush(timeout_s) if self.transfers is not None else True

    def shutdown(self) -> None:
        if self.transfers is not None:
            self.transfers.close()
        with self._opening:
            for store in self._readers.values():
                store.close()
            self._readers.clear()
