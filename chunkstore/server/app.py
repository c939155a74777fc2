"""create_app: the FastAPI application over one running Engine.

Invariants: everything the routes use is built here and kept in ``app.state`` (engine, settings,
served model, key ring, requests in flight); nothing is created at import time; the app never
closes the engine (whoever built it does: ``main.run`` on shutdown, tests in their fixtures); every
error it answers is OpenAI-shaped; request bodies are limited to ``settings.max_body_bytes``; a
server on a loopback address answers only requests addressed to a loopback name (host_check.py).
"""

from __future__ import annotations

from fastapi import FastAPI

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
    import api
    from api.webui import add_webui

    # Each tenant's API key is also its namespace token there, so tenants read their own chunks.
    api.mount(app, api.CacheBackend(engine.cache, decode=engine.tokenizer.decode, serving=engine.serving.snapshot),
              api.AdminSettings(host=settings.host, port=settings.port),
              namespace_digests=[(t.namespace, t.digest) for t in settings.tenants])
    add_webui(app)  # the dashboard (webui/, docs/WEBUI.md) at /, calling the API above at api/v1/
    return app
