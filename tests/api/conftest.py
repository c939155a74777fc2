"""A real uvicorn server on 127.0.0.1 (a free port, in a thread, bounded waits) over real stores
and caches in tmp_path; httpx clients with and without tokens.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chunkstore.api import CacheBackend, StoreBackend, create_app
from chunkstore.cache.tiered import TieredCache
from tests.cache.test_tiered import make_config
from tests.helpers import TINY
from tests.helpers.api import Served, decode_tokens, fill_store, live_server, served_store, settings, warm


@pytest.fixture
def store_server(tmp_path) -> Iterator[Served]:
    root = tmp_path / "store"
    pages, other = fill_store(root)
    with served_store(StoreBackend(root), root, pages, other) as served:
        yield served


@pytest.fixture
def live_cache(tmp_path) -> Iterator[TieredCache]:
    cache = TieredCache.open(make_config(tmp_path), TINY)
    try:
        yield cache
    finally:
        cache.close()


@pytest.fixture
def cache_server(tmp_path, live_cache) -> Iterator[Served]:
    warm(live_cache)
    backend = CacheBackend(live_cache, decode=decode_tokens)
    app = create_app(backend, settings())
    with live_server(app) as url:
        yield Served(url, live_cache.store.root, backend, app, [], [])
