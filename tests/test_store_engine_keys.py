"""A store whose pages an engine names (``key_scheme="engine"``, SGLang's page hashes): round trips,
verification of the engine key on every read, corruption as a miss, rebuild, and the separation
from token-keyed stores."""

from __future__ import annotations

import hashlib

import pytest
import torch

from chunkstore import ChunkStore, ModelIdentity, chain_pages, engine_pages
from chunkstore.disk.maintenance import rebuild, verify
from chunkstore.testing.tensors import same_bytes

IDENTITY = ModelIdentity("sglang:test-model", "bfloat16", 2, 2, 16, 4, key_scheme="engine")


def engine_keys(n: int, salt: bytes = b"") -> list[bytes]:
    """A chain of SHA-256 page keys, each over the previous one, as SGLang makes them."""
    keys, prev = [], salt
    for i in range(n):
        prev = hashlib.sha256(prev + i.to_bytes(4, "little")).digest()
        keys.append(prev)
    return keys


def tensors(n: int, seed: int = 0) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(IDENTITY.page_shape, generator=g).to(torch.bfloat16) for _ in range(n)]


def test_engine_keyed_pages_round_trip_and_survive_a_reopen(tmp_path):
    pages, data = engine_pages(IDENTITY, engine_keys(5)), tensors(5)
    with ChunkStore(tmp_path, IDENTITY) as store:
        assert store.put(pages, data).ok
        assert store.longest_prefix([p.key for p in pages]) == 5
    with ChunkStore(tmp_path, IDENTITY) as store:  # a restart: found by the same engine keys
        again = engine_pages(IDENTITY, engine_keys(5))
        outs = [torch.empty_like(t) for t in data]
        assert store.get_into(again, outs) == [True] * 5
        assert all(same_bytes(o, t) for o, t in zip(outs, data))
        assert {r.num_tokens for r in store.iter_rows()} == {IDENTITY.page_size}  # a page still covers page_size tokens


def test_a_page_of_tokens_is_refused_by_an_engine_store(tmp_path):
    tokens_identity = ModelIdentity("sglang:test-model", "bfloat16", 2, 2, 16, 4)
    with ChunkStore(tmp_path, IDENTITY) as store:
        with pytest.raises(ValueError, match="ids"):
            store.put(chain_pages(tokens_identity, list(range(4))), tensors(1))


def test_a_corrupt_chunk_is_a_miss_for_it_and_its_suffix(tmp_path):
    pages, data = engine_pages(IDENTITY, engine_keys(4)), tensors(4)
    with ChunkStore(tmp_path, IDENTITY) as store:
        assert store.put(pages, data).ok
        path = store.payloads.path_for(pages[1].key)
        raw = bytearray(path.read_bytes())
        raw[-10] ^= 0xFF  # a flipped payload byte: the checksum no longer matches
        path.write_bytes(bytes(raw))
        outs = [torch.zeros_like(t) for t in data]
        hits = store.get_into(pages, outs)
        assert hits == [True, False, True, True]  # the store reports per page; the backend cuts at the hole
        assert store.longest_prefix([p.key for p in pages]) == 1  # quarantined: the chain now ends before it


def test_rebuild_and_verify_read_engine_keyed_files(tmp_path):
    pages, data = engine_pages(IDENTITY, engine_keys(3)), tensors(3)
    with ChunkStore(tmp_path, IDENTITY) as store:
        assert store.put(pages, data).ok
    with ChunkStore(tmp_path, IDENTITY, reset_index=True) as store:
        report = rebuild(store)
        assert (report.scanned, report.indexed, report.quarantined) == (3, 3, 0)
        assert {r.num_tokens for r in store.iter_rows()} == {IDENTITY.page_size}
        assert verify(store).ok == 3
        assert store.longest_prefix([p.key for p in pages]) == 3


def test_a_token_keyed_identity_keeps_the_json_and_folder_it_had_before_key_schemes():
    import json

    legacy = ModelIdentity("m", "bfloat16", 2, 2, 16, 4)
    assert "key_scheme" not in json.loads(legacy.to_json())
    assert ModelIdentity.from_json(legacy.to_json()) == legacy
    assert json.loads(IDENTITY.to_json())["key_scheme"] == "engine"
    assert ModelIdentity.from_json(IDENTITY.to_json()) == IDENTITY
    # The digest of models/<model>-<digest>/ as the first release computed it for this identity.
    expected = hashlib.blake2b(json.dumps({"model_id": "m", "kv_dtype": "bfloat16", "num_layers": 2,
                                           "num_kv_heads": 2, "head_dim": 16, "page_size": 4, "layout_version": 1,
                                           "tp_rank": 0, "tp_size": 1}, sort_keys=True).encode(),
                               digest_size=6).hexdigest()
    assert store_root_digest(legacy) == expected


def store_root_digest(identity: ModelIdentity) -> str:
    import tempfile
    from pathlib import Path

    from chunkstore.disk.store_folder import store_root

    with tempfile.TemporaryDirectory() as d:
        with ChunkStore(Path(d), ModelIdentity("other", "bfloat16", 2, 2, 16, 4)):
            pass
        return store_root(Path(d), identity).name.rsplit("-", 1)[1]
