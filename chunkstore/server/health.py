"""GET /health: whether the server takes requests. No API key needed; says nothing about any tenant.

Invariants: 200 only while the engine's scheduler thread runs, 503 otherwise; once a shutdown has
begun the server accepts no connection, so a load balancer's check fails either way.
"""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from chunkstore.server.deps import EngineDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str  # "ok" or "unavailable"


@router.get("/health", response_model=Health, responses={503: {"model": Health}})
async def health(engine: EngineDep):
    if engine.is_alive:
        return Health(status="ok")
    return JSONResponse(Health(status="unavailable").model_dump(), status_code=503)
