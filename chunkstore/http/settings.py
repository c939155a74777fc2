"""Settings fields that both apps define: the same type, bounds and parsing for each.

Invariants: a port is 0-65535 (0: any free port); a body limit is a positive byte count given as
an integer or a size (``8MiB``, parsed by chunkstore.sizes, the one size parser); a list setting
from the environment is split on commas and whitespace. Each app keeps its own defaults,
descriptions and environment prefix (CHUNKSTORE_ vs CHUNKSTORE_ADMIN_).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import BeforeValidator, Field

from chunkstore.sizes import parse_bytes

Port = Annotated[int, Field(ge=0, le=65535)]
BodyBytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=1)]


def split_list(value: Any) -> Any:
    """``"a, b c"`` -> ``("a", "b", "c")`` (an environment variable holding several entries);
    anything else is returned as given."""
    if isinstance(value, str):
        return tuple(part for part in re.split(r"[,\s]+", value) if part)
    return value
