"""A Llama decoder in plain torch: the presets' model, so that starting one never imports
transformers' modelling stack (about two seconds of every ``chunkstore serve`` start on a CPU).

Invariants: the math is Llama's (RMSNorm, rotary positions with theta 10^4 on pairs of halves,
grouped-query attention, a SiLU-gated MLP, no biases, untied output head), and the parameter
names are those of ``transformers.LlamaForCausalLM``, so the same seeded weights give the same
model (a test compares the logits with transformers' own on the same weights). It takes the call
the engine makes of a transformers causal LM: ``input_ids``, ``position_ids``, an optional 0/1
``attention_mask`` over cached plus new tokens, a ``DynamicCache`` as ``past_key_values`` (which
gains the new tokens' K/V after rotary, as a transformers model leaves it) and
``logits_to_keep``. A new token attends to every cached one and to the new ones up to itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ROPE_THETA = 10_000.0
RMS_NORM_EPS = 1e-6


@dataclass(frozen=True)
class LlamaShape:
    """What the engine reads off a model's config (the names transformers' configs use)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int

    def get_text_config(self, decoder: bool = True) -> "LlamaShape":
        return self


@dataclass(frozen=True)
class CausalLMOutput:
    logits: torch.Tensor  # (batch, kept positions, vocab)


class RMSNorm(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + RMS_NORM_EPS)
        return self.weight * x32.to(in_dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


class Attention(nn.Module):
    def __init__(self, shape: LlamaShape, layer: int) -> None:
        super().__init__()
        self.layer, self.num_heads, self.num_kv_heads = layer, shape.num_attention_heads, shape.num_key_value_heads
        self.head_dim = shape.head_dim
        self.q_proj = nn.Linear(shape.hidden_size, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(shape.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(shape.hidden_size, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: Any,
                mask: torch.Tensor) -> torch.Tensor:
        batch, n, _ = x.shape
        q = self.q_proj(x).view(batch, n, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, n, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        k, v = kv.update(k, v, self.layer)  # every cached token's K/V, then these
        group = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(out.transpose(1, 2).reshape(batch, n, self.num_heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.up_proj = nn.Linear(shape.hidden_size, shape.intermediate_size, bias=False)
        self.down_proj = nn.Linear(shape.intermediate_size, shape.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, shape: LlamaShape, layer: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(shape.hidden_size)
        self.self_attn = Attention(shape, layer)
        self.post_attention_layernorm = RMSNorm(shape.hidden_size)
        self.mlp = MLP(shape)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, kv: Any,
                mask: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, kv, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(shape.vocab_size, shape.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(shape, i) for i in range(shape.num_hidden_layers))
        self.norm = RMSNorm(shape.hidden_size)


class LlamaForCausalLM(nn.Module):
    """The decoder and its output head; ``forward`` takes the engine's call (module docstring)."""

    def __init__(self, shape: LlamaShape) -> None:
        super().__init__()
        self.config = shape
        self.model = LlamaModel(shape)
        self.lm_head = nn.Linear(shape.hidden_size, shape.vocab_size, bias=False)
        exponents = torch.arange(0, shape.head_dim, 2, dtype=torch.float32) / shape.head_dim
        self.register_buffer("inv_freq", 1.0 / (ROPE_THETA ** exponents), persistent=False)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, past_key_values: Any,
                attention_mask: torch.Tensor | None = None, use_cache: bool = True,
                logits_to_keep: int = 0) -> CausalLMOutput:
        batch, n = input_ids.shape
        cached = past_key_values.get_seq_length()
        x = self.model.embed_tokens(input_ids)
        freqs = position_ids[..., None].float() * self.inv_freq.to(x.device)  # (batch, n, head_dim / 2)
        angles = torch.cat((freqs, freqs), dim=-1).unsqueeze(1)  # (batch, 1, n, head_dim)
        cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
        # Query i (the cached + i-th token) sees keys 0 .. cached + i, less any masked-out padding.
        mask = torch.ones(n, cached + n, dtype=torch.bool, device=x.device).tril(diagonal=cached)
        mask = mask.expand(batch, 1, n, cached + n)
        if attention_mask is not None:
            mask = mask & attention_mask[:, None, None, :].bool()
        for layer in self.model.layers:
            x = layer(x, cos, sin, past_key_values, mask)
        x = self.model.norm(x)
        if logits_to_keep:
            x = x[:, -logits_to_keep:]
        return CausalLMOutput(self.lm_head(x))
