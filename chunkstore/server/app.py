"""create_app: the FastAPI application over one running Engine.

Invariants: everything the routes use is built here and kept in ``app.state`` (engine, settings,
served model, key ring, requests in flight); nothing is created at import time; the app never
closes the engine (whoever built it does: ``main.run`` on shutdown, tests in their fixtures); every
error it answers is OpenAI-shaped; request bodies are limited to ``settings.max_body_bytes``; a
server on a loopback address answers only requests addressed to a loopback name (host_check.py);
``GET /metrics`` is the management API's ``/api/v1/metrics`` under another path (the request is
handed to the mounted admin app unchanged but for its path), so both expose one registry under one
auth rule, where Prometheus looks for it on SGLang and vLLM servers.
"""

from __future__ import annotations

from fastapi import FastAPI
from starlette.routing import BaseRoute, Match, NoMatchFound
from starlette.types import ASGIApp, Receive, Scope, Send

from chunkstore import __version__
from chunkstore.body_limit import BodyLimitMiddleware
from chunkstore.engine import Engine
from chunkstore.server import health, openai_api, sglang_api
from chunkstore.server.auth import KeyRing
from chunkstore.server.body_limit import HINT, body_too_large
from chunkstore.server.deps import ServedModel
from chunkstore.server.errors import install_error_handlers
from chunkstore.server.handles import InFlight
from chunkstore.server.host_check import LoopbackHostMiddleware, is_loopback
from chunkstore.server.settings import ServerSettings


METRICS_PATH = "/metrics"  # Prometheus' default metrics_path, where SGLang and vLLM serve theirs


class AliasRoute(BaseRoute):
    """Hands requests for exactly ``path`` to ``app`` as requests for ``target``: the target's
    routes, auth and errors answer them, so the alias can never drift from what it aliases."""

    def __init__(self, path: str, app: ASGIApp, target: str) -> None:
        self.path, self.app, self.target = path, app, target

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        if scope["type"] == "http":
            path = scope["path"].removeprefix(scope.get("root_path", "") or "")
            if path == self.path:
                return Match.FULL, {}
        return Match.NONE, {}

    def url_path_for(self, name: str, /, **path_params: str):
        raise NoMatchFound(name, path_params)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        root = scope.get("root_path", "") or ""
        target = root + self.target
        await self.app({**scope, "path": target, "raw_path": target.encode()}, receive, send)


def create_app(engine: Engine, settings: ServerSettings) -> FastAPI:
    """The HTTP application serving ``engine`` (already started) with ``settings``."""
    app = FastAPI(title="chunkstore", version=__version__,
                  description="OpenAI- and SGLang-compatible APIs over a tiered KV cache (docs/SERVER.md)")
    app.state.engine = engine
    app.state.settings = settings
    app.state.served_model = ServedModel.of(engine, settings)
    app.state.key_ring = KeyRing(settings.tenants)
    app.state.in_flight = InFlight()
    install_error_handlers(app)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, too_large=body_too_large, hint=HINT)
    if is_loopback(settings.host):
        app.add_middleware(LoopbackHostMiddleware)
    app.include_router(health.router)
    app.include_router(openai_api.router)
    app.include_router(sglang_api.router)
    # The management API (api/, docs/API.md) under /api/v1, on the same port: the operator's handle
    # on the running cache. Imported here so that the server package stays importable alone.
    from chunkstore import api
    from chunkstore.api.webui import add_webui

    # Each tenant's API key is also its namespace token there, so tenants read their own chunks.
    admin = api.mount(app, api.CacheBackend(engine.cache, decode=engine.tokenizer.decode,
                                            serving=engine.serving.snapshot),
                      api.AdminSettings(host=settings.host, port=settings.port),
                      namespace_digests=[(t.namespace, t.digest) for t in settings.tenants])
    app.router.routes.insert(0, AliasRoute(METRICS_PATH, admin, f"{api.API_PREFIX}/metrics"))
    add_webui(app)  # the dashboard (webui/, docs/WEBUI.md) at /, calling the API above at api/v1/
    return app

