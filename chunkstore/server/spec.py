"""What the server's OpenAPI spec says that only the running server knows.

Invariants: the spec is the request models' (request_fields.py), plus, from the served model, the
bounds of every token id list (ids below the vocabulary's size, at most as many as the model has
positions: the engine refuses anything else with 400) and, from the settings, the
``X-Chunkstore-Namespace`` header's rule when it counts (without API keys: with keys every
request uses its tenant's namespace and the header is ignored, whatever it holds).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from chunkstore.disk.namespaces import MAX_NAMESPACE_CHARS
from chunkstore.http.json_types import NAMESPACE_OR_EMPTY_PATTERN
from chunkstore.server.auth import NAMESPACE_HEADER
from chunkstore.server.request_fields import TOKEN_IDS


def _dicts(node: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``node``, depth first."""
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            yield item
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def bound_token_ids(spec: dict[str, Any], *, vocab_size: int, max_positions: int) -> None:
    """Give every token id list of ``spec`` (marked ``TOKEN_IDS`` by request_fields.py) the
    served model's bounds."""
    for schema in list(_dicts(spec)):
        if schema.pop(TOKEN_IDS, False):
            schema["maxItems"] = max_positions
            schema["items"] = {**schema.get("items", {}), "type": "integer", "minimum": 0, "maximum": vocab_size - 1}


def describe_namespace_header(spec: dict[str, Any]) -> None:
    """State the namespace rule on the ``X-Chunkstore-Namespace`` header (empty: not given)."""
    for schema in list(_dicts(spec)):
        if schema.get("in") == "header" and schema.get("name", "").lower() == NAMESPACE_HEADER.lower():
            schema["schema"] = {"type": "string", "maxLength": MAX_NAMESPACE_CHARS,
                                "pattern": NAMESPACE_OR_EMPTY_PATTERN}
            schema["description"] = ("the cache namespace (no API keys): 1-256 characters without control "
                                     "characters or '/', not '.' or '..'; empty: not given")


def server_spec(spec: dict[str, Any], *, vocab_size: int, max_positions: int, has_keys: bool) -> dict[str, Any]:
    """``spec`` as this server answers (see the module's invariants)."""
    bound_token_ids(spec, vocab_size=vocab_size, max_positions=max_positions)
    if not has_keys:
        describe_namespace_header(spec)
    return spec
