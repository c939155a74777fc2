"""docs/API.md documents every endpoint and every setting of the management API, and the OpenAPI
spec has a typed model for every operation."""

from __future__ import annotations

import re
from pathlib import Path

from fastapi.routing import APIRoute

from chunkstore.api.app import API_PREFIX
from chunkstore.api.routers import ROUTERS
from chunkstore.api.settings import ENV_PREFIX, AdminSettings

DOCS = Path(__file__).resolve().parents[2] / "docs" / "API.md"


def endpoints() -> list[tuple[str, str]]:
    out = []
    for router in ROUTERS:
        for route in router.routes:
            if isinstance(route, APIRoute):
                out += [(method, route.path_format) for method in sorted(route.methods)]  # no :path
    return out


def test_every_endpoint_is_documented():
    docs = DOCS.read_text()
    found = endpoints()
    assert len(found) >= 22
    for method, path in found:
        assert re.search(rf"^### `{method} {re.escape(path)}`", docs, re.MULTILINE), \
            f"`{method} {path}` has no section in docs/API.md"


def test_every_setting_is_documented():
    docs = DOCS.read_text()
    for name in AdminSettings.model_fields:
        assert f"`{name}`" in docs and ENV_PREFIX + name.upper() in docs, f"setting {name} is not in docs/API.md"


def test_the_spec_types_every_operation(store_server):
    import httpx

    spec = httpx.get(store_server.url + API_PREFIX + "/openapi.json").json()
    operations = {(m.upper(), p.removeprefix(API_PREFIX)) for p, ops in spec["paths"].items() for m in ops}
    assert operations == set(endpoints())
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            ok = op["responses"].get("200") or op["responses"].get("202")
            content = ok["content"]
            assert "application/json" in content and content["application/json"].get("schema") or \
                {"text/plain", "text/event-stream"} & set(content), f"{method} {path} has no typed response"
            for status in ("401", "422"):
                if path not in (API_PREFIX + "/healthz", API_PREFIX + "/readyz"):
                    assert status in op["responses"], f"{method} {path} does not document {status}"
