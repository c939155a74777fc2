"""GET /config (the effective settings) and PATCH /config (live-safe settings only)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from pydantic import ValidationError

from chunkstore.cache.admin import LIVE_SETTINGS

from api.backend.base import BackendError
from api.deps import AdminDep, GlobalReaderDep, RuntimeDep, audit, require_reader
from api.errors import ERROR_RESPONSES, AdminError, validation_message
from api.runtime import AdminRuntime
from api.schemas.config import (
    AdminSettingsPublic, CacheSettingsPublic, ConfigPatch, ConfigPublic, IdentityPublic, StoreSettingsPublic,
)

router = APIRouter(prefix="/config", tags=["config"], dependencies=[Depends(require_reader)],
                   responses=ERROR_RESPONSES)


def _config(runtime: AdminRuntime) -> ConfigPublic:
    backend, s = runtime.backend, runtime.settings
    cache = backend.settings()
    try:
        with backend.using_store() as store:
            store_public = StoreSettingsPublic(path=str(store.root), capacity_bytes=store.capacity_bytes,
                                               codec=store.codec.value, read_only=store.read_only)
    except BackendError:
        store_public = None
    admin = AdminSettingsPublic(
        host=s.host, port=s.port, allowed_hosts=sorted(runtime.allowed_hosts),
        reads_need_token=runtime.reads_need_token,
        token_source=runtime.token.source.value, token_file=str(runtime.token_path) if runtime.token_path else None,
        namespace_tokens=[ns for ns, _ in s.namespace_token_pairs], max_body_bytes=s.max_body_bytes,
        history_interval_s=s.history_interval_s, history_max_rows=s.history_max_rows,
        events_interval_s=s.events_interval_s, events_max_s=s.events_max_s)
    return ConfigPublic(backend=backend.kind.value, identity=IdentityPublic.of(backend.identity),
                        cache=CacheSettingsPublic(**cache) if cache else None, store=store_public, admin=admin,
                        live_settings=list(LIVE_SETTINGS) if cache else ["disk_size"])


@router.get("", response_model=ConfigPublic)
def get_config(caller: GlobalReaderDep, runtime: RuntimeDep) -> ConfigPublic:
    return _config(runtime)


@router.patch("", response_model=ConfigPublic)
def patch_config(body: ConfigPatch, request: Request, caller: AdminDep, runtime: RuntimeDep) -> ConfigPublic:
    """Change live-safe settings now (this process only). Admin token only."""
    changes = body.changes()
    try:
        runtime.backend.reconfigure(changes)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise AdminError.invalid(message, param) from None
    except ValueError as exc:
        raise AdminError.invalid(str(exc)) from None
    audit(request, caller, changes, is_destructive=False)
    return _config(runtime)
