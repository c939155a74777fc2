"""What a route can ask for: the engine, the served model, the requests in flight, the caller.

Invariants: everything comes from ``app.state``, set once by ``create_app`` (nothing is built at
import time, so tests build apps over their own engines); ``CallerDep`` authenticates (401 when keys
are configured and missing or wrong) and is cached per request, so a router-level dependency and a
route parameter check the key once; every dependency is ``async`` (FastAPI runs plain ``def`` ones on
a worker thread, a hop these cheap lookups do not need).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Request

from chunkstore.engine import Engine
from chunkstore.server.auth import NAMESPACE_HEADER, Caller, KeyRing
from chunkstore.server.errors import ApiError
from chunkstore.server.handles import InFlight
from chunkstore.server.settings import ServerSettings


@dataclass(frozen=True, slots=True)
class ServedModel:
    """The one model the server runs, as the APIs name and describe it."""

    name: str  # the name clients send as `model`
    path: str  # the preset's name or the model folder
    model_id: str  # the cache identity's model id (names the weights)
    max_positions: int
    page_size: int
    created: int = field(default_factory=lambda: int(time.time()))

    @classmethod
    def of(cls, engine: Engine, settings: ServerSettings) -> "ServedModel":
        path = str(settings.model) if settings.model is not None else settings.preset
        return cls(settings.model_name, path, engine.loaded.model_id, engine.loaded.max_positions,
                   engine.cache.page_size)

    def check(self, requested: str | None) -> None:
        """Raises ApiError 404 unless ``requested`` is this model's name (or not given)."""
        if requested is not None and requested != self.name:
            raise ApiError(404, f"the model `{requested}` does not exist; this server serves `{self.name}` "
                                f"(see GET /v1/models)", code="model_not_found", param="model")


async def get_engine(request: Request) -> Engine:
    return request.app.state.engine


async def get_served_model(request: Request) -> ServedModel:
    return request.app.state.served_model


async def get_in_flight(request: Request) -> InFlight:
    return request.app.state.in_flight


async def authenticate(request: Request, authorization: Annotated[str | None, Header()] = None) -> Caller:
    """The caller; raises ApiError 401 when the server has keys and the request lacks a valid one."""
    key_ring: KeyRing = request.app.state.key_ring
    return key_ring.authenticate(authorization)


EngineDep = Annotated[Engine, Depends(get_engine)]
ServedModelDep = Annotated[ServedModel, Depends(get_served_model)]
InFlightDep = Annotated[InFlight, Depends(get_in_flight)]
CallerDep = Annotated[Caller, Depends(authenticate)]
NamespaceHeader = Annotated[str | None, Header(alias=NAMESPACE_HEADER)]
