"""GET /chunks (paged, filtered, sorted), GET /chunks/{key}, POST /chunks/{key}/pin and /unpin.

Chunks are the disk tier's (rows of the index), or with ``tier=device|host`` the pages that memory
tier holds (its index row where stored, else what the tree knows); ``tiers`` says every tier
holding each. Paging is by cursor (the sort value and key of the last row): on disk every page
costs the same; a memory listing is built from the tier's pages (bounded by the pool) each time.
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from chunkstore.disk import ChunkOrder, ChunkQuery, ChunkRow

from chunkstore.api.backend.base import AdminBackend, NoDiskTierError
from chunkstore.api.deps import BackendDep, ReaderDep, WriterDep, audit, check_namespace, require_reader, scoped_namespace
from chunkstore.api.errors import ERROR_RESPONSES, AdminError
from chunkstore.api.security import Role
from chunkstore.api.schemas.chunks import ChunkDetail, ChunkFilePublic, ChunkPublic, ChunksPage
from chunkstore.api.schemas.common import KEY_PATTERN, MAX_BYTES, NAMESPACE_PATTERN, TierName

router = APIRouter(prefix="/chunks", tags=["chunks"], dependencies=[Depends(require_reader)],
                   responses=ERROR_RESPONSES)

KeyPath = Annotated[str, Path(pattern=KEY_PATTERN, description="64 lower-case hex digits")]


class ChunkFilter(BaseModel):
    """Query parameters of GET /chunks."""

    model_config = ConfigDict(extra="forbid")

    namespace: str | None = Field(None, pattern=NAMESPACE_PATTERN, max_length=256)
    tier: TierName | None = Field(None, description="disk (the default): chunks on disk; device or host: the "
                                                     "pages that tier holds, on disk or not")
    pinned: bool | None = None
    min_size: int | None = Field(None, ge=0, le=MAX_BYTES, description="stored bytes, at least")
    max_size: int | None = Field(None, ge=0, le=MAX_BYTES, description="stored bytes, at most")
    accessed_before: float | None = Field(None, allow_inf_nan=False, description="last access before (epoch s)")
    accessed_after: float | None = Field(None, allow_inf_nan=False, description="last access at or after (epoch s)")
    sort: ChunkOrder = ChunkOrder.LAST_ACCESS
    order: Literal["desc", "asc"] = "desc"
    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, max_length=512, description="next_cursor of the previous page")


def _memory_keys(backend: AdminBackend, namespace: str | None) -> dict[str, set[bytes]]:
    return {tier: backend.resident_keys(tier, namespace) for tier in backend.memory_tiers}


def _sort_value(sort: ChunkOrder, row: ChunkRow | None) -> float:
    """The row's value for ``sort``; 0 for a page held only in memory (it sorts as the least)."""
    if row is None:
        return 0
    return {ChunkOrder.LAST_ACCESS: row.last_access_at, ChunkOrder.HITS: row.hit_count,
            ChunkOrder.SIZE: row.stored_bytes, ChunkOrder.CREATED: row.created_at}[sort]


def _encode_cursor(f: ChunkFilter, value: float, key: bytes) -> str:
    raw = json.dumps([f.sort.value, f.order, value, key.hex()]).encode()
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
    """Chunks on disk (or, ``tier`` device or host, pages in memory) matching every filter given,
    sorted, a page at a time."""
    namespace = scoped_namespace(caller, f.namespace)
    after = _decode_cursor(f)
    memory = _memory_keys(backend, namespace)
    if f.tier in ("device", "host"):
        return _list_memory(f, namespace, after, memory, backend)
    query = ChunkQuery(namespace=namespace, pinned=f.pinned, min_stored_bytes=f.min_size,
                       max_stored_bytes=f.max_size, accessed_before=f.accessed_before,
                       accessed_after=f.accessed_after)
    with backend.using_store() as store:
        rows = store.list_chunks(query, order=f.sort, descending=f.order == "desc", limit=f.limit + 1, after=after)
        total = store.count_chunks(query)
    more = len(rows) > f.limit
    rows = rows[:f.limit]
    return ChunksPage(items=[ChunkPublic.of(r, memory) for r in rows], total=total, sort=f.sort, order=f.order,
                      next_cursor=_encode_cursor(f, _sort_value(f.sort, rows[-1]), rows[-1].key) if more else None)


def _matches(row: ChunkRow, f: ChunkFilter) -> bool:
    return ((f.pinned is None or bool(row.pinned) == f.pinned)
            and (f.min_size is None or row.stored_bytes >= f.min_size)
            and (f.max_size is None or row.stored_bytes <= f.max_size)
            and (f.accessed_before is None or row.last_access_at < f.accessed_before)
            and (f.accessed_after is None or row.last_access_at >= f.accessed_after))


def _list_memory(f: ChunkFilter, namespace: str | None, after: tuple[float, bytes] | None,
                 memory: dict[str, set[bytes]], backend: AdminBackend) -> ChunksPage:
    """The pages ``f.tier`` holds, with their index rows where stored. A page held only in memory
    has no disk figures: the size, access and ``pinned: true`` filters leave it out."""
    pages = backend.resident_pages(f.tier, namespace)
    try:
        with backend.using_store() as store:
            rows = store.chunk_rows([p.key for p in pages])
    except NoDiskTierError:
        rows = {}
    needs_row = f.pinned or any(v is not None for v in (f.min_size, f.max_size, f.accessed_before, f.accessed_after))
    page_bytes = backend.identity.page_size_bytes
    found: list[tuple[float, bytes, ChunkPublic]] = []
    for page in pages:
        row = rows.get(page.key)
        if row is None and not needs_row:
            found.append((0, page.key, ChunkPublic.of_memory(page, page_bytes, memory)))
        elif row is not None and _matches(row, f):
            found.append((_sort_value(f.sort, row), page.key, ChunkPublic.of(row, memory)))
    descending = f.order == "desc"
    found.sort(key=lambda x: (x[0], x[1]), reverse=descending)
    total = len(found)
    if after is not None:
        found = [x for x in found if ((x[0], x[1]) < after if descending else (x[0], x[1]) > after)]
    more = len(found) > f.limit
    found = found[:f.limit]
    return ChunksPage(items=[item for _, _, item in found], total=total, sort=f.sort, order=f.order,
                      next_cursor=_encode_cursor(f, found[-1][0], found[-1][1]) if more else None)


def _row(store, key: bytes) -> ChunkRow:
    row = store.chunk_rows([key]).get(key)
    if row is None:
        raise AdminError.not_found(f"no chunk {key.hex()} on disk", "key")
    return row


@router.get("/{key}", response_model=ChunkDetail)
def get_chunk(key: KeyPath, caller: ReaderDep, backend: BackendDep) -> ChunkDetail:
    """The chunk's index row, its file's header fields (the file is read and fully verified, not
    changed: a bad file is reported, not quarantined), token ids and their text (to the admin token
    and the namespace's own token only)."""
    k = bytes.fromhex(key)
    with backend.using_store() as store:
        row = _row(store, k)
        check_namespace(caller, row.namespace)
        check = store.verify_file(k, row=row)  # the row's namespace is the caller's: its keys must open it
        num_children = len(store.child_keys(k))
        is_parent_stored = store.exists([row.parent_key])[0]
    # A chunk's tokens are its tenant's prompt: only the admin token or the namespace's own shows them.
    is_content_hidden = caller.role is Role.ANONYMOUS
    token_ids = list(check.header.token_ids) if check.header is not None and not is_content_hidden else None
    text = None
    if token_ids is not None and backend.decode is not None:
        try:
            text = backend.decode(token_ids)
        except Exception:  # a tokenizer that cannot decode these ids: show the ids only
            text = None
    base = ChunkPublic.of(row, _memory_keys(backend, row.namespace))
    return ChunkDetail(**base.model_dump(), file=ChunkFilePublic.of(check.text, check.size_bytes, check.header),
                       token_ids=token_ids, text=text, is_content_hidden=is_content_hidden,
                       num_children=num_children, is_parent_stored=is_parent_stored)


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
