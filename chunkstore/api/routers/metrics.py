"""GET /metrics: Prometheus text format (prometheus_client), every name prefixed ``chunkstore_``."""

from __future__ import annotations

from fastapi import APIRouter, Depends
from fastapi.responses import Response

from chunkstore.api.deps import GlobalReaderDep, RuntimeDep, require_reader
from chunkstore.api.errors import ERROR_RESPONSES
from chunkstore.api.metrics import CONTENT_TYPE

router = APIRouter(tags=["metrics"], dependencies=[Depends(require_reader)], responses=ERROR_RESPONSES)


@router.get("/metrics", response_class=Response,
            responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text exposition format"}})
def metrics(caller: GlobalReaderDep, runtime: RuntimeDep) -> Response:
    """Hit tokens by tier, bytes moved by path, tier usage, disk figures, admin request latencies."""
    return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)
