"""create_app: the management API as a FastAPI application over one backend; mount: inside another app.

Invariants: everything the routes use is built here and kept in ``app.state.admin`` (nothing at
import time); every route is under ``API_PREFIX`` (the OpenAPI spec and docs too, so ``mount`` can hand a
server's requests under it to this app unchanged); the app never closes the backend (whoever built it
does); middleware order, outermost first: Host check (400), body limit (413), headers and timing,
the body gate (all but the timing are chunkstore.http's, with this app's rule, limit, envelope and
token check: a request that sends a body to a route, and only state-changing routes take one, needs
a valid token before a byte of the body is read, so 401 comes before any 400); its OpenAPI spec says what this
API takes over this backend (spec.py); mounted in another app, it owns every path under
``API_PREFIX`` and applies its own checks there (the parent's skip it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.concurrency import run_in_threadpool

from chunkstore import __version__
from chunkstore.api.backend.base import AdminBackend
from chunkstore.api.deps import authenticate, require_writer
from chunkstore.api.errors import ENVELOPE, install_error_handlers
from chunkstore.api.middleware import ResponseMiddleware, host_refusal
from chunkstore.api.routers import ROUTERS
from chunkstore.api.runtime import AdminRuntime
from chunkstore.api.settings import AdminSettings
from chunkstore.api.spec import admin_spec
from chunkstore.api.webui import add_webui
from chunkstore.http.body_limit import BodyLimitMiddleware
from chunkstore.http.errors import amend_openapi
from chunkstore.http.hosts import HostCheckMiddleware
from chunkstore.http.json_body import JsonBodyGate
from chunkstore.http.routes import PrefixRoute

API_PREFIX = "/api/v1"


def create_app(backend: AdminBackend, settings: AdminSettings | None = None, *,
               namespace_digests: Sequence[tuple[str, bytes]] = ()) -> FastAPI:
    """The admin API over ``backend`` (CacheBackend: a live cache; StoreBackend: a store on disk).

    Resolves the admin token now (from ``settings``, else the token file, generating it on first
    start: see ``api.security``); ``namespace_digests`` are (namespace, SHA-256 of a token) pairs
    that act as namespace tokens besides the settings' (`chunkstore serve` passes its tenants' API
    keys); the history sampler starts and stops with the app's lifespan. Raises ValueError when no
    token can be had, or the admin token is also a namespace's."""
    settings = settings if settings is not None else AdminSettings()
    runtime = AdminRuntime(backend, settings, namespace_digests)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.start()
        try:
            yield
        finally:
            await run_in_threadpool(runtime.close)

    app = FastAPI(title="chunkstore admin", version=__version__, lifespan=lifespan,
                  description="The management API of a chunkstore cache (docs/API.md)",
                  openapi_url=f"{API_PREFIX}/openapi.json", docs_url=f"{API_PREFIX}/docs", redoc_url=None)
    app.state.admin = runtime
    install_error_handlers(app)
    amend_openapi(app, lambda spec: admin_spec(spec, backend))

    def check_writer(authorization: str | None) -> None:
        require_writer(authenticate(runtime, authorization), runtime)

    app.add_middleware(JsonBodyGate, envelope=ENVELOPE, check_credentials=check_writer)
    app.add_middleware(ResponseMiddleware, observe=runtime.metrics.observe)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes, too_large=ENVELOPE.too_large)
    app.add_middleware(HostCheckMiddleware, rule=runtime.host_rule,  # added last: runs first
                       refuse=host_refusal(runtime.allowed_hosts))
    for router in ROUTERS:
        app.include_router(router, prefix=API_PREFIX)
    add_webui(app)  # the dashboard at / (webui/, docs/WEBUI.md); mounted, the parent serves its own /
    return app


def mount(parent: FastAPI, backend: AdminBackend, settings: AdminSettings | None = None, *,
          namespace_digests: Sequence[tuple[str, bytes]] = ()) -> FastAPI:
    """Serve the admin API inside ``parent`` (e.g. `chunkstore serve`'s app): requests under
    ``API_PREFIX`` go to the admin app (before parent's own routes), everything else stays parent's;
    the admin app's lifespan runs inside parent's (Starlette never runs a mounted app's own).
    Returns the admin app. Raises as ``create_app``."""
    admin = create_app(backend, settings, namespace_digests=namespace_digests)
    parent.router.routes.insert(0, PrefixRoute(API_PREFIX, admin))
    outer = parent.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app):
        async with admin.router.lifespan_context(admin):
            async with outer(app) as state:
                yield state

    parent.router.lifespan_context = lifespan
    return admin
