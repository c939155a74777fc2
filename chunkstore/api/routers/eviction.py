"""POST /evict (any tier, by bytes, fraction, namespace, key or age; dry runs), POST /flush, POST /clear.

Invariants: a namespace token evicts only from its namespace on the disk tier (memory tiers are
shared by every tenant); flush and clear need the admin token; every call that changes something
is logged with its parameters (api.deps.audit).
"""

from __future__ import annotations

import math
import time
from typing import Annotated

from fastapi import APIRouter, Body, Depends, Request

from chunkstore.cache.admin import DescendantsResidentError, KeyNotResidentError, MemorySelection
from chunkstore.disk.eviction import ChunkNotStoredError, EvictionSelection, StrandedDescendantsError

from chunkstore.api.backend.base import AdminBackend, NoDiskTierError
from chunkstore.api.deps import AdminDep, BackendDep, WriterDep, audit, check_namespace, require_reader, scoped_namespace
from chunkstore.api.errors import ERROR_RESPONSES, AdminError
from chunkstore.api.schemas.evict import ClearRequest, ClearResult, EvictRequest, EvictResult, FlushRequest, FlushResult

router = APIRouter(tags=["eviction"], dependencies=[Depends(require_reader)], responses=ERROR_RESPONSES)

_MAX_KEYS_LISTED = 1000


def _evict_memory(body: EvictRequest, backend: AdminBackend) -> EvictResult:
    page_bytes = backend.identity.page_size_bytes
    if body.key is not None or body.namespace is not None or body.older_than_s is not None:
        return _evict_memory_selected(body, backend)
    cached = backend.cached_pages(body.tier)
    locked = cached - backend.evictable_pages(body.tier)
    if body.bytes_to_free is not None:
        pages = math.ceil(body.bytes_to_free / page_bytes)
    else:
        pages = math.ceil(body.fraction * cached)
    if body.dry_run:
        n = min(pages, backend.evictable_pages(body.tier))
    else:
        n = backend.evict_memory(body.tier, pages)
    return EvictResult(tier=body.tier, dry_run=body.dry_run, num_chunks=None, num_pages=n, num_bytes=n * page_bytes,
                       keys=[], is_keys_truncated=False, skipped_pinned=0,
                       skipped_locked=locked, is_complete=n >= pages)


def _evict_memory_selected(body: EvictRequest, backend: AdminBackend) -> EvictResult:
    """By key (and descendants), namespace or age: ``TieredCache.evict_selected``."""
    page_bytes = backend.identity.page_size_bytes
    num_pages = None
    if body.bytes_to_free is not None:
        num_pages = math.ceil(body.bytes_to_free / page_bytes)
    elif body.fraction is not None:
        if body.namespace is not None:
            device, host = backend.residency_by_namespace().get(body.namespace, (0, 0))
            cached = device if body.tier == "device" else host
        else:
            cached = backend.cached_pages(body.tier)
        num_pages = math.ceil(body.fraction * cached)
    try:
        selection = MemorySelection(key=bytes.fromhex(body.key) if body.key is not None else None,
                                    descendants=body.descendants, namespace=body.namespace,
                                    older_than_s=body.older_than_s, num_pages=num_pages)
        done = backend.evict_memory_selected(body.tier, selection, body.dry_run)
    except KeyNotResidentError as exc:
        raise AdminError.not_found(str(exc), "key") from None
    except DescendantsResidentError as exc:
        raise AdminError.conflict(str(exc)) from None
    keys = [k.hex() for k in done.keys[:_MAX_KEYS_LISTED]]
    return EvictResult(tier=body.tier, dry_run=body.dry_run, num_chunks=None, num_pages=done.num_pages,
                       num_bytes=done.num_pages * page_bytes, keys=keys, is_keys_truncated=len(done.keys) > len(keys),
                       skipped_pinned=0, skipped_locked=done.locked_pages,
                       is_complete=done.kept_pages == 0 or (num_pages is not None and done.num_pages >= num_pages))


def _evict_disk(body: EvictRequest, namespace: str | None, caller, backend: AdminBackend) -> EvictResult:
    """The store's own planner: a dry run answers its plan, an eviction carries the plan out
    (``ChunkStore.evict``: made again under the writer lock if the store changed meanwhile)."""
    key = bytes.fromhex(body.key) if body.key is not None else None
    with backend.using_store(write=not body.dry_run) as store:
        if key is not None:
            row = store.chunk_rows([key]).get(key)
            if row is None:
                raise AdminError.not_found(f"no chunk {body.key} on disk", "key")
            check_namespace(caller, row.namespace)
            if namespace is not None and row.namespace != namespace:
                raise AdminError.not_found(f"no chunk {body.key} in namespace {namespace!r}", "key")
        bytes_to_free = body.bytes_to_free
        if body.fraction is not None:
            bytes_to_free = max(1, math.ceil(body.fraction * store.stored_bytes(namespace)))
        accessed_before = time.time() - body.older_than_s if body.older_than_s is not None else None
        selection = EvictionSelection(namespace=namespace, bytes_to_free=bytes_to_free, accessed_before=accessed_before,
                                      key=key, descendants=body.descendants, max_chunks=body.max_chunks)
        try:
            plan = store.plan_eviction(selection)
            if not body.dry_run:
                plan = store.evict(plan)
        except ChunkNotStoredError as exc:  # evicted since the row was read
            raise AdminError.not_found(str(exc), "key") from None
        except StrandedDescendantsError as exc:
            raise AdminError.conflict(str(exc)) from None
    keys = [v.key.hex() for v in plan.victims[:_MAX_KEYS_LISTED]]
    return EvictResult(tier="disk", dry_run=body.dry_run, num_chunks=len(plan.victims), num_pages=None,
                       num_bytes=plan.stored_bytes, keys=keys, is_keys_truncated=len(plan.victims) > len(keys),
                       skipped_pinned=plan.skipped_pinned, is_complete=plan.is_complete)


@router.post("/evict", response_model=EvictResult)
def evict(body: EvictRequest, request: Request, caller: WriterDep, backend: BackendDep) -> EvictResult:
    """Evict now, or with ``dry_run`` say exactly what would go (disk) or how much can (memory)."""
    if caller.is_namespace_scoped and body.tier != "disk":
        raise AdminError.forbidden("a namespace token evicts from the disk tier only: memory tiers are shared")
    namespace = scoped_namespace(caller, body.namespace)
    if body.tier == "disk":
        result = _evict_disk(body, namespace, caller, backend)
    else:
        result = _evict_memory(body, backend)
    if not body.dry_run:
        audit(request, caller, {**body.model_dump(exclude_defaults=True), "evicted": result.num_chunks
                                if result.num_chunks is not None else result.num_pages})
    return result


@router.post("/flush", response_model=FlushResult)
def flush(request: Request, caller: AdminDep, backend: BackendDep,
          body: Annotated[FlushRequest | None, Body()] = None) -> FlushResult:
    """Write every page the memory tiers hold down to disk and wait (before a planned restart)."""
    timeout_s = body.timeout_s if body is not None else None
    audit(request, caller, {"timeout_s": timeout_s}, is_destructive=False)
    outcome = backend.flush(timeout_s)
    return FlushResult(backend=backend.kind.value, persisted_pages=outcome.persisted_pages,
                       failed_pages=outcome.failed_pages)


_CLEAR_PASSES = 3  # a live cache keeps writing: a few passes, then report what is left


def _clear_disk(backend: AdminBackend) -> tuple[int, int]:
    removed = 0
    with backend.using_store(write=True) as store:
        for _ in range(_CLEAR_PASSES):
            names = [u.namespace for u in store.namespace_usage() if u.num_chunks > 0]
            if not names:
                break
            for ns in names:
                removed += store.delete_namespace(ns).num_chunks
        return removed, store.num_chunks()


@router.post("/clear", response_model=ClearResult)
def clear(body: ClearRequest, request: Request, caller: AdminDep, backend: BackendDep) -> ClearResult:
    """Empty one tier or all (memory first, so that pages written down on their way out go too).
    Pages locked by requests in progress stay. Admin token only; needs confirm: true."""
    audit(request, caller, body.model_dump())
    tiers = [body.tier] if body.tier != "all" else [*backend.memory_tiers, "disk"]
    removed: dict[str, int] = {}
    remaining: dict[str, int] = {}
    for tier in tiers:
        if tier == "disk":
            try:
                removed[tier], remaining[tier] = _clear_disk(backend)
            except NoDiskTierError:
                if body.tier != "all":
                    raise
        else:
            removed[tier] = backend.clear_memory(tier)
            remaining[tier] = backend.cached_pages(tier)
    return ClearResult(removed=removed, remaining=remaining)
