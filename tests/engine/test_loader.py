"""Presets and local model folders: seeded weights, identities that name the weights, refusals."""

from __future__ import annotations

import os
import time

import pytest
import torch

from chunkstore.cache.tiered import TieredCache
from chunkstore.engine import ModelRunner, load_model
from chunkstore.engine.loader import UnsupportedModelError, folder_digest, parse_dtype
from chunkstore.engine.presets import PRESETS
from tests.helpers.engine import PAGE_SIZE, cache_config, random_ids
from tests.engine.test_tokenizer import TEMPLATE, make_hf_folder


def test_presets_are_gqa_llamas():
    for preset in PRESETS.values():
        assert preset.num_kv_heads < preset.num_heads
        assert preset.llama_config().model_type == "llama"


def test_preset_weights_and_id_follow_the_seed(tiny):
    again = load_model("tiny", seed=0)
    assert again.model_id == tiny.model_id
    assert tiny.model_id.startswith("preset:tiny:seed=0:float32:w=")
    for (name, a), (_, b) in zip(tiny.model.named_parameters(), again.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    other = load_model("tiny", seed=1)
    assert other.model_id != tiny.model_id


def test_bf16_is_the_fp32_model_rounded(tiny, tiny_bf16):
    assert tiny_bf16.model_id != tiny.model_id and tiny_bf16.identity(16).kv_dtype == "bfloat16"
    w32 = tiny.model.model.embed_tokens.weight
    assert torch.equal(tiny_bf16.model.model.embed_tokens.weight, w32.to(torch.bfloat16))


def test_identity_shape(tiny):
    ident = tiny.identity(PAGE_SIZE)
    assert (ident.num_layers, ident.num_kv_heads, ident.head_dim) == (4, 2, 32)
    assert tiny.max_positions == 4096 and tiny.device.type in ("cpu", "cuda")


def test_bad_names_list_the_choices():
    with pytest.raises(ValueError, match="tiny, small"):
        load_model("huge")
    with pytest.raises(ValueError, match="bfloat16"):
        parse_dtype("float8")
    assert parse_dtype("bf16") == "bfloat16"
    with pytest.raises(OSError, match="does not exist"):
        load_model("./no/such/folder")


def test_tiny_prefills_1k_tokens_well_under_a_second(tiny, tmp_path):
    prompt = random_ids(1024, seed=12)
    with TieredCache.open(cache_config(tmp_path, use_disk=False, device_pages=512), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        best_s = float("inf")
        for i in range(3):
            seq = runner.prefill(prompt, f"timing-{i}")  # its own namespace: never a hit
            runner.finish(seq)
            best_s = min(best_s, seq.prefill_s)
    print(f"1k-token prefill on tiny: {best_s * 1000:.1f} ms")
    assert best_s < 0.5


def make_model_folder(path, *, sliding_window: int | None = None) -> None:
    from transformers import AutoTokenizer, MistralConfig, MistralForCausalLM

    make_hf_folder(path, chat_template=TEMPLATE)
    vocab = len(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    config = MistralConfig(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                           sliding_window=sliding_window, bos_token_id=0, eos_token_id=1)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        MistralForCausalLM(config).save_pretrained(str(path))


def test_model_folder_loads_and_names_its_weights(tmp_path):
    make_model_folder(tmp_path)
    loaded = load_model(tmp_path)
    assert loaded.model_id == f"folder:{tmp_path.name}:float32:d={folder_digest(tmp_path)}"
    assert (loaded.num_layers, loaded.num_kv_heads, loaded.head_dim, loaded.max_positions) == (2, 2, 16, 512)
    assert 1 in loaded.tokenizer.eos_token_ids
    assert load_model(tmp_path).model_id == loaded.model_id  # stable across loads
    weights = next(tmp_path.glob("*.safetensors"))
    stamp = time.time() - 100
    os.utime(weights, (stamp, stamp))
    assert load_model(tmp_path).model_id != loaded.model_id  # touched weights: another id


def test_sliding_window_models_are_refused(tmp_path):
    make_model_folder(tmp_path, sliding_window=32)
    with pytest.raises(UnsupportedModelError, match="sliding_window=32"):
        load_model(tmp_path)
