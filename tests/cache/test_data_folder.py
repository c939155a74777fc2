"""One data folder serves any model: the first model's store is the folder itself, each further
model identity gets a store of its own below it (models/<model>-<digest>/), so a second model over
the same --disk-path starts instead of failing with a mismatch, two models' caches run at once,
and their pages never mix."""

from __future__ import annotations

import dataclasses

from chunkstore.cache.tiered import TieredCache
from chunkstore.disk.store import MODELS_DIRNAME, read_identity, store_root
from tests.cache.test_tiered import P, make_config, serve, settle
from tests.helpers import TINY

OTHER = dataclasses.replace(TINY, model_id="other-model@rev2")
TOKENS = [7000 + i for i in range(P * 3)]


def test_a_second_model_gets_a_store_of_its_own_and_both_run_at_once(tmp_path):
    config = make_config(tmp_path)
    data = config.disk_path
    with TieredCache.open(config, TINY) as first, TieredCache.open(config, OTHER) as second:
        assert first.store.root == data
        assert second.store.root.parent == data / MODELS_DIRNAME
        assert second.store.root.name.startswith("other-model-rev2-")
        serve(first, TOKENS)
        settle(first)
        assert serve(second, TOKENS).num_tokens == 0  # another model's KV is never a hit
        settle(second)
        assert first.store.stats().num_chunks == second.store.stats().num_chunks == 3
    assert read_identity(data) == TINY and read_identity(store_root(data, OTHER)) == OTHER
    for identity in (OTHER, TINY):  # each reopens its own store and finds its pages on disk
        with TieredCache.open(config, identity) as cache:
            hit = serve(cache, TOKENS)
            assert hit.num_tokens == hit.disk_tokens == len(TOKENS)


def test_store_root_names_each_identity_apart(tmp_path):
    assert store_root(tmp_path, TINY) == tmp_path  # a new folder: the first model takes it
    with TieredCache.open(make_config(tmp_path, disk_path=tmp_path), TINY):
        pass
    assert store_root(tmp_path, TINY) == tmp_path
    a, b = store_root(tmp_path, OTHER), store_root(tmp_path, dataclasses.replace(OTHER, kv_dtype="float16"))
    assert a != b and a.parent == b.parent == tmp_path / MODELS_DIRNAME  # same name, another identity
    weird = store_root(tmp_path, dataclasses.replace(TINY, model_id="/models/../Llama 3:8b"))
    assert weird.parent == tmp_path / MODELS_DIRNAME and "/" not in weird.name and ".." not in weird.name
