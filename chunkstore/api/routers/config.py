"""GET /config (the effective settings) and PATCH /config (live-safe settings only)."""

from __future__ import annotations

import logging
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request
from pydantic import ValidationError

from chunkstore.cache.admin import LIVE_SETTINGS

from chunkstore.api.backend.base import BackendError
from chunkstore.api.deps import AdminDep, GlobalReaderDep, RuntimeDep, audit, require_reader
from chunkstore.api.errors import ERROR_RESPONSES, AdminError, validation_message
from chunkstore.api.overrides import shadowed
from chunkstore.api.runtime import AdminRuntime
from chunkstore.api.schemas.config import (
    AdminSettingsPublic, CacheSettingsPublic, ConfigPatch, ConfigPublic, IdentityPublic, PersistedSettingsPublic,
    StoreSettingsPublic,
)

log = logging.getLogger(__name__)

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
    saved = runtime.settings_file.read()
    persisted = PersistedSettingsPublic(
        file=str(runtime.settings_file.path) if runtime.settings_file.path else None, settings=saved,
        shadowed=shadowed(saved, runtime.explicit_settings), is_writable=_is_writable(runtime))
    admin = AdminSettingsPublic(
        host=s.host, port=s.port, allowed_hosts=sorted(runtime.allowed_hosts),
        reads_need_token=runtime.reads_need_token,
        token_source=runtime.token.source.value, token_file=str(runtime.token_path) if runtime.token_path else None,
        namespace_tokens=[ns for ns, _ in s.namespace_token_pairs], max_body_bytes=s.max_body_bytes,
        history_interval_s=s.history_interval_s, history_max_rows=s.history_max_rows,
        events_interval_s=s.events_interval_s, events_max_s=s.events_max_s)
    return ConfigPublic(backend=backend.kind.value, identity=IdentityPublic.of(backend.identity),
                        cache=CacheSettingsPublic(**cache) if cache else None, store=store_public, admin=admin,
                        live_settings=list(LIVE_SETTINGS) if cache else ["disk_size"], persisted=persisted)


def _is_writable(runtime: AdminRuntime) -> bool:
    if runtime.settings_file.path is None:
        return False
    try:
        with runtime.backend.using_store(write=True):
            return True
    except BackendError:
        return False


@router.get("", response_model=ConfigPublic)
def get_config(caller: GlobalReaderDep, runtime: RuntimeDep) -> ConfigPublic:
    return _config(runtime)


@router.patch("", response_model=ConfigPublic)
def patch_config(
    body: ConfigPatch, request: Request, caller: AdminDep, runtime: RuntimeDep,
    persist: Annotated[bool, Query(description="also keep the changes for the next start (in the data folder)")]
    = True,
) -> ConfigPublic:
    """Change live-safe settings now and, unless ``persist=false``, keep them for the next start
    (where settings given by flags or the environment still win). Admin token only."""
    try:
        body.check_disk_size(runtime.backend.identity.page_size_bytes)
    except ValueError as exc:
        raise AdminError.invalid(str(exc), "disk_size") from None
    changes = body.changes()
    if persist and changes and not _is_writable(runtime):
        raise AdminError.conflict("the settings cannot be kept: no writable data folder (no disk tier, or a "
                                  "read-only store); send persist=false to change them in this process only")
    try:
        runtime.backend.reconfigure(changes)
    except ValidationError as exc:
        message, param = validation_message(list(exc.errors()))
        raise AdminError.invalid(message, param) from None
    except ValueError as exc:
        raise AdminError.invalid(str(exc)) from None
    audit(request, caller, {**changes, "persist": persist}, is_destructive=False)
    if persist and changes:
        kept = {**runtime.settings_file.read(), **body.model_dump(mode="json", include=set(changes))}
        try:
            runtime.settings_file.write(kept)
        except OSError as exc:
            log.error("PATCH /config: could not keep %s in %s: %s", changes, runtime.settings_file.path, exc)
            raise AdminError(500, "not_persisted", f"the change applies in this process, but keeping it for the "
                                                   f"next start failed: {exc.strerror or exc}") from None
    return _config(runtime)
