"""create_app: the FastAPI application over one running Engine, with another app optionally mounted in it.

Invariants: everything the routes use is built here and kept in ``app.state`` (engine, settings,
served model, key ring, requests in flight); nothing is created at import time; the app never
closes the engine (whoever built it does: ``chunkstore.serve.run`` on shutdown, tests in their
fixtures); every error it answers is OpenAI-shaped; request bodies are limited to
``settings.max_body_bytes`` and pass the body gate (chunkstore.http.json_body: with API keys the key
is checked before a byte of a body is read); a server on a loopback address answers only requests
addressed to a loopback name (chunkstore.http.hosts); its OpenAPI spec says what this server
accepts (spec.py: the served model's token ids, the namespace header's rule). A mounted app (the
management API, passed in by the composition root, chunkstore/serve.py: nothing here imports it)
owns the paths under its prefix and its metrics path: it checks their Host header, body size and
body by its own rules and answers their errors, and the server's checks skip them, so every path
has one Host check, one body limit and one body gate.
``GET /metrics`` is the mounted app's metrics route under another path (the request is handed to it
unchanged but for its path), where Prometheus looks for it on SGLang and vLLM servers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.responses import JSONResponse
from starlette.types import ASGIApp

from chunkstore import __version__
from chunkstore.engine import Engine
from chunkstore.http.body_limit import BodyLimitMiddleware
from chunkstore.http.errors import amend_openapi
from chunkstore.http.hosts import HostCheckMiddleware, HostRule, is_loopback
from chunkstore.http.json_body import JsonBodyGate
from chunkstore.http.routes import AliasRoute
from chunkstore.server import health, openai_api, sglang_api
from chunkstore.server.auth import KeyRing
from chunkstore.server.deps import ServedModel
from chunkstore.server.errors import ENVELOPE, install_error_handlers
from chunkstore.server.handles import InFlight
from chunkstore.server.settings import ServerSettings
from chunkstore.server.spec import server_spec

METRICS_PATH = "/metrics"  # Prometheus' default metrics_path, where SGLang and vLLM serve theirs
BODY_LIMIT_HINT = " (the server's --max-body-bytes)"


@dataclass(frozen=True, slots=True)
class MountedApp:
    """An app the composition root put inside the server: every path under ``prefix`` is its, and
    ``metrics_path`` (below the prefix, or None) is also answered at ``/metrics``."""

    prefix: str
    app: ASGIApp
    metrics_path: str | None = None


# Attaches an app to the server's app (its routes, its lifespan) and says what it mounted.
Mount = Callable[[FastAPI], MountedApp]


def _refuse_host(raw_host: str) -> JSONResponse:
    return ENVELOPE.response(400, "invalid_host", "this server listens on a loopback address and answers only "
                                                  "requests addressed to localhost, 127.0.0.1 or [::1] (Host header)")


def create_app(engine: Engine, settings: ServerSettings, *, mount: Mount | None = None) -> FastAPI:
    """The HTTP application serving ``engine`` (already started) with ``settings``; ``mount``, when
    given, attaches another app (see ``MountedApp``). Raises what ``mount`` raises."""
    app = FastAPI(title="chunkstore", version=__version__,
                  description="OpenAI- and SGLang-compatible APIs over a tiered KV cache (docs/SERVER.md)")
    app.state.engine = engine
    app.state.settings = settings
    app.state.served_model = ServedModel.of(engine, settings)
    app.state.key_ring = key_ring = KeyRing(settings.tenants)
    app.state.in_flight = InFlight()
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(openai_api.router)
    app.include_router(sglang_api.router)
    exempt: tuple[str, ...] = ()
    if mount is not None:
        mounted = mount(app)
        exempt = (mounted.prefix,)
        if mounted.metrics_path is not None:
            app.router.routes.insert(0, AliasRoute(METRICS_PATH, mounted.app, mounted.metrics_path))
            exempt += (METRICS_PATH,)
    amend_openapi(app, lambda spec: server_spec(spec, vocab_size=engine.tokenizer.vocab_size,
                                                max_positions=engine.loaded.max_positions,
                                                has_keys=key_ring.is_enabled))
    app.add_middleware(JsonBodyGate, envelope=ENVELOPE, check_credentials=key_ring.authenticate, exempt=exempt)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, too_large=ENVELOPE.too_large,
                       hint=BODY_LIMIT_HINT, exempt=exempt)
    if is_loopback(settings.host):  # added last: runs first
        app.add_middleware(HostCheckMiddleware, rule=HostRule(), refuse=_refuse_host, exempt=exempt)
    return app
