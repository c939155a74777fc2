"""The cache-operations family: EvictRequest/EvictResult (POST /evict), FlushRequest/FlushResult,
ClearRequest/ClearResult."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, model_validator

from chunkstore.api.schemas.common import BackendName, KeyHex, NamespaceName, RequestBody, TierName


class EvictRequest(RequestBody):
    """By ``key`` (with ``descendants``), or in the tier's eviction order by any of ``bytes_to_free`` /
    ``fraction`` (of the cached pages or stored bytes, of ``namespace`` when given), ``older_than_s``
    (last access) and ``namespace``; pinned chunks (disk) and locked pages (memory) never go."""

    tier: TierName = "disk"
    bytes_to_free: int | None = Field(None, ge=1, le=2**62)
    fraction: float | None = Field(None, gt=0, le=1)
    namespace: NamespaceName | None = None
    key: KeyHex | None = None
    descendants: bool = Field(False, description="with key: also every stored chunk that extends it")
    older_than_s: float | None = Field(None, ge=0, le=1e10, description="chunks last accessed longer ago than this")
    dry_run: bool = Field(False, description="answer what would go, changing nothing")
    max_chunks: int = Field(10_000, ge=1, le=100_000, description="disk: at most this many chunks per call")

    @model_validator(mode="after")
    def _check(self) -> "EvictRequest":
        if self.bytes_to_free is not None and self.fraction is not None:
            raise ValueError("give bytes_to_free or fraction, not both")
        if self.descendants and self.key is None:
            raise ValueError("descendants needs a key")
        if self.key is not None:
            if self.bytes_to_free is not None or self.fraction is not None or self.older_than_s is not None:
                raise ValueError("key selects the chunks itself: leave out bytes_to_free, fraction and older_than_s")
        elif all(getattr(self, n) is None for n in ("bytes_to_free", "fraction", "namespace", "older_than_s")):
            raise ValueError("say what to evict: bytes_to_free, fraction, namespace, key or older_than_s")
        return self


class EvictResult(BaseModel):
    tier: TierName
    dry_run: bool
    num_chunks: int | None = Field(description="disk: chunks evicted (or that would be)")
    num_pages: int | None = Field(description="memory: pages evicted (a dry run: at most this many can go now)")
    num_bytes: int = Field(description="disk: stored bytes; memory: page bytes")
    keys: list[str] = Field(description="disk: the evicted keys, the first 1,000")
    is_keys_truncated: bool
    skipped_pinned: int = Field(description="disk by key: pinned chunks (and their ancestors) kept")
    skipped_locked: int | None = Field(None, description="memory: pages kept because requests or transfers "
                                                         "lock them (selected ones; by bytes or fraction alone, "
                                                         "the tier's locked pages)")
    is_complete: bool = Field(description="False when max_chunks cut the eviction short: call again")


class FlushRequest(RequestBody):
    timeout_s: float | None = Field(None, gt=0, le=3600, description="longest wait for the transfers")


class FlushResult(BaseModel):
    backend: BackendName
    persisted_pages: int = Field(description="pages held in memory that are on disk after the flush")
    failed_pages: int = Field(description="pages the policy keeps that could not be written down")


class ClearRequest(RequestBody):
    tier: Literal["device", "host", "disk", "all"]
    confirm: bool = Field(False, description="must be true: clearing the disk tier deletes every chunk, "
                                             "pinned ones included")

    @model_validator(mode="after")
    def _confirmed(self) -> "ClearRequest":
        if not self.confirm:
            raise ValueError(f"clearing {self.tier} removes every page there: send confirm: true to go ahead")
        return self


class ClearResult(BaseModel):
    removed: dict[str, int] = Field(description="per tier: pages (device, host) or chunks (disk) removed")
    remaining: dict[str, int] = Field(description="per tier: what is still there (locked pages stay)")
