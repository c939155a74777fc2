"""The chunk family: ChunkPublic (a row of the index), ChunksPage (GET /chunks), ChunkDetail
(GET /chunks/{key}: the file's header fields, its token ids and their text)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from chunkstore.cache.admin import ResidentPage
from chunkstore.disk import ChunkHeader, ChunkOrder, ChunkRow


class ChunkPublic(BaseModel):
    key: str
    parent_key: str
    namespace: str
    num_tokens: int
    raw_bytes: int
    stored_bytes: int | None = Field(description="on disk; None for a page held only in memory")
    created_at: float | None = Field(description="when stored on disk; None for a page held only in memory")
    last_access_at: float | None = Field(description="last disk access; None for a page held only in memory")
    hit_count: int = Field(description="loads from disk (0 for a page held only in memory)")
    pinned: bool
    tiers: list[str] = Field(description="the tiers holding it: device/host for a live cache, and disk")

    @classmethod
    def of(cls, row: ChunkRow, memory: dict[str, set[bytes]]) -> "ChunkPublic":
        tiers = [t for t, keys in memory.items() if row.key in keys] + ["disk"]
        return cls(key=row.key.hex(), parent_key=row.parent_key.hex(), namespace=row.namespace,
                   num_tokens=row.num_tokens, raw_bytes=row.raw_bytes, stored_bytes=row.stored_bytes,
                   created_at=row.created_at, last_access_at=row.last_access_at, hit_count=row.hit_count,
                   pinned=bool(row.pinned), tiers=tiers)

    @classmethod
    def of_memory(cls, page: ResidentPage, page_bytes: int, memory: dict[str, set[bytes]]) -> "ChunkPublic":
        """A page held in memory and not on disk."""
        return cls(key=page.key.hex(), parent_key=page.parent_key.hex(), namespace=page.namespace,
                   num_tokens=page.num_tokens, raw_bytes=page_bytes, stored_bytes=None, created_at=None,
                   last_access_at=None, hit_count=0, pinned=False,
                   tiers=[t for t, keys in memory.items() if page.key in keys])


class ChunksPage(BaseModel):
    items: list[ChunkPublic]
    total: int = Field(description="chunks matching the filters, on every page")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; None on the last")
    sort: ChunkOrder
    order: str


class PlanePublic(BaseModel):
    codec: int
    stored_size_bytes: int


class ChunkFilePublic(BaseModel):
    status: str = Field(description="ok, missing, or why the file fails verification")
    file_bytes: int
    dtype: str | None = None
    shape: list[int] | None = None
    codec: str | None = None
    raw_size_bytes: int | None = None
    payload_bytes: int | None = None
    checksum: str | None = Field(None, description="xxh3-128 of the raw bytes, hex")
    planes: list[PlanePublic] | None = None

    @classmethod
    def of(cls, status: str, size: int, header: ChunkHeader | None) -> "ChunkFilePublic":
        if header is None:
            return cls(status=status, file_bytes=size)
        return cls(status=status, file_bytes=size, dtype=header.dtype, shape=list(header.shape),
                   codec=header.codec.value, raw_size_bytes=header.raw_size_bytes,
                   payload_bytes=header.stored_size_bytes, checksum=header.checksum.hex(),
                   planes=[PlanePublic(codec=int(p.codec), stored_size_bytes=p.stored_size_bytes)
                           for p in header.planes])


class ChunkDetail(ChunkPublic):
    file: ChunkFilePublic
    token_ids: list[int] | None = Field(description="from the file's header; None when the file is unreadable "
                                                    "or the caller sent no token")
    text: str | None = Field(description="the tokens decoded, where the backend knows the tokenizer (None "
                                         "when token_ids is)")
    is_content_hidden: bool = Field(description="true when the caller sent no token: a chunk's tokens are its "
                                                "tenant's prompt, shown to the admin and namespace tokens only")
    num_children: int = Field(description="stored chunks that extend this one by a page")
    is_parent_stored: bool
