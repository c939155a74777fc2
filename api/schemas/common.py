"""Field types shared by several resources: chunk keys, namespaces, tier names."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

KEY_PATTERN = r"^[0-9a-f]{64}$"
NAMESPACE_PATTERN = r"^[^\x00-\x1f\x7f]{1,256}$"

KeyHex = Annotated[str, Field(pattern=KEY_PATTERN, description="a chunk key: 64 lower-case hex digits")]
NamespaceName = Annotated[str, Field(pattern=NAMESPACE_PATTERN, min_length=1, max_length=256,
                                     description="1-256 characters without control characters")]
TierName = Literal["device", "host", "disk"]
MemoryTierName = Literal["device", "host"]
BackendName = Literal["cache", "store"]
