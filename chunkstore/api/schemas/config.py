"""The config family: ConfigPublic (GET /config: the effective settings, never a token) and
ConfigPatch (PATCH /config: only the settings that are safe to change live; anything else is 422
with a message that says why).

Invariants: a number setting takes a JSON number only (never a boolean or a string), finite and
within its range; a disk_size must hold at least one page (``ConfigPatch.check_disk_size``, which
needs the page size); a refused PATCH changes and keeps nothing."""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from chunkstore.cache.config import GB, CacheConfig
from chunkstore.cache.policies import PrefetchPolicy
from chunkstore.cache.radix_policy import EvictionPolicy
from chunkstore.cache.admin import LIVE_SETTINGS
from chunkstore.disk.identity import ModelIdentity

from chunkstore.api.schemas.common import BackendName


class IdentityPublic(BaseModel):
    model_id: str
    kv_dtype: str
    num_layers: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    layout_version: int
    tp_rank: int
    tp_size: int
    page_size_bytes: int

    @classmethod
    def of(cls, identity: ModelIdentity) -> "IdentityPublic":
        return cls(model_id=identity.model_id, kv_dtype=identity.kv_dtype, num_layers=identity.num_layers,
                   num_kv_heads=identity.num_kv_heads, head_dim=identity.head_dim, page_size=identity.page_size,
                   layout_version=identity.layout_version, tp_rank=identity.tp_rank, tp_size=identity.tp_size,
                   page_size_bytes=identity.page_size_bytes)


class CacheSettingsPublic(BaseModel):
    """The running cache's CacheConfig (docs/CONFIG.md)."""

    page_size: int
    device_size: str
    host_ratio: float
    host_size: str | None
    use_disk: bool
    disk_path: str
    disk_ratio: float | None
    disk_size: float | None
    write_policy: str
    write_through_threshold: int
    prefetch_policy: str
    prefetch_timeout_s: float
    compression: str
    disk_load_host_share: float
    eviction_policy: str


class StoreSettingsPublic(BaseModel):
    path: str
    capacity_bytes: int | None
    codec: str
    read_only: bool


class AdminSettingsPublic(BaseModel):
    host: str
    port: int
    allowed_hosts: list[str]
    reads_need_token: bool
    token_source: str = Field(description="settings (environment or flag), file, or generated")
    token_file: str | None
    namespace_tokens: list[str] = Field(description="the namespaces that have a token (never the tokens)")
    max_body_bytes: int
    history_interval_s: float
    history_max_rows: int
    events_interval_s: float
    events_max_s: float


class PersistedSettingsPublic(BaseModel):
    """What PATCH /config kept for the next start (explicit flags and environment > these > defaults)."""

    file: str | None = Field(description="the settings file in the data folder; None without one")
    settings: dict[str, Any] = Field(description="the kept settings")
    shadowed: list[str] = Field(description="kept settings that this process's flags or environment win over")
    is_writable: bool = Field(description="whether PATCH /config can keep settings here")


class ConfigPublic(BaseModel):
    backend: BackendName
    identity: IdentityPublic
    cache: CacheSettingsPublic | None = Field(description="None offline")
    store: StoreSettingsPublic | None = Field(description="None without a disk tier")
    admin: AdminSettingsPublic
    live_settings: list[str] = Field(description="what PATCH /config may change on this backend")
    persisted: PersistedSettingsPublic


_FIXED = set(CacheConfig.model_fields) - set(LIVE_SETTINGS)
# The number settings and what their numbers are (for the message that refuses anything else).
_NUMBERS = {"prefetch_timeout_s": "seconds", "write_through_threshold": "hits",
            "disk_load_host_share": "a fraction from 0 to 1", "disk_size": "GB (10^9 bytes), or null for unbounded"}


def min_disk_size_gb(page_size_bytes: int) -> float:
    """The least disk_size (GB) that holds a page of ``page_size_bytes``, as the cache turns GB into
    bytes (``int(gb * GB)``, so the float just above ``page / GB`` where that rounds down): the
    spec's minimum and the PATCH's check, the same number."""
    least = page_size_bytes / GB
    while int(least * GB) < page_size_bytes:
        least = math.nextafter(least, math.inf)
    return least


class ConfigPatch(BaseModel):
    """Settings to change now, and (unless ``?persist=false``) kept for the next start, where the
    flags and environment still win. ``disk_size`` (GB, null: unbounded) applies at the next put,
    which evicts down to it."""

    model_config = ConfigDict(extra="forbid")

    eviction_policy: EvictionPolicy | None = None
    prefetch_policy: PrefetchPolicy | None = None
    prefetch_timeout_s: float | None = Field(None, gt=0, le=3600, allow_inf_nan=False)
    write_through_threshold: int | None = Field(None, ge=1, le=2**31)
    disk_load_host_share: float | None = Field(None, ge=0, le=1, allow_inf_nan=False)
    disk_size: float | None = Field(None, gt=0, le=1e9, allow_inf_nan=False)

    @field_validator(*_NUMBERS, mode="before")
    @classmethod
    def _a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic would read true as 1 and "5" as 5: a client that sends them has a bug to hear of.
        if isinstance(value, (bool, str)):
            raise ValueError(f"a number of {_NUMBERS[info.field_name]} is expected, not {json.dumps(value)}")
        return value

    @model_validator(mode="before")
    @classmethod
    def _only_live(cls, data: Any) -> Any:
        if isinstance(data, dict):
            fixed = sorted(set(data) & _FIXED)
            if fixed:
                raise ValueError(f"{', '.join(fixed)} cannot change while the cache runs (restart with the new "
                                 f"value); live settings: {', '.join(LIVE_SETTINGS)}")
            unknown = sorted(set(data) - set(cls.model_fields))
            if unknown:
                raise ValueError(f"unknown setting {', '.join(unknown)}; live settings: {', '.join(LIVE_SETTINGS)}")
        return data

    def check_disk_size(self, page_size_bytes: int) -> None:
        """Raises ValueError (naming disk_size) when the disk_size given holds no whole page."""
        least = min_disk_size_gb(page_size_bytes)
        if self.disk_size is not None and self.disk_size < least:
            raise ValueError(f"disk_size: {self.disk_size:g} GB holds no page of {page_size_bytes} bytes; give at "
                             f"least {least!r}, or null for unbounded")

    def changes(self) -> dict[str, Any]:
        """The settings given, nulls included where they mean something (disk_size: unbounded)."""
        out = {}
        for name in self.model_fields_set:
            value = getattr(self, name)
            if value is None and name != "disk_size":
                continue
            out[name] = value
        return out
