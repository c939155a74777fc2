"""The reference engine: Hugging Face causal LMs run on the tiered KV cache.

It calls the cache's public methods only (match, allocate_device, insert, release, prefetch,
flush, stats, close); nothing below imports it. Building an Engine loads a model and starts a
thread; importing this package does neither. See docs/ENGINE.md.
"""

from chunkstore.engine.engine import Engine, EngineConfig
from chunkstore.engine.loader import LoadedModel, UnsupportedModelError, load_model
from chunkstore.engine.presets import PRESETS, Preset
from chunkstore.engine.request import (EngineClosedError, EngineError, FinishReason, GenerationResult,
                                       InvalidPromptError, PromptTooLongError, QueueFullError, Request, RequestHandle,
                                       TextDelta)
from chunkstore.engine.runner import ModelRunner, Sequence
from chunkstore.engine.sampling import SamplingParams
from chunkstore.engine.tokenizer import ByteTokenizer, HFTokenizer, Tokenizer

__all__ = [
    "ByteTokenizer", "Engine", "EngineClosedError", "EngineConfig", "EngineError", "FinishReason",
    "GenerationResult", "HFTokenizer", "InvalidPromptError", "LoadedModel", "ModelRunner", "PRESETS", "Preset", "PromptTooLongError",
    "QueueFullError", "Request", "RequestHandle", "SamplingParams", "Sequence", "TextDelta", "Tokenizer",
    "UnsupportedModelError", "load_model",
]
