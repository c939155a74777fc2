"""GET /healthz (the process answers) and GET /readyz (the backend can serve). No token needed: they
say nothing about any tenant."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from chunkstore.api.deps import RuntimeDep
from chunkstore.api.errors import ERROR_RESPONSES
from chunkstore.api.schemas.health import Health

router = APIRouter(tags=["health"], responses={k: v for k, v in ERROR_RESPONSES.items() if k in (400, 413)})


@router.get("/healthz", response_model=Health)
def healthz(runtime: RuntimeDep) -> Health:
    return Health(status="ok", backend=runtime.backend.kind.value)


@router.get("/readyz", response_model=Health, responses={503: {"model": Health, "description": "not ready"}})
def readyz(runtime: RuntimeDep):
    backend = runtime.backend.kind.value
    if runtime.closing.is_set():
        detail = "shutting down"
    elif not runtime.backend.is_ready():
        detail = "the backend is closed or rebuilding its index"
    else:
        return Health(status="ok", backend=backend)
    return JSONResponse(Health(status="unavailable", backend=backend, detail=detail).model_dump(), status_code=503)
