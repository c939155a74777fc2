"""GET /chunks (paged, filtered, sorted), GET /chunks/{key}, POST /chunks/{key}/pin and /unpin.

Chunks are the disk tier's (rows of the index); ``tiers`` adds the memory tiers that also hold
them. Paging is by cursor (the sort value and key of the last row), so every page costs the same.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from chunkstore.index import ChunkOrder, ChunkQuery, ChunkRow

from api.backend.base import AdminBackend
from api.deps import BackendDep, ReaderDep, WriterDep, audit, check_namespace, require_reader, scoped_namespace
from api.errors import ERROR_RESPONSES, AdminError
from api.schemas.chunks import ChunkDetail, ChunkFilePublic, ChunkPublic, ChunksPage
from api.schemas.common import KEY_PATTERN, NAMESPACE_PATTERN, TierName

router = APIRouter(prefix="/chunks", tags=["chunks"], dependencies=[Depends(require_reader)],
                   responses=ERROR_RESPONSES)

KeyPath = Annotated[str, Path(pattern=KEY_PATTERN, description="64 lower-case hex digits")]


class ChunkFilter(BaseModel):
    """Query parameters of GET /chunks."""

    model_config = ConfigDict(extra="forbid")

    namespace: str | None = Field(None, pattern=NAMESPACE_PATTERN, max_length=256)
    tier: TierName | None = Field(None, description="device or host: only chunks that tier also holds")
    pinned: bool | None = None
    min_size: int | None = Field(None, ge=0, le=2**62, description="stored bytes, at least")
    max_size: int | None = Field(None, ge=0, le=2**62, description="stored bytes, at most")
    accessed_before: float | None = Field(None, allow_inf_nan=False, description="last access before (epoch s)")
    accessed_after: float | None = Field(None, allow_inf_nan=False, description="last access at or after (epoch s)")
    sort: ChunkOrder = ChunkOrder.LAST_ACCESS
    order: Literal["desc", "asc"] = "desc"
    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, max_length=512, description="next_cursor of the previous page")


def _memory_keys(backend: AdminBackend, namespace: str | None) -> dict[str, set[bytes]]:
    return {tier: backend.resident_keys(tier, namespace) for tier in backend.memory_tiers}


def _encode_cursor(f: ChunkFilter, row: ChunkRow) -> str:
    value = {ChunkOrder.LAST_ACCESS: row.last_access_at, ChunkOrder.HITS: row.hit_count,
             ChunkOrder.SIZE: row.stored_bytes, ChunkOrder.CREATED: row.created_at}[f.sort]
    raw = json.dumps([f.sort.value, f.order, value, row.key.hex()]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(f: ChunkFilter) -> tuple[float, bytes] | None:
    if f.cursor is None:
        return None
    try:
        raw = base64.urlsafe_b64decode(f.cursor + "=" * (-len(f.cursor) % 4))
        sort, order, value, key = json.loads(raw)
        if [sort, order] != [f.sort.value, f.order] or not isinstance(value, (int, float)):
            raise ValueError
        return value, bytes.fromhex(key)
    except (ValueError, TypeError, binascii.Error, json.JSONDecodeError):
        raise AdminError.invalid("cursor: not a next_cursor of this listing (same sort and order)", "cursor") from None


@router.get("", response_model=ChunksPage)
def list_chunks(f: Annotated[ChunkFilter, Query()], caller: ReaderDep, backend: BackendDep) -> ChunksPage:
    """Chunks on disk matching every filter given, sorted, a page at a time."""
    namespace = scoped_namespace(caller, f.namespace)
    after = _decode_cursor(f)
    memory = _memory_keys(backend, namespace)
    keys = None
    if f.tier in ("device", "host"):
        keys = frozenset(backend.resident_keys(f.tier, namespace))
    query = ChunkQuery(namespace=namespace, pinned=f.pinned, min_stored_bytes=f.min_size,
                       max_stored_bytes=f.max_size, accessed_before=f.accessed_before,
                       accessed_after=f.accessed_after, keys=keys)
    with backend.using_store() as store:
        rows = store.index.list_chunks(query, order=f.sort, descending=f.order == "desc", limit=f.limit + 1,
                                       after=after)
        total = store.index.count_chunks(query)
    more = len(rows) > f.limit
    rows = rows[:f.limit]
    return ChunksPage(items=[ChunkPublic.of(r, memory) for r in rows], total=total, sort=f.sort, order=f.order,
                      next_cursor=_encode_cursor(f, rows[-1]) if more else None)


def _row(store, key: bytes) -> ChunkRow:
    row = store.index.rows([key]).get(key)
    if row is None:
        raise AdminError.not_found(f"no chunk {key.hex()} on disk", "key")
    return row


@router.get("/{key}", response_model=ChunkDetail)
def get_chunk(key: KeyPath, caller: ReaderDep, backend: BackendDep) -> ChunkDetail:
    """The chunk's index row, its file's header fields (the file is read and fully verified, not
    changed: a bad file is reported, not quarantined), token ids and their text."""
    k = bytes.fromhex(key)
    with backend.using_store() as store:
        row = _row(store, k)
        check_namespace(caller, row.namespace)
        check = store.verify_file(k)
        num_children = len(store.index.child_keys(k))
        is_parent_stored = bool(store.index.present([row.parent_key]))
    token_ids = list(check.header.token_ids) if check.header is not None else None
    text = None
    if token_ids is not None and backend.decode is not None:
        try:
            text = backend.decode(token_ids)
        except Exception:  # a tokenizer that cannot decode these ids: show the ids only
            text = None
    base = ChunkPublic.of(row, _memory_keys(backend, row.namespace))
    return ChunkDetail(**base.model_dump(), file=ChunkFilePublic.of(check.status, check.size_bytes, check.header),
                       token_ids=token_ids, text=text, num_children=num_children, is_parent_stored=is_parent_stored)


def _set_pinned(request: Request, key: str, caller, backend: AdminBackend, pinned: bool) -> ChunkPublic:
    k = bytes.fromhex(key)
    with backend.using_store(write=True) as store:
        check_namespace(caller, _row(store, k).namespace)
        (store.pin if pinned else store.unpin)([k])
        row = _row(store, k)
    audit(request, caller, {"key": key}, is_destructive=False)
    return ChunkPublic.of(row, _memory_keys(backend, row.namespace))


@router.post("/{key}/pin", response_model=ChunkPublic)
def pin_chunk(key: KeyPath, request: Request, caller: WriterDep, backend: BackendDep) -> ChunkPublic:
    """Keep the chunk on disk: eviction never takes a pinned chunk (nor, by key, its ancestors)."""
    return _set_pinned(request, key, caller, backend, True)


@router.post("/{key}/unpin", response_model=ChunkPublic)
def unpin_chunk(key: KeyPath, request: Request, caller: WriterDep, backend: BackendDep) -> ChunkPublic:
    return _set_pinned(request, key, caller, backend, False)
