"""Built-in models: Llama-architecture presets with seeded random weights and the byte vocabulary.

Invariants: nothing is downloaded; the weights are a pure function of (preset, seed) drawn in
float32 on the CPU from one ``torch.Generator`` in sorted parameter-name order, then rounded to
the requested dtype (so a bf16 model is the fp32 model rounded); ``weights_digest`` hashes the
resulting bytes, so a model id that contains it names the weights, whatever the init code was.
A preset generates only newline, printable ASCII and EOS (the byte tokenizer's
``never_sampled_ids``, masked by the sampler): that changes which token comes next, never the KV
of a given token sequence, so neither the weights nor the model id (nor any cached page) depend on it.
The model is chunkstore's own Llama (chunkstore.engine.llama); ``MODEL_CODE_VERSION`` is part of a
preset's model id and changes whenever that code's arithmetic does, so no page computed by one
version is served to another.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import xxhash

from chunkstore.engine.llama import LlamaForCausalLM, LlamaShape
from chunkstore.engine.tokenizer import BOS_ID, EOS_ID, PAD_ID, ByteTokenizer


@dataclass(frozen=True, slots=True)
class Preset:
    """The shape of a built-in model. Every preset uses GQA (fewer KV heads than heads)."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    max_positions: int
    description: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def shape(self) -> LlamaShape:
        return LlamaShape(vocab_size=ByteTokenizer().vocab_size, hidden_size=self.hidden_size,
                          intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                          num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                          head_dim=self.head_dim, max_position_embeddings=self.max_positions)

    def llama_config(self):
        """The same model as a ``transformers.LlamaConfig`` (a test runs transformers' Llama on
        the preset's weights and compares)."""
        from transformers import LlamaConfig

        return LlamaConfig(
            vocab_size=ByteTokenizer().vocab_size, hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads, head_dim=self.head_dim,
            max_position_embeddings=self.max_positions, tie_word_embeddings=False,
            bos_token_id=BOS_ID, eos_token_id=EOS_ID, pad_token_id=PAD_ID,
        )


MODEL_CODE_VERSION = 1  # of chunkstore.engine.llama's arithmetic (transformers' Llama: none, before)

PRESETS: dict[str, Preset] = {
    p.name: p for p in (
        Preset("tiny", num_layers=4, hidden_size=128, intermediate_size=256, num_heads=4, num_kv_heads=2,
               max_positions=4096, description="tests: ~0.4M parameters, a 1k-token prefill in tens of ms on a CPU"),
        Preset("small", num_layers=8, hidden_size=512, intermediate_size=1536, num_heads=8, num_kv_heads=2,
               max_positions=8192, description="benchmarks: ~25M parameters, 8 KiB of fp32 KV per token"),
        Preset("llama-1b", num_layers=16, hidden_size=2048, intermediate_size=8192, num_heads=32, num_kv_heads=8,
               max_positions=8192, description="GPU benchmarks: Llama-3.2-1B's shape with the byte vocabulary, "
                                               "~0.97B parameters, 32 KiB of bf16 KV per token"),
    )
}


def get_preset(name: str) -> Preset:
    """Raises ValueError listing the presets for an unknown name."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; presets: {', '.join(PRESETS)}") from None


def seeded_init_(model: torch.nn.Module, seed: int) -> None:
    """Overwrite every parameter from ``seed``: norms 1, embeddings N(0, 1), other weights
    N(0, 1/fan_in) (unit-scale activations, so logits are peaked enough for greedy decoding to
    mean something). Changes ``model`` in place."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    params = dict(model.named_parameters())
    with torch.no_grad():
        for name in sorted(params):
            param = params[name]
            if name.endswith("norm.weight"):
                values = torch.ones(param.shape)
            elif "embed_tokens" in name:
                values = torch.randn(param.shape, generator=gen)
            else:
                values = torch.randn(param.shape, generator=gen) / math.sqrt(param.shape[-1])
            param.copy_(values.to(param.dtype))


def weights_digest(model: torch.nn.Module) -> str:
    """xxh3-128 hex of every parameter's bytes in sorted name order (16 hex chars kept)."""
    h = xxhash.xxh3_128()
    params = dict(model.named_parameters())
    for name in sorted(params):
        h.update(name.encode())
        h.update(params[name].detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def build_preset_model(preset: Preset, *, seed: int, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """chunkstore's ``LlamaForCausalLM`` of ``preset`` with seeded weights, in ``dtype`` on
    ``device``, in eval mode. Leaves the global RNG as it was."""
    with torch.random.fork_rng(devices=[]):  # torch's default init draws from the global RNG
        model = LlamaForCausalLM(preset.shape())
    seeded_init_(model, seed)
    return model.to(device=device, dtype=dtype).eval()
