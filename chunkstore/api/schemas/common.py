"""Field types shared by several resources: chunk keys, namespaces, tier names, sizes; the base of request bodies.

Invariants: a request body is strict: a number field takes a JSON number only (not `true`, not
"10"), an integer field a JSON number without a fraction, a boolean a JSON boolean only, and an
unknown field is refused; each answers 422 naming it; a namespace follows the one rule
(chunkstore/disk/namespaces.py), which the spec states as a pattern; a size in bytes is at most
``MAX_BYTES``, the largest integer the spec can state exactly (chunkstore.http.json_types).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from chunkstore.disk.namespaces import MAX_NAMESPACE_CHARS, check_namespace
from chunkstore.http.json_types import MAX_JSON_INT, NAMESPACE_PATTERN, json_int

KEY_PATTERN = r"^[0-9a-f]{64}$"
MAX_BYTES = MAX_JSON_INT  # 8 PiB


def _namespace(value: Any) -> Any:
    """The namespace rule's own message for a string that breaks it."""
    return check_namespace(value) if isinstance(value, str) else value


KeyHex = Annotated[str, Field(pattern=KEY_PATTERN, description="a chunk key: 64 lower-case hex digits")]
NamespaceName = Annotated[str, Field(pattern=NAMESPACE_PATTERN, min_length=1, max_length=MAX_NAMESPACE_CHARS,
                                     description="1-256 characters without control characters or '/', not '.' or "
                                                 "'..'"),
                          BeforeValidator(_namespace)]
TierName = Literal["device", "host", "disk"]
MemoryTierName = Literal["device", "host"]
BackendName = Literal["cache", "store"]


def size_bytes(*, ge: int) -> Any:
    """A size in bytes, from ``ge`` to ``MAX_BYTES``."""
    return json_int(ge=ge, le=MAX_BYTES)


class RequestBody(BaseModel):
    """Base of every JSON request body of the API (query parameters stay lax: they arrive as text)."""

    model_config = ConfigDict(extra="forbid", strict=True)
