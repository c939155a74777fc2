"""A storage backend that SGLang's factory builds under the names of its other built-in backends in
tests/integrations/test_bench_sglang.py (registered with SGLang's public
``StorageBackendFactory.register_backend``), so that ``bench sglang --systems`` meets a third
system that starts on a host where none of the real ones does."""

from __future__ import annotations

from sglang.srt.mem_cache.hicache_storage import HiCacheFile


class FileUnderAnotherName(HiCacheFile):
    """HiCacheFile, built the way SGLang builds the backends that also take the host pool."""

    def __init__(self, storage_config, mem_pool_host=None):
        super().__init__(storage_config)
