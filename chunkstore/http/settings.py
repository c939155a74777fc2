"""Settings fields that both apps define: the same type, bounds and parsing for each.

Invariants: a port is 0-65535 (0: any free port); a body limit is a positive byte count given as
an integer or a size (``8MiB``, parsed by chunkstore.sizes, the one size parser); a list setting
from the environment is split on commas and whitespace; a connection timeout is finite seconds > 0
and a connection cap an integer >= 1, refused with chunkstore.http.connection_limits' errors (they
name the setting, its flag and the value). Each app keeps its own descriptions and environment
prefix (CHUNKSTORE_ vs CHUNKSTORE_ADMIN_), and its own defaults but for the connection limits'.
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BeforeValidator, Field, ValidationInfo

from chunkstore.http.connection_limits import check_count, check_timeout_s
from chunkstore.sizes import parse_bytes

Port = Annotated[int, Field(ge=0, le=65535)]
BodyBytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=1)]


def _timeout_s(value: float, info: ValidationInfo) -> float:
    return check_timeout_s(info.field_name, value)


def _count(value: int, info: ValidationInfo) -> int:
    return check_count(info.field_name, value)


TimeoutS = Annotated[float, AfterValidator(_timeout_s)]
ConnectionCount = Annotated[int, AfterValidator(_count)]


def split_list(value: Any) -> Any:
    """``"a, b c"`` -> ``("a", "b", "c")`` (an environment variable holding several entries);
    anything else is returned as given."""
    if isinstance(value, str):
        return tuple(part for part in re.split(r"[,\s]+", value) if part)
    return value
