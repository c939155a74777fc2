"""KVLayout: the shape, dtype and size of one page of KV in the device and host pools.

Invariants: a layout is valid from construction on (positive integer dimensions, a dtype that the
store and this torch both know); pages are page-first, ``(num_layers, 2, page_size, num_kv_heads,
head_dim)``, so one page of all layers is one contiguous block = one chunk of the store, copied to
and from disk without reshuffling. The cache derives its layout from the model identity
(``from_identity``), the one source of the page's shape and dtype: there is no second copy to check
against it. Constructing one by hand is for pool tests and size arithmetic.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from chunkstore.disk.identity import DTYPE_CODES, DTYPE_ITEMSIZE, ModelIdentity
from chunkstore.disk.page_io import TORCH_DTYPES

_DIM_FIELDS = ("num_layers", "num_kv_heads", "head_dim", "page_size")


@dataclass(frozen=True, slots=True)
class KVLayout:
    """One page of KV for every layer: K and V of ``page_size`` tokens in ``dtype``.

    ``dtype`` is a name from ``identity.DTYPE_CODES`` (e.g. ``"bfloat16"``), the same name the
    store and the chunk headers use. Raises ValueError for a non-positive or non-integer
    dimension and for a dtype that the store or this build of torch does not know.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    page_size: int

    def __post_init__(self) -> None:
        for name in _DIM_FIELDS:
            value = getattr(self, name)
            # bool is an int and 16.0 is not an index: both are caller bugs, not sizes.
            if isinstance(value, bool) or not hasattr(value, "__index__"):
                raise ValueError(f"{name} must be an integer, got {value!r}")
            value = operator.index(value)
            if value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
            object.__setattr__(self, name, value)  # numpy ints -> int
        if self.dtype not in DTYPE_CODES:
            raise ValueError(f"dtype {self.dtype!r} is not one of {sorted(DTYPE_CODES)}")
        if self.dtype not in TORCH_DTYPES:
            raise ValueError(f"torch {torch.__version__} has no dtype {self.dtype!r}")

    @classmethod
    def from_identity(cls, identity: ModelIdentity) -> "KVLayout":
        """The layout of the pages that ``identity`` keys (same shape, dtype and page size): how
        TieredCache gets its layout."""
        return cls(
            num_layers=identity.num_layers,
            num_kv_heads=identity.num_kv_heads,
            head_dim=identity.head_dim,
            dtype=identity.kv_dtype,
            page_size=identity.page_size,
        )

    @property
    def page_shape(self) -> tuple[int, int, int, int, int]:
        return (self.num_layers, 2, self.page_size, self.num_kv_heads, self.head_dim)

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    @property
    def itemsize_bytes(self) -> int:
        return DTYPE_ITEMSIZE[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        """K and V of one token across all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.itemsize_bytes

    @property
    def page_size_bytes(self) -> int:
        return self.bytes_per_token * self.page_size

    def pages_for_bytes(self, num_bytes: int) -> int:
        """Whole pages that fit in ``num_bytes`` (rounded down). Raises ValueError when negative."""
        if isinstance(num_bytes, bool) or not hasattr(num_bytes, "__index__"):
            raise ValueError(f"num_bytes must be an integer, got {num_bytes!r}")
        num_bytes = operator.index(num_bytes)
        if num_bytes < 0:
            raise ValueError(f"num_bytes must be >= 0, got {num_bytes}")
        return num_bytes // self.page_size_bytes

    def pages_for_tokens(self, num_tokens: int) -> int:
        """Pages that ``num_tokens`` tokens occupy, counting a partial page as one."""
        num_tokens = operator.index(num_tokens)
        if num_tokens < 0:
            raise ValueError(f"num_tokens must be >= 0, got {num_tokens}")
        return -(-num_tokens // self.page_size)

    def __str__(self) -> str:
        return (f"{self.num_layers} layers x {self.num_kv_heads} KV heads x {self.head_dim} dims, "
                f"{self.dtype}, {self.page_size} tokens/page ({self.page_size_bytes} bytes)")
