"""chunkstore's Llama (the presets' model) against transformers' own Llama on the same weights."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from transformers import DynamicCache
from transformers import LlamaForCausalLM as TransformersLlama

from chunkstore.engine.kv_pages import forward, forward_batch_step, layer_kv
from chunkstore.engine.presets import PRESETS, build_preset_model


def _pair(name: str, seed: int = 3):
    preset = PRESETS[name]
    ours = build_preset_model(preset, seed=seed, dtype=torch.float32, device=torch.device("cpu"))
    config = preset.llama_config()
    config._attn_implementation = "sdpa"
    theirs = TransformersLlama(config).eval()
    theirs.load_state_dict(ours.state_dict(), strict=True)  # the same parameter names, every one
    return ours, theirs


CPU_PRESETS = ("tiny", "small")  # llama-1b is checked by its shape below: 4 GB of fp32 weights, twice, is a GPU's job


def test_every_preset_but_the_gpu_one_is_compared_with_transformers():
    assert set(PRESETS) - set(CPU_PRESETS) == {"llama-1b"}


def test_the_gpu_preset_has_llama_3_2_1b_shape():
    preset = PRESETS["llama-1b"]
    with torch.device("meta"):  # shapes only: no weights drawn
        model = TransformersLlama(preset.llama_config())
    num_params = sum(p.numel() for p in model.parameters())
    assert 0.95e9 < num_params < 1.0e9  # Llama-3.2-1B's 1.24B less its 128k-token embeddings
    kv_bytes_per_token = preset.num_layers * 2 * preset.num_kv_heads * preset.head_dim * 2  # bf16
    assert (preset.head_dim, kv_bytes_per_token) == (64, 32 * 1024)


@pytest.mark.parametrize("name", CPU_PRESETS)
def test_prefill_and_continuation_match_transformers(name):
    ours, theirs = _pair(name)
    ids = torch.randint(0, 250, (1, 150), generator=torch.Generator().manual_seed(1))
    kv_ours, kv_theirs = DynamicCache(), DynamicCache()
    with torch.inference_mode():
        for start, end in ((0, 100), (100, 150)):  # a prefill, then a chunk on top of its cache
            a = forward(ours, ids[:, start:end], kv_ours, start_position=start, logits_to_keep=0)
            b = forward(theirs, ids[:, start:end], kv_theirs, start_position=start, logits_to_keep=0)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    for (k1, v1), (k2, v2) in zip(layer_kv(kv_ours), layer_kv(kv_theirs), strict=True):
        torch.testing.assert_close(k1, k2, rtol=1e-5, atol=1e-5)  # the KV pages hold: after rotary
        torch.testing.assert_close(v1, v2, rtol=1e-5, atol=1e-5)


def test_batched_decode_with_padding_matches_transformers():
    ours, theirs = _pair("tiny")
    ids = torch.randint(0, 250, (1, 90), generator=torch.Generator().manual_seed(2))
    lengths = (30, 90, 61)
    with torch.inference_mode():
        caches = []
        for model in (ours, theirs):
            kvs = [DynamicCache() for _ in lengths]
            for kv, n in zip(kvs, lengths):
                forward(model, ids[:, :n], kv, start_position=0)
            caches.append(kvs)
        a = forward_batch_step(ours, [5, 7, 9], caches[0])
        b = forward_batch_step(theirs, [5, 7, 9], caches[1])
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    assert [kv.get_seq_length() for kv in caches[0]] == [n + 1 for n in lengths]


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_preset_loads_without_transformers_modelling_code():
    code = ("import sys; from chunkstore.engine import load_model; load_model('tiny'); "
            "print(sorted(m for m in ('transformers.modeling_utils', 'transformers.models.llama') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120)
    assert out.stdout.strip() == "[]"
