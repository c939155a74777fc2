"""Field types shared by several resources: chunk keys, namespaces, tier names; the base of request bodies.

Invariant: a request body is strict: a number field takes a JSON number only (not `true`, not
"10"), a boolean a JSON boolean only, and an unknown field is refused; each answers 422 naming it.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

KEY_PATTERN = r"^[0-9a-f]{64}$"
NAMESPACE_PATTERN = r"^[^\x00-\x1f\x7f]{1,256}$"

KeyHex = Annotated[str, Field(pattern=KEY_PATTERN, description="a chunk key: 64 lower-case hex digits")]
NamespaceName = Annotated[str, Field(pattern=NAMESPACE_PATTERN, min_length=1, max_length=256,
                                     description="1-256 characters without control characters")]
TierName = Literal["device", "host", "disk"]
MemoryTierName = Literal["device", "host"]
BackendName = Literal["cache", "store"]


class RequestBody(BaseModel):
    """Base of every JSON request body of the API (query parameters stay lax: they arrive as text)."""

    model_config = ConfigDict(extra="forbid", strict=True)
