"""The health family: Health (GET /healthz, GET /readyz)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from chunkstore.api.schemas.common import BackendName


class Health(BaseModel):
    status: Literal["ok", "unavailable"]
    backend: BackendName
    detail: str | None = None
