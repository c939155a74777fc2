"""The server's 413 response for chunkstore.body_limit.BodyLimitMiddleware (OpenAI's error shape)."""

from __future__ import annotations

from starlette.responses import JSONResponse

from chunkstore.server.errors import error_body

HINT = " (the server's --max-body-bytes)"


def body_too_large(message: str) -> JSONResponse:
    return JSONResponse(error_body(message, status=413, code="body_too_large"), status_code=413,
                        headers={"Connection": "close"})
