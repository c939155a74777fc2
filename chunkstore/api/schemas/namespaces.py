"""The namespace family: NamespacePublic (usage, quota, hit rate), NamespaceList, QuotaUpdate,
NamespaceDeleted."""

from __future__ import annotations

from pydantic import BaseModel, Field

from chunkstore.api.schemas.common import RequestBody, size_bytes
from chunkstore.cache.stats import NamespaceLookups
from chunkstore.disk.store import NamespaceStats


class NamespacePublic(BaseModel):
    namespace: str
    num_chunks: int
    raw_bytes: int
    stored_bytes: int
    quota_bytes: int | None
    hits: int = Field(description="chunks loaded from disk")
    misses: int = Field(description="chunks asked of the disk tier and not found")
    hit_rate: float = Field(description="hits / (hits + misses) on the disk tier")
    dedup_hits: int
    evictions: int
    quarantined: int
    auth_failures: int = Field(0, description="a sealed store's chunks of this namespace that failed authentication "
                                             "(forged, damaged or moved): security events, never served")
    device_pages: int | None = Field(None, description="pages held on the device (a live cache)")
    host_pages: int | None = Field(None, description="pages held in host memory (a live cache)")
    lookups: int | None = Field(None, description="the cache's prefix lookups since it started (a live cache)")
    lookup_tokens: int | None = Field(None, description="tokens looked up (a live cache)")
    hit_tokens: int | None = Field(None, description="cached tokens used, from any tier (a live cache)")
    token_hit_rate: float | None = Field(None, description="hit_tokens / lookup_tokens (a live cache)")

    @classmethod
    def of(cls, namespace: str, disk: NamespaceStats | None, memory: tuple[int, int] | None,
           lookups: NamespaceLookups | None = None) -> "NamespacePublic":
        hits, misses = (disk.hits, disk.misses) if disk else (0, 0)
        return cls(namespace=namespace, num_chunks=disk.num_chunks if disk else 0,
                   raw_bytes=disk.raw_bytes if disk else 0, stored_bytes=disk.stored_bytes if disk else 0,
                   quota_bytes=disk.quota_bytes if disk else None, hits=hits, misses=misses,
                   hit_rate=hits / (hits + misses) if hits + misses else 0.0,
                   dedup_hits=disk.dedup_hits if disk else 0, evictions=disk.evictions if disk else 0,
                   quarantined=disk.quarantined if disk else 0, auth_failures=disk.auth_failures if disk else 0,
                   device_pages=memory[0] if memory else None, host_pages=memory[1] if memory else None,
                   lookups=lookups.lookups if lookups else None,
                   lookup_tokens=lookups.lookup_tokens if lookups else None,
                   hit_tokens=lookups.hit_tokens if lookups else None,
                   token_hit_rate=lookups.hit_rate if lookups else None)


class NamespaceList(BaseModel):
    items: list[NamespacePublic]


class QuotaUpdate(RequestBody):
    quota_bytes: size_bytes(ge=0) | None = Field(description="stored bytes the namespace may use; null removes "
                                                                "the quota. Applies at its next put, which evicts "
                                                                "within the namespace to fit")


class NamespaceDeleted(BaseModel):
    namespace: str
    memory_pages: int = Field(description="pages removed from the device and host tiers (a live cache)")
    memory_pages_left: int = Field(description="pages left in memory: requests in progress lock them; once released "
                                               "they may be written down again, so repeat the call when the "
                                               "namespace's requests have ended")
    num_chunks: int = Field(description="chunks deleted from the disk tier, pinned ones included")
    stored_bytes: int = Field(description="their stored bytes")
    key_destroyed: bool | None = Field(description="with shred: whether the namespace's key was destroyed (false: it "
                                                   "had none); null without shred")
