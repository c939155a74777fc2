"""The KV layout mapping between the cache's page pool and a transformers ``DynamicCache``.

Pool page (slot s): ``buffer[s]`` of shape ``(num_layers, 2, page_size, num_kv_heads, head_dim)``
(2 = K, V). DynamicCache layer l: keys and values of shape ``(1, num_kv_heads, tokens, head_dim)``.
Token t of page i of a request is position ``i * page_size + t``; K/V are stored after RoPE, so a
page is only valid at the positions it was computed at (a prefix always is). Invariants: gathers
and scatters are whole-tensor ops (index_select / index_copy_ over pages, one loop over layers,
none over tokens); the pool and the model share one dtype, so a round trip changes no bit.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch


def new_kv_cache() -> Any:
    """An empty ``transformers.DynamicCache``; layers appear as the model (or ``load_pages``) fills them."""
    from transformers import DynamicCache

    return DynamicCache()


def layer_kv(kv: Any) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer, each ``(1, num_kv_heads, tokens, head_dim)``."""
    return [(layer.keys, layer.values) for layer in kv.layers]


_CACHE_KWARGS: dict[type, str] = {}  # model class -> the name of forward's KV cache argument


def _cache_kwarg(model: Any) -> str:
    # Later transformers 5.x releases rename forward's past_key_values to cache (the old name
    # warns, then goes away); ask the signature once per class rather than pin either name.
    name = _CACHE_KWARGS.get(type(model))
    if name is None:
        params = inspect.signature(model.forward).parameters
        name = _CACHE_KWARGS[type(model)] = "cache" if "cache" in params else "past_key_values"
    return name


def forward(model: Any, input_ids: torch.Tensor, kv: Any, *, start_position: int,
            logits_to_keep: int = 1) -> torch.Tensor:
    """Run ``input_ids`` (shape ``(1, n)``) at positions ``start_position ...`` on top of ``kv``
    (which must hold exactly ``start_position`` tokens and gains these ``n``). Returns the logits
    of the last ``logits_to_keep`` positions (0: all), shape ``(kept, vocab)``, in float32.
    Raises ValueError when ``kv`` holds another number of tokens."""
    held = kv.get_seq_length()
    if held != start_position:
        raise ValueError(f"the KV cache holds {held} tokens, the input starts at position {start_position}")
    n = input_ids.shape[1]
    position_ids = torch.arange(start_position, start_position + n, device=input_ids.device).unsqueeze(0)
    out = model(input_ids=input_ids, position_ids=position_ids, use_cache=True, logits_to_keep=logits_to_keep,
                **{_cache_kwarg(model): kv})
    return out.logits[0].float()


def forward_batch_step(model: Any, token_ids: list[int], kvs: list[Any]) -> torch.Tensor:
    """One decode step of several sequences in one forward: token ``token_ids[i]`` goes at the end
    of ``kvs[i]`` (each a DynamicCache of its own length, which gains that token's K/V). Returns
    float32 logits ``(len(kvs), vocab)``. The caches are left-padded into one batch whose padding
    the attention mask hides, so each row equals its own single-sequence step up to float
    rounding; the model's weights are read once for the whole batch (a decode step is bound by
    those reads, not by compute). Raises ValueError for an empty batch or mismatched lengths."""
    if not kvs or len(kvs) != len(token_ids):
        raise ValueError(f"{len(token_ids)} tokens for {len(kvs)} sequences")
    lengths = [kv.get_seq_length() for kv in kvs]
    longest, batch = max(lengths), len(kvs)
    device = layer_kv(kvs[0])[0][0].device
    padded = new_kv_cache()
    for layer, per_seq in enumerate(zip(*(layer_kv(kv) for kv in kvs), strict=True)):
        keys0 = per_seq[0][0]
        shape = (batch, keys0.shape[1], longest, keys0.shape[3])
        keys, values = keys0.new_zeros(shape), keys0.new_zeros(shape)
        for row, ((k, v), n) in enumerate(zip(per_seq, lengths, strict=True)):
            keys[row, :, longest - n:] = k[0]
            values[row, :, longest - n:] = v[0]
        padded.update(keys, values, layer)
    mask = torch.zeros(batch, longest + 1, dtype=torch.long, device=device)
    for row, n in enumerate(lengths):
        mask[row, longest - n:] = 1
    out = model(input_ids=torch.tensor(token_ids, device=device).unsqueeze(1), attention_mask=mask,
                position_ids=torch.tensor(lengths, device=device).unsqueeze(1), use_cache=True, logits_to_keep=1,
                **{_cache_kwarg(model): padded})
    for layer, (keys, values) in enumerate(layer_kv(padded)):
        for row, kv in enumerate(kvs):
            kv.update(keys[row:row + 1, :, -1:], values[row:row + 1, :, -1:], layer)
    return out.logits[:, -1].float()


def load_pages(buffer: torch.Tensor, slots: torch.Tensor, kv: Any) -> None:
    """Fill the empty ``kv`` with the pages in ``slots`` of the pool ``buffer``, in order (one
    copy: a gather across pages, then a permute to heads-first). Raises ValueError when ``kv``
    is not empty."""
    if kv.get_seq_length() != 0:
        raise ValueError("load_pages needs an empty KV cache (a cached prefix starts at position 0)")
    n = slots.numel()
    if n == 0:
        return
    pages = buffer.index_select(0, slots.to(buffer.device))  # (n, L, 2, P, H, D)
    num_layers, _, page_size, num_heads, head_dim = pages.shape[1:]
    heads_first = pages.permute(1, 2, 4, 0, 3, 5).reshape(num_layers, 2, num_heads, n * page_size, head_dim)
    for layer in range(num_layers):
        kv.update(heads_first[layer, 0].unsqueeze(0), heads_first[layer, 1].unsqueeze(0), layer)


def store_pages(buffer: torch.Tensor, slots: torch.Tensor, kv: Any, *, first_page: int) -> None:
    """Write pages ``first_page, first_page + 1, ...`` of ``kv`` (one per slot) into ``slots`` of
    the pool ``buffer``. Raises ValueError when ``kv`` lacks those tokens or its dtype differs."""
    n = slots.numel()
    if n == 0:
        return
    page_size = buffer.shape[3]
    start, end = first_page * page_size, (first_page + n) * page_size
    layers = layer_kv(kv)
    if kv.get_seq_length() < end:
        raise ValueError(f"pages up to token {end} asked; the KV cache holds {kv.get_seq_length()}")
    if layers[0][0].dtype != buffer.dtype:
        raise ValueError(f"model KV is {layers[0][0].dtype}, the pool holds {buffer.dtype}")
    span = torch.stack([torch.stack((k[0, :, start:end], v[0, :, start:end])) for k, v in layers])  # (L, 2, H, T, D)
    num_layers, _, num_heads, _, head_dim = span.shape
    pages = span.view(num_layers, 2, num_heads, n, page_size, head_dim).permute(3, 0, 1, 4, 2, 5)
    buffer.index_copy_(0, slots.to(buffer.device), pages)
