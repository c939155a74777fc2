"""What the vLLM connector is configured with: its settings (``kv_connector_extra_config``), the
model identity of a rank's blocks and the namespace of a request.

Invariants: an unknown or unusable setting is a ValueError naming it, raised when vLLM builds the
connector; the identity binds everything that decides a block's bytes (model, revision,
quantization, KV dtype, layers, KV heads, head size, block size, the TP rank and size where the KV
is split, the DP rank), so two configurations never share a block they would read differently; an
MLA model's latent KV is the same on every TP rank, so its identity has no TP rank and only rank 0
writes; a salt's text never reaches the store's names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chunkstore.disk import DEFAULT_LOCAL_COPY_BYTES, DEFAULT_NAMESPACE, Codec, Durability, KeyProvider, ModelIdentity
from chunkstore.disk.namespaces import check_namespace
from chunkstore.integrations.settings import STORE_KEYS, check_keys, extra_dict, parsed, store_fields
from chunkstore.priority import ThreadPriority
from chunkstore.sizes import PoolSize

if TYPE_CHECKING:
    from vllm.config import VllmConfig

# The store keys both integrations share, less SGLang's writer queue (vLLM's saves go through the
# host tier), and the connector's own.
VLLM_KEYS = (set(STORE_KEYS) - {"max_pending"}) | {"device_size", "host_size", "async_load"}


@dataclass(frozen=True, slots=True)
class ConnectorSettings:
    """What ``kv_connector_extra_config`` sets; ``from_extra_config`` raises ValueError naming a bad key.

    ``device_size``: the staging pool on vLLM's device that loads and saves pass through (the
    tiered cache's device tier), by default two of the longest prompts (``max_model_len``);
    ``host_size``: the host tier, by default twice the staging pool; ``async_load``: whether vLLM
    schedules other requests while a request's blocks load."""

    disk_path: Path = Path("chunkstore-data")
    disk_size_bytes: int | None = None
    compression: Codec | None = None
    durability: Durability = Durability.FSYNC
    background_priority: ThreadPriority = ThreadPriority.LOW
    index_url: str | None = None  # a shared tier's index (PostgreSQL); None: index.db in the store's folder
    object_store: str | None = None  # a shared tier's bucket (s3://bucket/prefix); None: the folder tree
    local_cache_bytes: int = DEFAULT_LOCAL_COPY_BYTES  # with object_store: the local copy of what was read
    seal_key: KeyProvider | None = None  # a sealed store's master key (None: $CHUNKSTORE_SEAL_KEY_FILE's, or unsealed)
    device_size: str | None = None  # a PoolSize: bytes or pages
    host_size: str | None = None
    async_load: bool = True

    @classmethod
    def from_extra_config(cls, extra: dict[str, Any] | None) -> "ConnectorSettings":
        where = "kv_connector_extra_config"
        extra = extra_dict(extra, where)
        check_keys(extra, VLLM_KEYS, (), where)
        kw = store_fields(extra, where)
        for name in ("device_size", "host_size"):
            if extra.get(name) is not None:
                kw[name] = parsed(where, name, _pool_size, extra[name])
        if "async_load" in extra:
            kw["async_load"] = parsed(where, "async_load", _true_or_false, extra["async_load"])
        return cls(**kw)


def _pool_size(value: Any) -> str:
    PoolSize.parse(value)  # ValueError naming the accepted forms
    return str(value).strip()


def _true_or_false(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError("must be true or false")
    return value


# vLLM's KV cache specs whose blocks hold every token of the prefix (not sliding windows, chunked
# local attention, sinks or state): only those name a prefix's KV by its tokens.
WHOLE_PREFIX_SPECS = ("FullAttentionSpec", "MLAAttentionSpec")


def check_kv_cache_groups(kv_cache_config: Any) -> None:
    """Refuse a KV cache the connector's blocks cannot stand for: more than one group (hybrid
    models), or a group whose blocks do not hold the whole prefix (vLLM frees a sliding window's
    old blocks and hands them to other requests). Raises ValueError naming it."""
    groups = list(getattr(kv_cache_config, "kv_cache_groups", None) or [])
    if len(groups) > 1:
        raise ValueError(f"{len(groups)} KV cache groups (a hybrid model): the chunkstore connector supports one")
    for group in groups:
        kind = type(group.kv_cache_spec).__name__
        if kind not in WHOLE_PREFIX_SPECS:
            raise ValueError(f"KV cache spec {kind} (e.g. sliding-window attention) is not supported by the "
                             f"chunkstore connector; it needs {' or '.join(WHOLE_PREFIX_SPECS)}")


def is_mla(vllm_config: "VllmConfig") -> bool:
    return bool(getattr(vllm_config.model_config, "use_mla", False))


def identity_for(vllm_config: "VllmConfig", tp_rank: int) -> ModelIdentity:
    """The identity of the blocks the KV cache of TP rank ``tp_rank`` holds. An MLA model's latent
    row of C values per token is stored as two halves, ``(layers, 2, block, 1, C/2)``, a view of the
    same bytes. Raises ValueError for pipeline or context parallelism and an odd MLA width."""
    model, parallel, cache = vllm_config.model_config, vllm_config.parallel_config, vllm_config.cache_config
    if parallel.pipeline_parallel_size > 1:
        raise ValueError("pipeline parallelism is not supported by the chunkstore connector yet")
    for name in ("decode_context_parallel_size", "prefill_context_parallel_size"):
        if getattr(parallel, name, 1) > 1:  # a block's tokens are then spread over ranks
            raise ValueError(f"context parallelism ({name} > 1) is not supported by the chunkstore connector yet")
    dtype = model.dtype if cache.cache_dtype in (None, "auto") else cache.cache_dtype
    dtype = str(dtype).removeprefix("torch.")
    # The weights are named by model and revision (and quantization): a local folder whose weights
    # are replaced under the same path needs a new data folder (docs/INTEGRATIONS.md).
    quantization = getattr(model, "quantization", None) or "none"
    # vLLM resets data_parallel_rank to 0 in each engine of a dense model; the index stays the engine's.
    dp = getattr(parallel, "data_parallel_index", getattr(parallel, "data_parallel_rank", 0))
    model_id = f"vllm:{model.model}@{model.revision or 'default'}:q={quantization}:dp={dp}"
    layers = model.get_num_layers(parallel)
    if is_mla(vllm_config):
        width = model.get_head_size()
        if width % 2:
            raise ValueError(f"an MLA row of {width} values does not split in two halves")
        return ModelIdentity(model_id=model_id + ":mla", kv_dtype=dtype, num_layers=layers, num_kv_heads=1,
                             head_dim=width // 2, page_size=cache.block_size)
    return ModelIdentity(model_id=model_id, kv_dtype=dtype, num_layers=layers,
                         num_kv_heads=model.get_num_kv_heads(parallel), head_dim=model.get_head_size(),
                         page_size=cache.block_size, tp_rank=tp_rank, tp_size=parallel.tensor_parallel_size)


def store_ranks(vllm_config: "VllmConfig") -> range:
    """The TP ranks whose stores hold a block's KV (each has its own): every rank's, or for an MLA
    model (one store, written by rank 0) rank 0's."""
    return range(1) if is_mla(vllm_config) else range(vllm_config.parallel_config.tensor_parallel_size)


def is_writer(vllm_config: "VllmConfig", tp_rank: int) -> bool:
    """Whether TP rank ``tp_rank`` saves blocks: every rank, or for an MLA model rank 0 only."""
    return tp_rank == 0 or not is_mla(vllm_config)


def namespace_for(cache_salt: str | None) -> str:
    """A request's namespace: the default without a salt, else one derived from it (so a salt's
    text is not written into the store's names, and any salt makes a namespace that keeps the rule
    of chunkstore/disk/namespaces.py, checked here all the same). Never raises for a salt: one
    with a lone surrogate hashes its surrogate's bytes (no UTF-8 text has them, so it shares no
    namespace), as the scheduler's lookups must not fail."""
    if cache_salt is None:
        return DEFAULT_NAMESPACE
    salt = cache_salt.encode("utf-8", "surrogatepass")
    return check_namespace("salt-" + hashlib.blake2b(salt, digest_size=12).hexdigest())
