"""Drive SGLang's real ``HiCacheController`` on CPU, for testing L3 storage backends.

Imported only in the SGLang virtual environment (``.venv-sglang``); the main suite never imports it.

``make_controller`` builds what SGLang's scheduler builds for HiCache with an L3 backend, on CPU:
a real ``MHATokenToKVPool`` (the device pool), its ``TokenToKVPoolAllocator``, a real
``MHATokenToKVPoolHost`` in the asked layout (``layer_first``, ``page_first`` or ``page_first_direct``)
and a real ``HiCacheController`` that attaches the storage backend through SGLang's own
``StorageBackendFactory`` (``"file"`` for SGLang's ``HiCacheFile``, ``"dynamic"`` for a backend named
by ``backend_extra_config``: ``backend_name``, ``module_path``, ``class_name``, ``interface_v1``...).
The extra config goes through SGLang's own parser (``HybridCacheController.parse_storage_backend_extra_config``),
which takes out ``prefetch_threshold``, ``prefetch_timeout_*`` and ``hicache_storage_pass_prefix_keys``
before the rest reaches the backend as ``storage_config.extra_config``, as in a server.

The other helpers play the scheduler's part (what ``UnifiedRadixCache`` does around the controller):

* ``fill_host_pages`` puts known K/V into freshly allocated host slots (written straight into the host
  pool: SGLang's device->host copies need CUDA kernels, and L3 reads and writes only the host pool);
* ``write_through`` hashes the tokens with SGLang's ``get_storage_hash_str`` (as the radix tree does
  for a node), calls ``controller.write_storage`` and waits for the backup thread's ack on
  ``ack_backup_queue``;
* ``prefetch`` calls ``controller.prefetch`` (the controller hashes the tokens itself in
  ``_storage_hit_query``, then ``batch_exists``), takes the hit from ``prefetch_hit_queue``, allocates host
  slots for it and hands the operation to ``prefetch_buffer`` (the IO thread then calls
  ``batch_get_v1``/``batch_get``), and drains ``ack_prefetch_queue`` until the ``completed_req`` ack;
* ``read_host_pages`` reads pages back from host slots, whatever the layout, to compare byte for byte.

Everything here is single-rank (one gloo process group from a file under ``tmp_path``); ``tp_rank`` and
``tp_size`` only set what SGLang's parallel context reports (so the backend's storage config sees them).
"""

from __future__ import annotations

import itertools
import json
import threading
import time
import uuid
from array import array
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty
from typing import Any, Self

import torch
import torch.distributed as dist
from sglang.srt.managers.cache_controller import (
    HiCacheController,
    PrefetchOperation,
    StorageOperation,
)
from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle
from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import (
    HybridCacheController,
)
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host import HostPoolGroup
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_storage_hash_str
from sglang.srt.runtime_context import get_parallel

LAYOUTS = ("layer_first", "page_first", "page_first_direct")

# "base": sglang.srt.managers.cache_controller.HiCacheController itself (what PD decode offload uses).
# "hybrid": its subclass HybridCacheController over a one-entry HostPoolGroup, which is what a 0.5.23
# server's UnifiedRadixCache builds for a plain MHA model (hybrid_pool_assembler.build_kv_only_stack).
# The L3 calls differ slightly: "hybrid" asks batch_exists once for the whole hash chain (base: per
# STORAGE_BATCH_SIZE=128 pages) and passes prefix_keys=None for an empty prefix (base: []).
CONTROLLER_KINDS = ("base", "hybrid")

# The io_backend SGLang settles on for each host layout (server_args'
# resolve_layout_io_compatibility): page_first_direct only works with "direct", page_first only with
# "kernel". No device<->host copy runs here, so this only has to be a combination SGLang accepts.
IO_BACKEND_FOR_LAYOUT = {"layer_first": "direct", "page_first": "kernel", "page_first_direct": "direct"}

_pg_counter = itertools.count()


def _parallel_overrides(tp_rank: int, tp_size: int) -> dict:
    # What HiCacheController reads from get_parallel() (_generate_storage_config, attach_storage_backend);
    # outside a server nothing is published, so each must be stated.
    return {"tp_rank": tp_rank, "tp_size": tp_size, "pp_rank": 0, "pp_size": 1, "attn_dcp_size": 1, "attn_dcp_rank": 0}


@dataclass
class Harness:
    """One controller and its pools. ``close()`` stops the storage threads and the process group."""

    controller: HiCacheController
    device_pool: Any  # MHATokenToKVPool, or MLATokenToKVPool with mla_dims
    allocator: TokenToKVPoolAllocator
    host_pool: Any  # MHATokenToKVPoolHost, or MLATokenToKVPoolHost
    layout: str
    controller_kind: str
    page_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    dtype: torch.dtype
    prefetch_threshold: int  # as SGLang's tree would apply it (the harness does not, see prefetch)
    pass_prefix_keys: bool  # hicache_storage_pass_prefix_keys from the extra config
    extra_config: dict  # what reached the backend's storage_config.extra_config
    last_write: StorageOperation | None = None
    last_prefetch: PrefetchOperation | None = None
    is_mla: bool = False  # an MLA model: one latent row per token and layer (no K/V split, one "head")
    _exit: ExitStack = field(default_factory=ExitStack)
    _closed: bool = False

    @property
    def storage_backend(self):
        """The backend instance SGLang created (``controller.storage_backend``); None once closed."""
        return self.controller.storage_backend

    @property
    def page_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one page as the helpers return it: (K/V, layer, token in page, head, head_dim);
        for MLA (1, layer, token in page, 1, latent width)."""
        return (1 if self.is_mla else 2, self.num_layers, self.page_size, self.num_heads, self.head_dim)

    def close(self) -> None:
        """Detach the backend (stops and joins the four storage threads, calls the backend's close()),
        destroy the process group and restore SGLang's parallel context. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.controller.detach_storage_backend()
        finally:
            try:
                if dist.is_initialized():
                    dist.destroy_process_group()
            finally:
                self._exit.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def make_controller(
    tmp_path,
    *,
    layout: str = "layer_first",
    backend_extra_config: dict | None = None,
    storage_backend: str = "dynamic",
    num_layers: int = 2,
    num_heads: int = 2,
    head_dim: int = 64,
    page_size: int = 16,
    device_tokens: int = 512,
    host_tokens: int = 2048,
    dtype: torch.dtype = torch.bfloat16,
    model_name: str = "test-model",
    tp_rank: int = 0,
    tp_size: int = 1,
    io_backend: str | None = None,
    write_policy: str = "write_through",
    controller_kind: str = "base",
    mla_dims: tuple[int, int] | None = None,
) -> Harness:
    """Build a real HiCacheController with ``storage_backend`` attached, on CPU.

    ``host_tokens`` is the host pool's exact capacity (a multiple of ``page_size``); ``device_tokens``
    sizes the device pool (unused by L3 but required by the controller). ``io_backend`` defaults to
    what SGLang uses for the layout (``IO_BACKEND_FOR_LAYOUT``). The gloo process group is initialised
    from a fresh file under ``tmp_path``; no other process group may be live. ``controller_kind``:
    see ``CONTROLLER_KINDS``. ``mla_dims`` = (kv_lora_rank, qk_rope_head_dim) builds an MLA model's
    pools (``MLATokenToKVPool``, ``MLATokenToKVPoolHost``) instead; ``num_heads``/``head_dim`` are then
    ignored (one latent row of kv_lora_rank + qk_rope_head_dim per token and layer).
    """
    if controller_kind not in CONTROLLER_KINDS:
        raise ValueError(f"controller_kind must be one of {CONTROLLER_KINDS}, got {controller_kind!r}")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
    if host_tokens % page_size or device_tokens % page_size:
        raise ValueError("host_tokens and device_tokens must be multiples of page_size")
    if dist.is_initialized():
        raise RuntimeError("a torch.distributed process group is already initialised (close the other harness)")
    if io_backend is None:
        io_backend = IO_BACKEND_FOR_LAYOUT[layout]

    exit_stack = ExitStack()
    try:
        # SGLang's unit tests force a single-rank topology the same way (the parallel context is not
        # published outside a server).
        exit_stack.enter_context(get_parallel().override(**_parallel_overrides(tp_rank, tp_size)))

        pg_file = Path(tmp_path) / f"gloo-{next(_pg_counter)}-{uuid.uuid4().hex[:8]}"
        dist.init_process_group("gloo", init_method=f"file://{pg_file}", rank=0, world_size=1)
        exit_stack.callback(lambda: dist.destroy_process_group() if dist.is_initialized() else None)

        if mla_dims is not None:
            from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
            from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost

            device_pool = MLATokenToKVPool(
                size=device_tokens, page_size=page_size, dtype=dtype, kv_lora_rank=mla_dims[0],
                qk_rope_head_dim=mla_dims[1], layer_num=num_layers, device="cpu", enable_memory_saver=False,
                start_layer=0, end_layer=num_layers - 1,
            )
            num_heads, head_dim = 1, sum(mla_dims)
        else:
            device_pool = MHATokenToKVPool(
                size=device_tokens,
                page_size=page_size,
                dtype=dtype,
                head_num=num_heads,
                head_dim=head_dim,
                layer_num=num_layers,
                device="cpu",
                enable_memory_saver=False,
                start_layer=0,
                end_layer=num_layers - 1,
            )
        allocator = TokenToKVPoolAllocator(
            size=device_tokens, dtype=dtype, device="cpu", kvcache=device_pool, need_sort=False
        )
        if mla_dims is not None:  # as SGLang's hybrid_pool_assembler builds it
            host_pool = MLATokenToKVPoolHost(
                device_pool.get_device_pool_infos()[0].buffer_info,
                host_to_device_ratio=host_tokens / device_tokens,
                host_size=0,
                page_size=page_size,
                layout=layout,
                pin_memory=False,
                device="cpu",
                device_capacity_tokens=device_pool.size,
                start_layer=device_pool.start_layer,
                end_layer=device_pool.end_layer,
                target_layer_num=device_pool.layer_num,
                override_kv_cache_dim=device_pool.kv_cache_dim,
                host_token_capacity=host_tokens,
            )
        else:
            host_pool = MHATokenToKVPoolHost(
                device_pool.get_device_pool_infos()[0].buffer_info,
                host_to_device_ratio=host_tokens / device_tokens,
                host_size=0,
                page_size=page_size,
                layout=layout,
                pin_memory=False,  # no CUDA: pinning would need a device
                device="cpu",
                device_capacity_tokens=device_pool.size,
                start_layer=device_pool.start_layer,
                end_layer=device_pool.end_layer,
                write_back_staging=device_pool.hicache_write_back_staging,
                host_token_capacity=host_tokens,
            )

        # The same parsing a server applies to --hicache-storage-backend-extra-config.
        extra_json = json.dumps(backend_extra_config or {})
        extra_config, threshold, _tb, _tk, pass_prefix_keys = HybridCacheController.parse_storage_backend_extra_config(
            extra_json
        )
        common = {
            "load_cache_event": threading.Event(),
            "write_policy": write_policy,
            "io_backend": io_backend,
            "storage_backend": storage_backend,
            "prefetch_threshold": threshold,
            "model_name": model_name,
            "storage_backend_extra_config": extra_config,
        }
        if controller_kind == "base":
            controller = HiCacheController(allocator, host_pool, page_size, dist.group.WORLD, **common)
        else:
            from sglang.srt.mem_cache.hicache_storage import PoolName
            from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import (
                build_pool_entry,
            )

            group = HostPoolGroup(
                [
                    build_pool_entry(
                        name=PoolName.KV,
                        host_pool=host_pool,
                        device_pool=device_pool,
                        layer_mapping={i: i for i in range(num_layers)},
                        transfer_layer_id_max=num_layers,
                        is_anchor=True,
                    )
                ]
            )
            controller = HybridCacheController(
                allocator, group, page_size, dist.group.WORLD, transfer_layer_id_max=num_layers, **common
            )
        # SGLang's tree reserves the requested span against this limit; a harness prefetch never
        # should be refused for it.
        controller.prefetch_capacity_limit = max(controller.prefetch_capacity_limit, host_pool.size)
    except BaseException:
        exit_stack.close()
        raise

    return Harness(
        controller=controller,
        device_pool=device_pool,
        allocator=allocator,
        host_pool=host_pool,
        layout=layout,
        controller_kind=controller_kind,
        page_size=page_size,
        num_layers=num_layers,
        num_heads=num_heads,
        head_dim=head_dim,
        dtype=dtype,
        prefetch_threshold=controller.prefetch_threshold,
        pass_prefix_keys=pass_prefix_keys,
        extra_config=extra_config,
        is_mla=mla_dims is not None,
        _exit=exit_stack,
    )


# --- host pool access, independent of layout -------------------------------------------------------


def _slot_view(h: Harness, kv: int, layer: int):
    """(tensor view, index function): view[index(slots)] are the [n, heads, head_dim] rows of ``slots``
    (token-level host indices) for K (kv=0) or V (kv=1) of ``layer``. Writes through the view land in
    the host pool."""
    buf = h.host_pool.kv_buffer
    if h.is_mla:  # no K/V axis: layer_first [layer, token, 1, dim], page_first [token, layer, 1, dim],
        # page_first_direct [page, layer, token in page, 1, dim]
        if h.layout == "layer_first":
            return buf[layer], lambda s: (s,)
        if h.layout == "page_first":
            return buf[:, layer], lambda s: (s,)
        if h.layout == "page_first_direct":
            ps = h.page_size
            return buf[:, layer], lambda s: (s // ps, s % ps)
        raise ValueError(f"unsupported layout {h.layout!r}")
    if h.layout == "layer_first":  # [2, layer, token, head, dim]
        return buf[kv, layer], lambda s: (s,)
    if h.layout == "page_first":  # [2, token, layer, head, dim]
        return buf[kv, :, layer], lambda s: (s,)
    if h.layout == "page_first_direct":  # [2, page, layer, token in page, head, dim]
        ps = h.page_size
        return buf[kv, :, layer], lambda s: (s // ps, s % ps)
    raise ValueError(f"unsupported layout {h.layout!r}")


def _check_pages(h: Harness, host_indices: torch.Tensor) -> torch.Tensor:
    idx = torch.as_tensor(host_indices, dtype=torch.int64).cpu()
    if idx.numel() % h.page_size:
        raise ValueError("host_indices must cover whole pages")
    starts = idx[:: h.page_size]
    expect = starts.repeat_interleave(h.page_size) + torch.arange(h.page_size).repeat(starts.numel())
    if not torch.equal(idx, expect) or bool((starts % h.page_size).any()):
        raise ValueError("host_indices must be page-aligned runs of page_size consecutive slots")
    return idx


def read_host_pages(h: Harness, host_indices: torch.Tensor) -> list[torch.Tensor]:
    """Copies of the pages in ``host_indices`` (token-level, page-aligned), one tensor per page of shape
    ``h.page_shape`` = (K/V, layer, token in page, head, head_dim), whatever the host layout."""
    idx = _check_pages(h, host_indices)
    n = idx.numel()
    out = torch.empty((h.page_shape[0], h.num_layers, n, h.num_heads, h.head_dim), dtype=h.dtype)
    for kv in range(h.page_shape[0]):
        for layer in range(h.num_layers):
            view, index = _slot_view(h, kv, layer)
            out[kv, layer] = view[index(idx)]
    return [out[:, :, p * h.page_size : (p + 1) * h.page_size].clone() for p in range(n // h.page_size)]


def write_host_pages(h: Harness, host_indices: torch.Tensor, pages: Sequence[torch.Tensor]) -> None:
    """Write ``pages`` (each of shape ``h.page_shape``) into the host slots ``host_indices``."""
    idx = _check_pages(h, host_indices)
    if len(pages) * h.page_size != idx.numel():
        raise ValueError("one page of data per page_size host slots")
    data = torch.cat([p.to(h.dtype).reshape(h.page_shape) for p in pages], dim=2) if pages else None
    for kv in range(h.page_shape[0]):
        for layer in range(h.num_layers):
            view, index = _slot_view(h, kv, layer)
            view[index(idx)] = data[kv, layer]


def pages_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Byte equality of two pages (NaN-safe, unlike ==)."""
    a, b = a.contiguous(), b.contiguous()
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))


def random_pages(h: Harness, num_pages: int, seed: int) -> list[torch.Tensor]:
    """``num_pages`` pages of seeded random K/V in the harness's dtype, each of shape ``h.page_shape``."""
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(h.page_shape, generator=g).to(h.dtype) for _ in range(num_pages)]


def fill_host_pages(h: Harness, num_pages: int, seed: int = 0) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Allocate ``num_pages`` pages of host slots and fill them with seeded random K/V.

    Returns (host_indices: int64 token-level slot indices, ``num_pages * page_size`` of them;
    pages: a copy of each page, shape ``h.page_shape``), so tests can compare what comes back."""
    host_indices = h.host_pool.alloc(num_pages * h.page_size)
    if host_indices is None:
        raise RuntimeError("host pool full")
    pages = random_pages(h, num_pages, seed)
    write_host_pages(h, host_indices, pages)
    return host_indices, pages


def free_host(h: Harness, host_indices: torch.Tensor) -> None:
    """Give host slots back to the host pool (as the tree does on eviction)."""
    if host_indices.numel():
        h.host_pool.free(host_indices)


def make_tokens(num_pages: int, page_size: int, seed: int = 0) -> list[int]:
    """Seeded token ids for ``num_pages`` full pages (distinct seeds give distinct hash chains)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 50_000, (num_pages * page_size,), generator=g).tolist()


def page_hashes(h: Harness, token_ids: Sequence[int], last_hash: str | None = None) -> list[str]:
    """SGLang's storage keys for the pages of ``token_ids`` (``get_storage_hash_str``, chained from
    ``last_hash``): the keys ``batch_set*``/``batch_exists``/``batch_get*`` receive."""
    _check_aligned(h, token_ids)
    return list(get_storage_hash_str(list(token_ids), last_hash, page_size=h.page_size))


def _check_aligned(h: Harness, token_ids: Sequence[int]) -> None:
    if len(token_ids) % h.page_size:
        raise ValueError(f"token_ids must be whole pages ({len(token_ids)} % {h.page_size} != 0)")


def _default_prefix_keys(h: Harness, prefix_keys: list[str] | None) -> list[str] | None:
    # The tree passes the hash chain of the node's ancestors only when hicache_storage_pass_prefix_keys
    # is set: [] for a sequence starting at the root, None when the option is off.
    if prefix_keys is not None:
        return list(prefix_keys)
    return [] if h.pass_prefix_keys else None


# --- the scheduler's part ----------------------------------------------------------------------------


def write_through(
    h: Harness,
    token_ids: Sequence[int],
    host_indices: torch.Tensor,
    prefix_keys: list[str] | None = None,
    *,
    last_hash: str | None = None,
    timeout: float = 30.0,
) -> int:
    """Back the host slots ``host_indices`` (holding ``token_ids``) up to L3, as the tree's
    ``write_backup_storage`` does, and wait for the backup thread's ack.

    The page hashes come from ``get_storage_hash_str(token_ids, last_hash, page_size)`` (the tree's
    ``node.hash_value``); ``prefix_keys`` defaults as the tree's would (see ``_default_prefix_keys``).
    Returns the tokens the controller counts as written (``operation.completed_tokens``: all of them, or
    the pages before the first failed batch). The operation is kept in ``h.last_write``."""
    _check_aligned(h, token_ids)
    if len(token_ids) != len(host_indices):
        raise ValueError("one host slot per token")
    hashes = page_hashes(h, token_ids, last_hash)
    cc = h.controller
    op_id = cc.write_storage(host_indices, list(token_ids), hashes, _default_prefix_keys(h, prefix_keys))
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError(f"backup {op_id} not acked within {timeout}s")
        try:
            op = cc.ack_backup_queue.get(timeout=min(remaining, 0.5))
        except Empty:
            continue
        if op.id == op_id:
            h.last_write = op
            return op.completed_tokens


def prefetch(
    h: Harness,
    token_ids: Sequence[int],
    *,
    last_hash: str | None = None,
    prefix_keys: list[str] | None = None,
    rid: str | None = None,
    min_hit_tokens: int = 0,
    timeout: float = 30.0,
) -> tuple[int, torch.Tensor]:
    """Prefetch ``token_ids`` from L3 into newly allocated host slots, as the tree does, and wait.

    ``controller.prefetch`` queues the operation; the prefetch thread hashes the tokens
    (``get_storage_hash_str``) and asks ``batch_exists``; the hit comes back on ``prefetch_hit_queue``;
    like the tree we allocate host slots for exactly the hit, set ``operation.host_indices`` and put it on
    ``prefetch_buffer``; the IO thread reads the pages (``batch_get_v1`` for interface_v1 backends,
    ``batch_get`` otherwise) and reports progress (``completed_tokens``) then ``completed_req`` on
    ``ack_prefetch_queue``. A hit below ``min_hit_tokens`` (the tree uses ``h.prefetch_threshold``) is
    revoked like the tree revokes it. Slots past what was read are freed.

    Returns (tokens fetched, host_indices of exactly those tokens). The operation is kept in
    ``h.last_prefetch`` (``storage_hit_count``, ``hash_value``, ...)."""
    _check_aligned(h, token_ids)
    cc = h.controller
    rid = rid or f"req-{uuid.uuid4().hex[:8]}"
    keys = _default_prefix_keys(h, prefix_keys)
    if h.controller_kind == "base":
        op = cc.prefetch(rid, list(token_ids), last_hash, keys)
    else:  # as UnifiedRadixCache.prefetch_from_storage -> submit_prefetch does
        key = RadixKey(array("q", token_ids)).page_aligned(h.page_size)
        op = cc.prefetch(CacheRequestHandle(rid, 0), key, last_hash, keys)
    h.last_prefetch = op
    deadline = time.monotonic() + timeout

    def _get(queue, what):
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"prefetch {rid}: no {what} within {timeout}s")
            try:
                return queue.get(timeout=min(remaining, 0.5))
            except Empty:
                continue

    # 1. the storage hit query
    while _get(cc.prefetch_hit_queue, "hit query") is not op:
        pass  # another request's
    hit = op.storage_hit_count
    if hit == 0 or hit < min_hit_tokens:
        cc.terminate_prefetch(op)  # revoked: no IO is issued, no ack follows
        return 0, torch.empty(0, dtype=torch.int64)

    # 2. host slots for the hit, handed to the IO thread
    host_indices = cc.alloc_prefetch_host_buffers(op, hit)
    if host_indices is None:
        cc.terminate_prefetch(op)
        raise RuntimeError("host pool full")
    op.host_indices = host_indices
    cc.prefetch_buffer.put(op)

    # 3. progress acks, then completed_req
    while True:
        ack = _get(cc.ack_prefetch_queue, "completion ack")
        if ack.operation is not op:
            continue
        if ack.completed_tokens is not None:
            assert op.completed_tokens <= ack.completed_tokens
            op.completed_tokens = ack.completed_tokens
        if ack.completed_req:
            break
    completed, _ = cc.terminate_prefetch(op)
    free_host(h, host_indices[completed:])
    return completed, host_indices[:completed]


def drain_queues(h: Harness) -> dict[str, int]:
    """Empty the controller's scheduler-facing queues; returns how many items each held (for tests
    that check nothing was left unacknowledged)."""
    cc = h.controller
    counts: dict[str, int] = {}
    for name in ("prefetch_hit_queue", "ack_prefetch_queue", "ack_backup_queue", "host_mem_release_queue"):
        q: Any = getattr(cc, name, None)
        n = 0
        while q is not None:
            try:
                q.get_nowait()
                n += 1
            except Empty:
                break
        counts[name] = n
    return counts
