"""How many operations an OpenAPI spec served at a URL has: what schemathesis must report as tested."""

from __future__ import annotations

import httpx

METHODS = frozenset({"get", "put", "post", "delete", "patch", "head", "options", "trace"})


def count_operations(spec_url: str, *, headers: dict[str, str] | None = None,
                     exclude_paths: tuple[str, ...] = ()) -> int:
    spec = httpx.get(spec_url, headers=headers, timeout=30).raise_for_status().json()
    return sum(1 for path, item in spec["paths"].items() if path not in exclude_paths
               for method in item if method in METHODS)
