"""Model identity: everything that decides whether two pages of KV are interchangeable.

Invariant: two identities that differ in any field produce different root keys (see keys.py), so a
store never serves one model's KV to another. The identity also fixes the shape and dtype of a page.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from dataclasses import dataclass

# Codes are part of the on-disk format: never renumber, only append.
DTYPE_CODES: dict[str, int] = {
    "bfloat16": 1,
    "float16": 2,
    "float32": 3,
    "float8_e4m3fn": 4,
    "float8_e5m2": 5,
    "uint8": 6,
}
DTYPE_ITEMSIZE: dict[str, int] = {
    "bfloat16": 2,
    "float16": 2,
    "float32": 4,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "uint8": 1,
}
DTYPE_NAMES: dict[int, str] = {code: name for name, code in DTYPE_CODES.items()}

LAYOUT_VERSION = 1
# How pages are named: "tokens" (the key chains the page's token ids: chunkstore's own engine and
# cache) or "engine" (the key chains an engine's own page key, e.g. SGLang's SHA-256 per page, when
# the tokens never reach the store). Part of the root key, so the two never share a chunk.
KEY_SCHEMES = ("tokens", "engine")
ENGINE_KEY_BYTES = 32  # an engine page key: 32 bytes (a SHA-256 digest)
_INT_FIELDS = ("num_layers", "num_kv_heads", "head_dim", "page_size", "layout_version", "tp_rank", "tp_size")


class ModelMismatchError(ValueError):
    """A store or chunk belongs to another model identity than the one asked for."""


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """What a page of KV depends on besides its tokens (or, with ``key_scheme="engine"``, besides
    the engine's own key for it).

    The page layout is page-first: one page holds all layers, K and V, as
    ``(num_layers, 2, page_size, num_kv_heads, head_dim)`` in ``kv_dtype``.
    """

    model_id: str
    kv_dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    layout_version: int = LAYOUT_VERSION
    tp_rank: int = 0
    tp_size: int = 1
    key_scheme: str = "tokens"

    def __post_init__(self) -> None:
        if not isinstance(self.model_id, str) or not self.model_id:
            raise ValueError(f"model_id must be a non-empty string, got {self.model_id!r}")
        if self.kv_dtype not in DTYPE_CODES:
            raise ValueError(f"kv_dtype {self.kv_dtype!r} is not one of {sorted(DTYPE_CODES)}")
        for name in _INT_FIELDS:
            value = getattr(self, name)
            # int() would accept "16" and 16.5 and keep them; keys encode these fields as u64.
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            object.__setattr__(self, name, operator.index(value))  # numpy ints -> int, for JSON
            if not 0 <= getattr(self, name) < 2**64:
                raise ValueError(f"{name} must be in [0, 2**64), got {value}")
        for name in ("num_layers", "num_kv_heads", "head_dim", "page_size", "layout_version", "tp_size"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank {self.tp_rank} must be in [0, tp_size={self.tp_size})")
        if self.key_scheme not in KEY_SCHEMES:
            raise ValueError(f"key_scheme {self.key_scheme!r} is not one of {', '.join(KEY_SCHEMES)}")

    @property
    def ids_per_page(self) -> int:
        """The uint32 ids a page's key chains (and its chunk header carries): its ``page_size``
        token ids, or the 8 words of an engine page key."""
        return self.page_size if self.key_scheme == "tokens" else ENGINE_KEY_BYTES // 4

    @property
    def page_shape(self) -> tuple[int, ...]:
        return (self.num_layers, 2, self.page_size, self.num_kv_heads, self.head_dim)

    @property
    def itemsize(self) -> int:
        return DTYPE_ITEMSIZE[self.kv_dtype]

    @property
    def page_size_bytes(self) -> int:
        n = 1
        for d in self.page_shape:
            n *= d
        return n * self.itemsize

    def to_json(self) -> str:
        """The identity as ``store.json`` keeps it. ``key_scheme`` is left out while it is the
        default, so a token-keyed identity has the JSON (and the ``store_root`` digest) it had before
        engine-keyed stores existed, and older versions still read its store."""
        fields = dataclasses.asdict(self)
        if fields["key_scheme"] == "tokens":
            del fields["key_scheme"]
        return json.dumps(fields, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ModelIdentity":
        fields = json.loads(text)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(fields) - known
        if unknown:
            raise ValueError(f"unknown model identity fields: {sorted(unknown)}")
        return cls(**fields)
