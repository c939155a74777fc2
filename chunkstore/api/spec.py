"""What the management API's OpenAPI spec says that only the running API knows.

Invariants: the spec is the request models' (schemas/), plus what the backend decides: the least
``disk_size`` PATCH /config takes (one page of this model: ``min_disk_size_gb``, the number the
PATCH checks); ``shred`` only over a sealed store; over a store with no cache running (no memory
tiers), the tiers a request may name (the disk only, and ``all`` to clear) and the settings PATCH
/config may change (``disk_size``); so a request the spec calls valid is never refused for these
(422 for the rest). It is written once, when first asked for.
"""

from __future__ import annotations

from typing import Any

from chunkstore.api.backend.base import AdminBackend, BackendError
from chunkstore.api.schemas.config import min_disk_size_gb

MEMORY_TIERS = ("device", "host")
OFFLINE_SETTINGS = ("disk_size",)  # what PATCH /config changes with no cache running


def _schemas(spec: dict[str, Any]) -> dict[str, Any]:
    return spec.get("components", {}).get("schemas", {})


def _without_memory_tiers(schema: dict[str, Any]) -> None:
    for branch in [schema, *schema.get("anyOf", [])]:
        if "enum" in branch:
            branch["enum"] = [tier for tier in branch["enum"] if tier not in MEMORY_TIERS]


def _least_disk_size(spec: dict[str, Any], page_size_bytes: int) -> None:
    disk_size = _schemas(spec).get("ConfigPatch", {}).get("properties", {}).get("disk_size", {})
    for branch in disk_size.get("anyOf", []):
        if branch.get("type") == "number":
            branch.pop("exclusiveMinimum", None)
            branch["minimum"] = min_disk_size_gb(page_size_bytes)


def _offline(spec: dict[str, Any]) -> None:
    schemas = _schemas(spec)
    for name in ("EvictRequest", "ClearRequest"):
        tier = schemas.get(name, {}).get("properties", {}).get("tier")
        if tier is not None:
            _without_memory_tiers(tier)
    for operations in spec.get("paths", {}).values():
        for operation in operations.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("name") == "tier" and parameter.get("in") == "query":
                    _without_memory_tiers(parameter.get("schema", {}))
    patch = schemas.get("ConfigPatch", {})
    patch["properties"] = {k: v for k, v in patch.get("properties", {}).items() if k in OFFLINE_SETTINGS}


def _no_shred(spec: dict[str, Any]) -> None:
    for operations in spec.get("paths", {}).values():
        for parameter in operations.get("delete", {}).get("parameters", []):
            if parameter.get("name") == "shred" and parameter.get("in") == "query":
                parameter["schema"] = {**parameter.get("schema", {}), "enum": [False]}


def is_sealed(backend: AdminBackend) -> bool:
    """Whether the backend's disk tier is a sealed store (False without one)."""
    try:
        with backend.using_store() as store:
            return bool(store.is_sealed)
    except BackendError:
        return False


def admin_spec(spec: dict[str, Any], backend: AdminBackend) -> dict[str, Any]:
    """``spec`` as this API answers over ``backend`` (see the module's invariants)."""
    _least_disk_size(spec, backend.identity.page_size_bytes)
    if not is_sealed(backend):
        _no_shred(spec)
    if not backend.memory_tiers:
        _offline(spec)
    return spec
