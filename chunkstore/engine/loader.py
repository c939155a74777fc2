"""Load a model for the engine (a built-in preset or a local Hugging Face folder) and name its weights.

Invariants: nothing is downloaded (``local_files_only=True``); ``LoadedModel.model_id`` changes
whenever the weights or the compute dtype change (a preset: name, seed, dtype, a digest of the
weight bytes and the version of chunkstore's Llama code; a folder: its name, dtype and a digest of
config.json and the weight files' names, sizes and mtimes), because the cache keys bind this string,
not the weights; a model is refused unless every layer keeps plain full-attention K/V of one shape
(the pages hold exactly that).
"""

from __future__ import annotations

import contextlib
import hashlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from chunkstore.cache.pools import default_device
from chunkstore.engine.kv_pages import forward, layer_kv, new_kv_cache
from chunkstore.engine.presets import MODEL_CODE_VERSION, build_preset_model, get_preset, weights_digest
from chunkstore.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer
from chunkstore.disk.identity import ModelIdentity

DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_DTYPE_ALIASES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16", "half": "float16"}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".index.json")


class UnsupportedModelError(ValueError):
    """The model's attention cache is not one plain K/V tensor pair per layer (e.g. sliding windows)."""


def parse_dtype(name: str) -> str:
    """'bf16' / 'bfloat16' -> 'bfloat16'. Raises ValueError listing the valid names."""
    key = _DTYPE_ALIASES.get(name.lower(), name.lower()) if isinstance(name, str) else None
    if key not in DTYPES:
        raise ValueError(f"unknown dtype {name!r}; choose one of {', '.join([*DTYPES, *_DTYPE_ALIASES])}")
    return key


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """A causal LM in eval mode with its tokenizer and what the cache needs to know about its KV."""

    model: Any  # a transformers PreTrainedModel
    tokenizer: Tokenizer
    model_id: str
    dtype_name: str
    device: torch.device
    num_layers: int
    num_kv_heads: int
    head_dim: int
    max_positions: int

    @property
    def dtype(self) -> torch.dtype:
        return DTYPES[self.dtype_name]

    def identity(self, page_size: int) -> ModelIdentity:
        """The cache identity of this model's KV in pages of ``page_size`` tokens."""
        return ModelIdentity(self.model_id, self.dtype_name, num_layers=self.num_layers,
                             num_kv_heads=self.num_kv_heads, head_dim=self.head_dim, page_size=page_size)


def folder_digest(path: Path) -> str:
    """blake2b-128 hex (16 chars kept) of config.json's bytes and, for every weight file (by
    suffix: .safetensors, .bin, .pt, .pth, .index.json), its name, size and mtime in ns. A copy
    that does not keep mtimes gets a new id (a miss, never wrong KV); hashing the weights
    themselves would cost a full read of every file at each start."""
    h = hashlib.blake2b(digest_size=16)
    h.update((path / "config.json").read_bytes())
    for f in sorted(path.iterdir()):
        if f.is_file() and f.name.endswith(_WEIGHT_SUFFIXES):
            st = f.stat()
            h.update(f"\0{f.name}\0{st.st_size}\0{st.st_mtime_ns}".encode())
    return h.hexdigest()[:16]


def load_model(name_or_path: str | Path, *, seed: int = 0, dtype: str | None = None,
               device: torch.device | str | None = None) -> LoadedModel:
    """A preset by name (``tiny``, ``small``) or a local model folder (a path that exists).

    ``dtype`` defaults to float32 for presets and on the CPU, else to the folder's own dtype.
    ``device`` defaults to CUDA when present, else the CPU. Raises ValueError for an unknown
    preset or dtype, OSError for a folder without a config or weights, UnsupportedModelError.
    """
    device = torch.device(device) if device is not None else default_device()
    path = Path(name_or_path)
    if path.is_dir():
        return _load_folder(path, dtype, device)
    if isinstance(name_or_path, Path) or "/" in str(name_or_path):
        raise OSError(f"model folder {name_or_path} does not exist")
    preset = get_preset(str(name_or_path))
    dtype_name = parse_dtype(dtype or "float32")
    model = build_preset_model(preset, seed=seed, dtype=DTYPES[dtype_name], device=device)
    model_id = f"preset:{preset.name}:seed={seed}:{dtype_name}:w={weights_digest(model)}:code={MODEL_CODE_VERSION}"
    return _finish(model, ByteTokenizer(), model_id, dtype_name, device)


@contextlib.contextmanager
def _progress_bar_on_terminal_only() -> Iterator[None]:
    """transformers' weight-loading bar only when stderr is a terminal: in a server's log (a file,
    a pipe, journald) it is carriage-return noise. Restores the previous setting after."""
    from transformers.utils import logging as hf_logging

    was_enabled = hf_logging.is_progress_bar_enabled()
    if was_enabled and not sys.stderr.isatty():
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _load_folder(path: Path, dtype: str | None, device: torch.device) -> LoadedModel:
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (path / "config.json").is_file():
        raise OSError(f"{path} has no config.json: not a Hugging Face model folder")
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    if dtype is None:
        own = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
        own = str(own).removeprefix("torch.") if own is not None else "float32"
        dtype = own if device.type == "cuda" and own in DTYPES else "float32"  # CPUs lack fast bf16 matmuls
    dtype_name = parse_dtype(dtype)
    with _progress_bar_on_terminal_only():
        model = AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True, dtype=DTYPES[dtype_name],
                                                     attn_implementation="sdpa")
    model = model.to(device).eval()
    tokenizer = HFTokenizer.from_folder(path)
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is not None:
        tokenizer.add_eos_token_ids(eos if isinstance(eos, list) else [eos])
    model_id = f"folder:{path.resolve().name}:{dtype_name}:d={folder_digest(path)}"
    return _finish(model, tokenizer, model_id, dtype_name, device)


def _finish(model: Any, tokenizer: Tokenizer, model_id: str, dtype_name: str, device: torch.device) -> LoadedModel:
    config = model.config.get_text_config(decoder=True)
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    if layer_types != {"full_attention"} or getattr(config, "sliding_window", None):
        raise UnsupportedModelError(f"{model_id}: only full-attention layers can be paged; this model has "
                                    f"{sorted(layer_types)} (sliding_window={getattr(config, 'sliding_window', None)})")
    num_layers, num_kv_heads, head_dim = _probe_kv_shape(model, device)
    if tokenizer.vocab_size > config.vocab_size:
        raise UnsupportedModelError(f"{model_id}: tokenizer has {tokenizer.vocab_size} ids, the model "
                                    f"{config.vocab_size}")
    return LoadedModel(model, tokenizer, model_id, dtype_name, device, num_layers, num_kv_heads, head_dim,
                       int(config.max_position_embeddings))


def _probe_kv_shape(model: Any, device: torch.device) -> tuple[int, int, int]:
    """(layers, KV heads, head dim) read off a one-token forward: the config's names for these
    vary by architecture, the cache's tensors do not. Raises UnsupportedModelError when layers
    differ or K and V differ in shape."""
    kv = new_kv_cache()
    with torch.inference_mode():
        forward(model, torch.zeros((1, 1), dtype=torch.long, device=device), kv, start_position=0)
    shapes = {(tuple(k.shape), tuple(v.shape)) for k, v in layer_kv(kv)}
    if len(shapes) != 1:
        raise UnsupportedModelError(f"layers keep K/V of different shapes: {sorted(shapes)}")
    (k_shape, v_shape), = shapes
    if k_shape != v_shape or len(k_shape) != 4 or k_shape[0] != 1 or k_shape[2] != 1:
        raise UnsupportedModelError(f"K {k_shape} and V {v_shape} are not (batch, kv_heads, tokens, head_dim)")
    return len(kv.layers), k_shape[1], k_shape[3]
