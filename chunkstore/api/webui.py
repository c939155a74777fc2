"""The admin dashboard (webui/, docs/WEBUI.md): its page at ``/`` and its files under ``/webui/``.

Invariants: only files inside the webui folder are served (StaticFiles refuses paths that leave it);
nothing here needs a token (the files hold no data: the page calls the API, which checks the token);
every answer carries a Content-Security-Policy that lets the page load and call only its own origin
(no inline script, nothing from elsewhere), ``nosniff``, no referrer and no framing. The page finds
the API at ``api/v1/`` relative to itself, so it works wherever ``/`` of this app is served.
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from starlette.responses import FileResponse, Response
from starlette.routing import Mount
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger(__name__)

# The chunkstore.webui package, beside this one.
WEBUI_DIR = Path(__file__).resolve().parent.parent / "webui"
ASSETS_PATH = "/webui"

_HEADERS = {
    b"content-security-policy": (b"default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                                 b"connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'none'; "
                                 b"frame-ancestors 'none'"),
    b"x-content-type-options": b"nosniff",
    b"referrer-policy": b"no-referrer",
    b"x-frame-options": b"DENY",
    b"cache-control": b"no-cache",  # revalidate (ETag), so an upgrade is seen at the next load
}


class _DashboardHeaders:
    """Pure ASGI wrapper: sets the headers above on every answer of the wrapped app."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in _HEADERS]
                message = {**message, "headers": kept + list(_HEADERS.items())}
            await send(message)

        await self.app(scope, receive, send_with_headers)


def add_webui(app: FastAPI) -> None:
    """Adds ``GET /`` (the dashboard's page) and ``/webui/...`` (its scripts, styles and vendored
    libraries) to ``app``, outside the OpenAPI spec. When the webui folder is not installed it logs
    a warning and adds nothing: the server and the API run without their dashboard (`/` is 404)."""
    index = WEBUI_DIR / "index.html"
    if not index.is_file():
        log.warning("the dashboard's files are not installed (%s is missing): serving without it", index)
        return

    async def dashboard(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] not in ("GET", "HEAD"):
            response: Response = Response(status_code=405, headers={"Allow": "GET, HEAD"})
        else:
            response = FileResponse(index, media_type="text/html; charset=utf-8")
        await response(scope, receive, send)

    app.router.add_route("/", _DashboardHeaders(dashboard), include_in_schema=False)
    app.router.routes.append(Mount(ASSETS_PATH, app=_DashboardHeaders(StaticFiles(directory=WEBUI_DIR)),
                                   name="webui"))
