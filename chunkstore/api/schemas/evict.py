"""The cache-operations family: EvictRequest/EvictResult (POST /evict), FlushRequest/FlushResult,
ClearRequest/ClearResult.

Invariant: the spec states every rule a request is checked against, the rules between fields of
an EvictRequest too (``_EVICT_RULES``, the JSON Schema form of ``EvictRequest._check``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from chunkstore.api.schemas.common import (BackendName, KeyHex, NamespaceName, RequestBody, TierName, json_int,
                                           size_bytes)
from chunkstore.http.json_types import JsonBool, JsonFloat


def _given(name: str, json_type: str) -> dict[str, Any]:
    """JSON Schema: ``name`` is given, and not null."""
    return {"required": [name], "properties": {name: {"type": json_type}}}


_SELECTORS = (("bytes_to_free", "integer"), ("fraction", "number"), ("namespace", "string"), ("key", "string"),
              ("older_than_s", "number"))
_EVICT_RULES = [
    {"not": {"allOf": [_given("bytes_to_free", "integer"), _given("fraction", "number")]}},
    {"if": {"required": ["descendants"], "properties": {"descendants": {"const": True}}},
     "then": _given("key", "string")},
    {"if": _given("key", "string"),
     "then": {"properties": {name: {"type": "null"} for name in ("bytes_to_free", "fraction", "older_than_s")}}},
    {"anyOf": [_given(name, json_type) for name, json_type in _SELECTORS]},
]


def _evict_rules(schema: dict[str, Any], model: type) -> None:
    schema["allOf"] = _EVICT_RULES


class EvictRequest(RequestBody):
    """By ``key`` (with ``descendants``), or in the tier's eviction order by any of ``bytes_to_free`` /
    ``fraction`` (of the cached pages or stored bytes, of ``namespace`` when given), ``older_than_s``
    (last access) and ``namespace``; pinned chunks (disk) and locked pages (memory) never go."""

    model_config = ConfigDict(json_schema_extra=_evict_rules)

    tier: TierName = "disk"
    bytes_to_free: size_bytes(ge=1) | None = Field(None, description="not with fraction, nor with key")
    fraction: Annotated[JsonFloat, Field(gt=0, le=1)] | None = Field(None, description="not with bytes_to_free, "
                                                                                       "nor with key")
    namespace: NamespaceName | None = None
    key: KeyHex | None = None
    descendants: JsonBool = Field(False, description="with key: also every stored chunk that extends it")
    older_than_s: Annotated[JsonFloat, Field(ge=0, le=1e10)] | None = Field(
        None, description="chunks last accessed longer ago than this (not with key)")
    dry_run: JsonBool = Field(False, description="answer what would go, changing nothing")
    max_chunks: json_int(ge=1, le=100_000) = Field(10_000, description="disk: at most this many chunks per call")

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
    timeout_s: Annotated[JsonFloat, Field(gt=0, le=3600)] | None = Field(None, description="longest wait for the "
                                                                                          "transfers")


class FlushResult(BaseModel):
    backend: BackendName
    persisted_pages: int = Field(description="pages held in memory that are on disk after the flush")
    failed_pages: int = Field(description="pages the policy keeps that could not be written down")


class ClearRequest(RequestBody):
    tier: Literal["device", "host", "disk", "all"]
    confirm: Literal[True] = Field(description="must be true: clearing the disk tier deletes every chunk, "
                                               "pinned ones included")

    @field_validator("confirm", mode="before")
    @classmethod
    def _confirmed(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not True:
            tier = info.data.get("tier", "a tier")
            raise ValueError(f"clearing {tier} removes every page there: send confirm: true to go ahead")
        return value


class ClearResult(BaseModel):
    removed: dict[str, int] = Field(description="per tier: pages (device, host) or chunks (disk) removed")
    remaining: dict[str, int] = Field(description="per tier: what is still there (locked pages stay)")
