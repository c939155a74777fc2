"""GET /namespaces (usage, quota, hit rate), PUT /namespaces/{namespace}/quota and DELETE
/namespaces/{namespace} (every page of it, from memory then disk; with ``shred``, a sealed
store's namespace key first: crypto-shredding)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request

from chunkstore.cache.admin import MemorySelection
from chunkstore.cache.stats import NamespaceLookups

from chunkstore.api.backend.base import AdminBackend, NoDiskTierError
from chunkstore.api.deps import AdminDep, BackendDep, ReaderDep, audit, require_reader
from chunkstore.api.errors import ERROR_RESPONSES, AdminError
from chunkstore.api.schemas.common import NAMESPACE_PATTERN
from chunkstore.api.schemas.namespaces import NamespaceDeleted, NamespaceList, NamespacePublic, QuotaUpdate

router = APIRouter(prefix="/namespaces", tags=["namespaces"], dependencies=[Depends(require_reader)],
                   responses=ERROR_RESPONSES)


def _namespaces(backend: AdminBackend, only: str | None = None) -> list[NamespacePublic]:
    try:
        with backend.using_store() as store:
            disk = {n.namespace: n for n in store.stats().namespaces}
    except NoDiskTierError:
        disk = {}
    memory = backend.residency_by_namespace()
    lookups = backend.lookups_by_namespace()
    names = {only} if only is not None else set(disk) | set(memory) | set(lookups)
    is_live = bool(backend.memory_tiers)
    return [NamespacePublic.of(ns, disk.get(ns), memory.get(ns, (0, 0)) if is_live else None,
                               lookups.get(ns, NamespaceLookups()) if is_live else None)
            for ns in sorted(names)]


@router.get("", response_model=NamespaceList)
def list_namespaces(caller: ReaderDep, backend: BackendDep) -> NamespaceList:
    """Every namespace with chunks, a quota, pages in memory or lookups (a namespace token: its own only)."""
    return NamespaceList(items=_namespaces(backend, caller.namespace))


@router.put("/{namespace}/quota", response_model=NamespacePublic)  # one path segment: a namespace holds no "/"
def set_quota(namespace: Annotated[str, Path(pattern=NAMESPACE_PATTERN, max_length=256)], body: QuotaUpdate,
              request: Request, caller: AdminDep, backend: BackendDep) -> NamespacePublic:
    """Bound (or, with null, unbound) the stored bytes of a namespace. Admin token only."""
    with backend.using_store(write=True) as store:
        store.set_quota(namespace, body.quota_bytes)
    audit(request, caller, {"namespace": namespace, "quota_bytes": body.quota_bytes}, is_destructive=False)
    return _namespaces(backend, namespace)[0]


def _drop_from_memory(backend: AdminBackend, namespace: str) -> tuple[int, int]:
    """Evict ``namespace``'s pages from the memory tiers: (pages evicted, pages left: locked by
    requests in progress, or kept by the write policy)."""
    removed = left = 0
    for tier in backend.memory_tiers:
        done = backend.evict_memory_selected(tier, MemorySelection(namespace=namespace), dry_run=False)
        removed += done.num_pages
        left += done.locked_pages + done.kept_pages
    return removed, left


def _check_shreddable(backend: AdminBackend) -> None:
    """Raises AdminError unless the backend has a sealed disk tier (a shred destroys a key)."""
    try:
        with backend.using_store() as store:
            if not store.is_sealed:
                raise AdminError.invalid("shred needs a sealed store (chunkstore serve --seal-key); without "
                                         "it, delete the namespace without shred", "shred")
    except NoDiskTierError:
        raise AdminError.invalid("shred needs a sealed disk tier; this cache has no disk tier", "shred") from None


@router.delete("/{namespace}", response_model=NamespaceDeleted)
def delete_namespace(namespace: Annotated[str, Path(pattern=NAMESPACE_PATTERN, max_length=256)], request: Request,
                     caller: AdminDep, backend: BackendDep,
                     shred: Annotated[bool, Query(description="a sealed store only: destroy the namespace's key "
                                                              "first, so that no server, local copy or old copy of "
                                                              "the bucket can read any of its chunks again")] = False,
                     ) -> NamespaceDeleted:
    """Delete every page of a namespace: from the memory tiers first, then its chunks on disk
    (pinned ones included; with ``shred``, its key before them), then from the memory tiers again.
    Pages that requests in progress lock stay in memory (``memory_pages_left``): once released
    they may be written down again. Admin token only."""
    audit(request, caller, {"namespace": namespace, "shred": shred})
    if shred:
        _check_shreddable(backend)  # before anything is dropped: a refused request changes nothing
    removed, _ = _drop_from_memory(backend, namespace)
    num_chunks = stored_bytes = 0
    key_destroyed = None
    try:
        with backend.using_store(write=True) as store:
            if shred:
                if not store.is_sealed:
                    raise AdminError.invalid("shred needs a sealed store (chunkstore serve --seal-key); without "
                                             "it, delete the namespace without shred", "shred")
                shredded = store.shred_namespace(namespace)
                num_chunks, stored_bytes, key_destroyed = shredded.num_chunks, shredded.stored_bytes, \
                    shredded.key_destroyed
            else:
                deleted = store.delete_namespace(namespace)
                num_chunks, stored_bytes = deleted.num_chunks, deleted.stored_bytes
    except NoDiskTierError:
        if shred:
            raise AdminError.invalid("shred needs a sealed disk tier; this cache has no disk tier", "shred") from None
    more, left = _drop_from_memory(backend, namespace)  # what requests in progress released meanwhile
    return NamespaceDeleted(namespace=namespace, memory_pages=removed + more, memory_pages_left=left, num_chunks=num_chunks,
                            stored_bytes=stored_bytes, key_destroyed=key_destroyed)
