"""chunkstore as a vLLM KV connector (``KVConnectorBase_V1``): prompt blocks saved to a ChunkStore
and loaded back into vLLM's paged KV, also by a new process (warm start).

vLLM loads it with ``kv_transfer_config={"kv_connector": "ChunkstoreConnector",
"kv_connector_module_path": "chunkstore.integrations.vllm", "kv_role": "kv_both",
"kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"disk_path": ...}}``
(docs/INTEGRATIONS.md). Invariants: a vLLM block of a prompt is one chunkstore page, keyed by
chunkstore's own chain over its tokens from a root that binds the model identity (model,
revision, KV dtype, layers, KV heads, head size, block size, TP rank and size) and the namespace
(the request's ``cache_salt``: two salts never share a block); the scheduler reports as matched
only blocks the index holds, leaving at least one prompt token to compute; every load is verified,
and a block that fails (and every block after it) is reported through
``get_block_ids_with_load_errors`` so vLLM recomputes it, never serving its bytes; saves copy
whole computed prompt blocks out of the paged KV after the forward and a background writer
publishes them. Uses the store's public methods only.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (KVConnectorBase_V1, KVConnectorMetadata,
                                                             KVConnectorRole)

from chunkstore.disk import (DEFAULT_NAMESPACE, ChunkStore, Codec, Durability, ModelIdentity, ModelMismatchError,
                             PageRef, chain_pages, store_root)
from chunkstore.integrations.settings import STORE_KEYS, check_keys, open_writer, store_fields
from chunkstore.integrations.writer import PageWriter
from chunkstore.priority import ThreadPriority

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

log = logging.getLogger(__name__)

TRANSFER_PAGES = 64  # blocks staged per load or save batch: bounds the memory a long prompt needs


# ---- settings and identity -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    """What ``kv_connector_extra_config`` sets; ``from_extra_config`` raises ValueError naming a bad key."""

    disk_path: Path = Path("chunkstore-data")
    disk_size_bytes: int | None = None
    compression: Codec | None = None
    durability: Durability = Durability.FSYNC
    background_priority: ThreadPriority = ThreadPriority.LOW
    max_pending_bytes: int = 1 << 30

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> "ConnectorSettings":
        extra = dict(extra or {})
        check_keys(extra, STORE_KEYS, (), "kv_connector_extra_config")
        kw = store_fields(extra)
        return cls(**kw)


def identity_for(vllm_config: "VllmConfig", tp_rank: int) -> ModelIdentity:
    """The identity of the blocks this rank's KV cache holds (the scheduler uses rank 0's)."""
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    if parallel.pipeline_parallel_size > 1:
        raise ValueError("pipeline parallelism is not supported by the chunkstore connector yet")
    dtype = model.dtype if cache.cache_dtype in (None, "auto") else cache.cache_dtype
    dtype = str(dtype).removeprefix("torch.")
    # The weights are named by model and revision (and quantization): a local folder whose weights
    # are replaced under the same path needs a new data folder (docs/INTEGRATIONS.md).
    quantization = getattr(model, "quantization", None) or "none"
    model_id = (f"vllm:{model.model}@{model.revision or 'default'}:q={quantization}:"
                f"dp={getattr(parallel, 'data_parallel_rank', 0)}")
    return ModelIdentity(model_id=model_id, kv_dtype=dtype, num_layers=model.get_num_layers(parallel),
                         num_kv_heads=model.get_num_kv_heads(parallel), head_dim=model.get_head_size(),
                         page_size=cache.block_size, tp_rank=tp_rank, tp_size=parallel.tensor_parallel_size)


def namespace_for(cache_salt: str | None) -> str:
    """A request's namespace: the default without a salt, else one derived from it (so a salt's
    text is not written into the store's names)."""
    if cache_salt is None:
        return DEFAULT_NAMESPACE
    return "salt-" + hashlib.blake2b(cache_salt.encode(), digest_size=12).hexdigest()


# ---- paged KV <-> pages ------------------------------------------------------------------------------

class PagedKV:
    """vLLM's per-layer paged KV tensors, read and written a batch of blocks at a time as pages of
    shape ``(layers, 2, block, heads, dim)``: one indexed copy per layer, no loop per token. Knows
    the CPU backend's ``(blocks, heads, block, 2 * dim)`` (which its attention reads as
    ``(blocks, heads, 2 * block, dim)``: K rows, then V rows) and the FlashAttention backends'
    ``(2, blocks, block, heads, dim)``. Raises ValueError for another layout, or one it cannot tell
    apart (two blocks)."""

    def __init__(self, kv_caches: dict[str, torch.Tensor], identity: ModelIdentity):
        self.layers = list(kv_caches.values())
        _, _, size, heads, dim = identity.page_shape
        if len(self.layers) != identity.num_layers:
            raise ValueError(f"{len(self.layers)} KV cache layers, the model has {identity.num_layers}")
        first = self.layers[0]
        if first.dim() == 4 and tuple(first.shape[1:]) == (heads, size, 2 * dim):
            self.layout = "cpu"
        elif (first.dim() == 5 and first.shape[0] == 2 and first.shape[1] != 2
              and tuple(first.shape[2:]) == (size, heads, dim)):  # (2, blocks, ...), not (blocks, 2, ...)
            self.layout = "flash"
        else:
            raise ValueError(f"unknown paged KV layout {tuple(first.shape)} for blocks of {size} tokens, "
                             f"{heads} heads of {dim}")
        self.page_shape = identity.page_shape
        self.dtype = first.dtype

    def gather(self, block_ids: list[int]) -> torch.Tensor:
        """A copy of the blocks as pages, ``(n, *page_shape)``."""
        n, (_, _, size, heads, dim) = len(block_ids), self.page_shape
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.layers[0].device)
        out = torch.empty((n, *self.page_shape), dtype=self.dtype)
        for layer, kv in enumerate(self.layers):
            if self.layout == "cpu":  # (n, H, P, 2D) is (n, H, 2, P, D): per head P rows of K, then of V
                out[:, layer] = kv.index_select(0, idx).view(n, heads, 2, size, dim).permute(0, 2, 3, 1, 4)
            else:  # (2, n, P, H, D) -> (n, 2, P, H, D)
                out[:, layer] = kv.index_select(1, idx).transpose(0, 1)
        return out

    def scatter(self, block_ids: list[int], pages: torch.Tensor) -> None:
        """Write ``pages`` (``(n, *page_shape)``) into the blocks."""
        n, (_, _, size, heads, dim) = len(block_ids), self.page_shape
        idx = torch.tensor(block_ids, dtype=torch.long, device=self.layers[0].device)
        for layer, kv in enumerate(self.layers):
            src = pages[:, layer].to(kv.device)
            if self.layout == "cpu":  # (n, 2, P, H, D) -> (n, H, 2, P, D), viewed as (n, H, P, 2D)
                kv.index_copy_(0, idx, src.permute(0, 3, 1, 2, 4).reshape(n, heads, size, 2 * dim))
            else:
                kv.index_copy_(1, idx, src.transpose(0, 1))


# ---- what the scheduler tells the workers ---------------------------------------------------------

@dataclass(slots=True)
class BlockTransfer:
    """Pages of one request and the vLLM blocks they go to (a load) or come from (a save)."""

    req_id: str
    pages: list[PageRef]
    block_ids: list[int]


@dataclass
class ChunkstoreConnectorMetadata(KVConnectorMetadata):
    loads: list[BlockTransfer] = field(default_factory=list)
    saves: list[BlockTransfer] = field(default_factory=list)


@dataclass(slots=True)
class _Tracked:
    """A running request's prompt pages (every full block) and blocks, and how many are saved."""

    pages: list[PageRef]
    block_ids: list[int]
    num_saved: int


class ChunkstoreConnector(KVConnectorBase_V1):
    """A ChunkStore under vLLM's KV cache. The worker side opens the store for writing; the
    scheduler side reads the same store's index read-only (once the worker has made it)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        self.settings = ConnectorSettings.from_extra_config(self._kv_transfer_config.kv_connector_extra_config)
        self.block_size = vllm_config.cache_config.block_size
        self.identity = identity_for(vllm_config, tp_rank=0)
        self.store: ChunkStore | None = None
        self._opening = threading.Lock()
        # scheduler side
        self._matched: dict[str, tuple[list[PageRef], int]] = {}  # req_id -> (prompt pages, pages computed before)
        self._loads: list[BlockTransfer] = []
        self._tracked: dict[str, _Tracked] = {}
        self._namespaces: dict[str, str] = {}  # req_id -> namespace (of its cache_salt), until it finishes
        # worker side
        self.paged: PagedKV | None = None
        self._writer: PageWriter | None = None
        self._load_errors: set[int] = set()
        self._step_failed = False  # a load of this step failed: its saves are skipped

    # ---- the store ---------------------------------------------------------------------------------

    def _root(self) -> Path:
        return store_root(self.settings.disk_path, self.identity)

    def _reader(self) -> ChunkStore | None:
        """The store to look up in: the worker's own, else opened read-only once it exists."""
        if self.store is None:
            with self._opening:
                if self.store is None:
                    try:
                        self.store = ChunkStore(self._root(), self.identity, read_only=True)
                    except (FileNotFoundError, ModelMismatchError):
                        return None  # the worker has not made its store yet
        return self.store

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
        """The prompt tokens past ``num_computed_tokens`` whose blocks the store's index holds,
        in whole blocks, never the prompt's last token (vLLM needs its logits). A store that
        cannot be read is no match (logged), never an error in vLLM's scheduler."""
        if not self.is_cacheable(request):
            return 0, False
        namespace = namespace_for(getattr(request, "cache_salt", None))
        self._namespaces[request.request_id] = namespace
        tokens = list(request.prompt_token_ids or [])
        pages = chain_pages(self.identity, tokens, namespace)
        lookable = pages[:max(len(tokens) - 1, 0) // self.block_size]
        hit = 0
        if lookable:
            try:
                store = self._reader()
                hit = store.longest_prefix([p.key for p in lookable]) if store is not None else 0
            except Exception:  # an index mid-creation, a full disk, a damaged database: recompute
                log.exception("chunkstore: lookup failed; the request is computed")
        self._matched[request.request_id] = (pages, num_computed_tokens // self.block_size)
        return max(hit * self.block_size - num_computed_tokens, 0), False

    def update_state_after_alloc(self, request: "Request", blocks: Any, num_external_tokens: int) -> None:
        pages, first = self._matched.pop(request.request_id, (None, 0))
        if num_external_tokens <= 0 or pages is None:
            return
        count = num_external_tokens // self.block_size
        block_ids = list(blocks.get_block_ids()[0])
        self._loads.append(BlockTransfer(request.request_id, pages[first:first + count],
                                         block_ids[first:first + count]))

    def build_connector_meta(self, scheduler_output: "SchedulerOutput") -> KVConnectorMetadata:
        """This step's loads (blocks matched and allocated since the last step) and saves (prompt
        blocks this step's forward completes)."""
        meta = ChunkstoreConnectorMetadata(loads=self._loads)
        self._loads = []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            namespace = self._namespaces.get(new.req_id)
            if namespace is None or not self.is_cacheable(new):
                continue  # never looked up (not cacheable), or already finished
            pages = chain_pages(self.identity, list(new.prompt_token_ids or []), namespace)
            tracked = self._tracked[new.req_id] = _Tracked(pages, list(new.block_ids[0]),
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
        done = min(num_computed // self.block_size, len(tracked.pages), len(tracked.block_ids))
        if done > tracked.num_saved:
            meta.saves.append(BlockTransfer(req_id, tracked.pages[tracked.num_saved:done],
                                            tracked.block_ids[tracked.num_saved:done]))
            tracked.num_saved = done

    def request_finished(self, request: "Request", block_ids: list[int]) -> tuple[bool, dict | None]:
        """Forget the request; its saves were queued step by step, so its blocks may be freed now."""
        self._tracked.pop(request.request_id, None)
        self._matched.pop(request.request_id, None)
        self._namespaces.pop(request.request_id, None)
        return False, None

    # ---- worker side ---------------------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Take vLLM's paged KV and open this rank's store for writing. Raises ValueError for a KV
        layout it does not know, and what ChunkStore raises (another process writes the store)."""
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        self.identity = identity_for(self._vllm_config, tp_rank=get_tensor_model_parallel_rank())
        self.paged = PagedKV(kv_caches, self.identity)
        s = self.settings
        with self._opening:
            if self.store is not None:  # the scheduler's read-only view in this process
                self.store.close()
            self.store = open_writer(s.disk_path, self.identity, capacity_bytes=s.disk_size_bytes,
                                     codec=s.compression, durability=s.durability,
                                     background_priority=s.background_priority)
        self._writer = PageWriter(self.store, priority=s.background_priority, max_pending_bytes=s.max_pending_bytes,
                                  name="chunkstore-vllm-writer")

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Load this step's matched blocks into the paged KV before the forward, verified, at most
        TRANSFER_PAGES at a time; a block that fails (unreadable, damaged, or a store error) and the
        ones after it are kept for ``get_block_ids_with_load_errors``, and this step saves nothing
        (its forward ran on top of those blocks)."""
        meta = self._get_connector_metadata()
        self._step_failed = False
        for load in meta.loads:
            good = 0
            try:
                for start in range(0, len(load.pages), TRANSFER_PAGES):
                    pages = load.pages[start:start + TRANSFER_PAGES]
                    staged = torch.empty((len(pages), *self.identity.page_shape), dtype=self.paged.dtype)
                    hits = self.store.get_into(pages, list(staged))
                    n = hits.index(False) if False in hits else len(hits)
                    if n:
                        self.paged.scatter(load.block_ids[start:start + n], staged[:n])
                    good = start + n
                    if n < len(hits):
                        break
            except Exception:
                log.exception("chunkstore: loading blocks of request %s failed", load.req_id)
            if good < len(load.pages):
                log.warning("chunkstore: %d of %d blocks of request %s did not load; vLLM recomputes them",
                            len(load.pages) - good, len(load.pages), load.req_id)
                self._load_errors.update(load.block_ids[good:])
                self._step_failed = True

    def wait_for_layer_load(self, layer_name: str) -> None:
        return  # every block was loaded in start_load_kv

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return  # whole blocks are saved after the forward, in wait_for_save

    def wait_for_save(self) -> None:
        """Copy the prompt blocks this step completed out of the paged KV, TRANSFER_PAGES at a
        time, and queue them; nothing when a load of this step failed. A save that cannot be made
        is a miss later (logged), never an error in vLLM's worker."""
        meta = self._get_connector_metadata()
        if self._step_failed:
            self._step_failed = False
            return
        try:
            for save in meta.saves:
                for start in range(0, len(save.pages), TRANSFER_PAGES):
                    pages = self.paged.gather(save.block_ids[start:start + TRANSFER_PAGES])
                    self._writer.submit(save.pages[start:start + TRANSFER_PAGES], list(pages))
        except Exception:
            log.exception("chunkstore: saving this step's blocks failed; they are computed again later")

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until the queued saves are written (tests, and before a planned restart)."""
        return self._writer.flush(timeout_s) if self._writer is not None else True

    def shutdown(self) -> None:
        if self._writer is not None:
            self._writer.close()
        with self._opening:
            if self.store is not None:
                self.store.close()
                self.store = None
