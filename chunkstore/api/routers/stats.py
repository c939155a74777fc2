"""GET /stats (cache-wide, or a namespace token's own namespace) and GET /stats/history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from chunkstore.api.backend.base import BackendError
from chunkstore.api.deps import BackendDep, GlobalReaderDep, ReaderDep, RuntimeDep, require_reader
from chunkstore.api.errors import ERROR_RESPONSES
from chunkstore.api.history import server_key
from chunkstore.api.schemas.stats import HistorySample, StatsHistory, StatsPublic

router = APIRouter(prefix="/stats", tags=["stats"], dependencies=[Depends(require_reader)],
                   responses=ERROR_RESPONSES)


@router.get("", response_model=StatsPublic)
def get_stats(caller: ReaderDep, backend: BackendDep) -> StatsPublic:
    """Tiers, hits, transfers, queues, evictions, the disk tier; a namespace token gets its
    namespace's disk figures only (cache-wide figures include other tenants' activity)."""
    return StatsPublic.of(backend.snapshot(), backend.kind.value, caller.namespace)


@router.get("/history", response_model=StatsHistory)
def get_history(
    caller: GlobalReaderDep, runtime: RuntimeDep,
    since: Annotated[float | None, Query(allow_inf_nan=False, description="epoch seconds")] = None,
    until: Annotated[float | None, Query(allow_inf_nan=False, description="epoch seconds")] = None,
    limit: Annotated[int, Query(ge=1, le=20_000, description="the newest this many samples")] = 1000,
) -> StatsHistory:
    """Samples taken every ``history_interval_s``, oldest first, kept in the store's index."""
    settings = runtime.settings
    try:
        with runtime.backend.using_store() as store:
            rows = runtime.history.read(store, since=since, until=until, limit=limit)
            is_writable, server = not store.read_only, server_key(store)
    except BackendError:
        rows, is_writable, server = [], False, ""
    return StatsHistory(interval_s=settings.history_interval_s, max_rows=settings.history_max_rows,
                        is_recording=runtime.sampler.is_recording and is_writable, server=server,
                        samples=[HistorySample(**r) for r in rows])
