"""The options of ChunkStore's constructor, checked before anything opens.

Invariant: an option the store cannot use is refused before the store takes its lock, opens its
index or starts a thread, with a ValueError that names the option, the value given and what it
may be; the checked options are normalised (choices parsed, sizes and counts as ints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from chunkstore.disk.codec import Codec
from chunkstore.disk.files import Durability
from chunkstore.priority import ThreadPriority

# zstd's levels: its fastest negative level to its strongest (ZSTD_minCLevel, ZSTD_maxCLevel).
MIN_ZSTD_LEVEL, MAX_ZSTD_LEVEL = -(1 << 17), 22


def _refuse(name: str, value: Any, what: str) -> ValueError:
    return ValueError(f"ChunkStore option {name}={value!r:.80}: {what}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _choice(name: str, parse, value: Any):
    try:
        return parse(value)
    except ValueError as exc:
        raise _refuse(name, value, str(exc)) from None


@dataclass(frozen=True, slots=True)
class StoreOptions:
    """What ChunkStore's keyword arguments set (their defaults are its signature's), checked at
    construction (see the module doc)."""

    capacity_bytes: int | None
    codec: Codec | None
    zstd_level: int | None
    durability: Durability
    num_workers: int | None
    io_threads: int | None
    decode_threads: int | None
    failure_log_interval_s: float
    claim_ttl_s: float
    background_priority: ThreadPriority

    def __post_init__(self) -> None:
        if self.capacity_bytes is not None and not (_is_int(self.capacity_bytes) and self.capacity_bytes > 0):
            raise _refuse("capacity_bytes", self.capacity_bytes, "must be a positive number of bytes (or None: "
                                                                 "unbounded)")
        if self.codec is not None:
            object.__setattr__(self, "codec", _choice("codec", Codec.parse, self.codec))
        if self.zstd_level is not None and not (_is_int(self.zstd_level)
                                                and MIN_ZSTD_LEVEL <= self.zstd_level <= MAX_ZSTD_LEVEL):
            raise _refuse("zstd_level", self.zstd_level, f"must be a zstd level, a whole number from {MIN_ZSTD_LEVEL} "
                                                         f"to {MAX_ZSTD_LEVEL} (or None: the KV-tuned parameters)")
        object.__setattr__(self, "durability", _choice("durability", Durability.parse, self.durability))
        for name in ("num_workers", "io_threads", "decode_threads"):
            value = getattr(self, name)
            if value is not None and not (_is_int(value) and value > 0):
                raise _refuse(name, value, "must be a positive number of threads (or None: the default)")
        if not (_is_number(self.failure_log_interval_s) and self.failure_log_interval_s >= 0):
            raise _refuse("failure_log_interval_s", self.failure_log_interval_s, "must be 0 or more seconds")
        if not (_is_number(self.claim_ttl_s) and self.claim_ttl_s > 0):
            raise _refuse("claim_ttl_s", self.claim_ttl_s, "must be a positive number of seconds")
        object.__setattr__(self, "background_priority",
                           _choice("background_priority", ThreadPriority.parse, self.background_priority))
