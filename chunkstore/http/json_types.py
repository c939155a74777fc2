"""Field types of JSON request bodies on both APIs: JSON Schema's types, read strictly.

Invariants: an integer field takes a JSON number without a fractional part (``5``, ``5.0``: JSON
Schema's "integer"), never a boolean or a string; a number field takes any JSON number (integers
too), never a boolean or a string; a flag takes ``true`` or ``false`` only; a bound a field declares
is at most ``MAX_JSON_INT``, because an OpenAPI document states its bounds as doubles, which hold
every integer exactly only up to there (a spec that said 2^62 would mean 4611686018427388000);
``NAMESPACE_PATTERN`` states chunkstore/disk/namespaces.py's rule (which the apps call to refuse a
namespace) in the spec: 1-256 characters, none of Unicode's category Cc (exactly U+0000-U+001F
and U+007F-U+009F) nor ``/``, and not ``.`` or ``..`` (tests hold the two equal).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BeforeValidator, Field, StrictBool, StrictFloat, StrictInt

MAX_JSON_INT = 2**53 - 1  # JavaScript's Number.MAX_SAFE_INTEGER

_NAME = r"[^\x00-\x1f\x7f-\x9f/]"
_NAME_NOT_DOT = r"[^\x00-\x1f\x7f-\x9f/.]"
# Without lookarounds, which Rust's regex (pydantic's) lacks; the length bound is the field's maxLength.
_NAMESPACE = rf"{_NAME_NOT_DOT}|{_NAME_NOT_DOT}{_NAME}|{_NAME}{_NAME_NOT_DOT}|{_NAME}{{3,}}"
NAMESPACE_PATTERN = rf"^(?:{_NAMESPACE})$"
NAMESPACE_OR_EMPTY_PATTERN = rf"^(?:{_NAMESPACE})?$"  # where an empty one means "not given"


def _integral(value: Any) -> Any:
    """A float without a fractional part as the integer it is (anything else as given)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def json_int(*, ge: int | None = None, le: int | None = None) -> Any:
    """An integer field's type, with its bounds (given here, inside the type, so that the spec
    states them as minimum and maximum: pydantic writes bounds put on a validated type as is)."""
    return Annotated[StrictInt, Field(ge=ge, le=le), BeforeValidator(_integral)]


JsonInt = json_int()
JsonFloat = StrictFloat
JsonBool = StrictBool
