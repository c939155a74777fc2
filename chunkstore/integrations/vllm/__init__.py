"""chunkstore as a vLLM KV connector: blocks vLLM computes are saved through chunkstore's tiered
cache (a staging pool on vLLM's device, the host tier, the disk tier) and loaded back into vLLM's
paged KV when a later request starts the same way, also by a new process (a warm start).

vLLM loads it with ``kv_transfer_config={"kv_connector": "ChunkstoreConnector",
"kv_connector_module_path": "chunkstore.integrations.vllm", "kv_role": "kv_both",
"kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"disk_path": ...}}``
(docs/INTEGRATIONS.md). connector.py plans (vLLM's scheduler side) and moves (its worker side);
transfers.py does a rank's loads and saves; paged_kv.py maps vLLM's KV layouts to pages;
options.py holds the settings, the model identity and the namespaces.
"""

from chunkstore.integrations.vllm.connector import ChunkstoreConnector, ChunkstoreConnectorMetadata, cache_config
from chunkstore.integrations.vllm.options import ConnectorSettings, identity_for, namespace_for
from chunkstore.integrations.vllm.paged_kv import PagedKV
from chunkstore.integrations.vllm.transfers import (TRANSFER_PAGES, BlockTransfer, WorkerTransfers, local_cache,
                                                 local_caches)

__all__ = ["BlockTransfer", "ChunkstoreConnector", "ChunkstoreConnectorMetadata", "ConnectorSettings", "PagedKV",
           "TRANSFER_PAGES", "WorkerTransfers", "cache_config", "identity_for", "local_cache", "local_caches",
           "namespace_for"]
