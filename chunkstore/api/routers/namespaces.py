"""GET /namespaces (usage, quota, hit rate) and PUT /namespaces/{namespace}/quota."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Path, Request

from chunkstore.cache.stats import NamespaceLookups

from chunkstore.api.backend.base import AdminBackend, NoDiskTierError
from chunkstore.api.deps import AdminDep, BackendDep, ReaderDep, audit, require_reader
from chunkstore.api.errors import ERROR_RESPONSES
from chunkstore.api.schemas.common import NAMESPACE_PATTERN
from chunkstore.api.schemas.namespaces import NamespaceList, NamespacePublic, QuotaUpdate

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


@router.put("/{namespace:path}/quota", response_model=NamespacePublic)  # :path: a namespace may hold "/"
def set_quota(namespace: Annotated[str, Path(pattern=NAMESPACE_PATTERN, max_length=256)], body: QuotaUpdate,
              request: Request, caller: AdminDep, backend: BackendDep) -> NamespacePublic:
    """Bound (or, with null, unbound) the stored bytes of a namespace. Admin token only."""
    with backend.using_store(write=True) as store:
        store.set_quota(namespace, body.quota_bytes)
    audit(request, caller, {"namespace": namespace, "quota_bytes": body.quota_bytes}, is_destructive=False)
    return _namespaces(backend, namespace)[0]
