"""Exception handlers for an app, parameterised by its error envelope (the one thing the apps differ in).

Invariants: every error an app answers, whichever layer raises it (a route, request validation, an
unknown route or method, the body limit), is built by the app's ``ErrorEnvelope``; request
validation is answered with the envelope's status (the server's 400, the admin API's 422) naming
the first field; an unexpected exception is logged with its traceback and answered 500 without its
text; when validation is not 422 the OpenAPI spec drops FastAPI's default 422 answers.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request

log = logging.getLogger(__name__)

HTTP_CODES = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}

# (status, code, message, param) -> the JSON body of an error
BodyBuilder = Callable[[int, "str | None", str, "str | None"], dict]
# pydantic's errors -> (message, param, code)
ValidationMessage = Callable[[list[dict[str, Any]]], tuple[str, "str | None", str]]
Handler = Callable[[Request, Exception], Awaitable[JSONResponse]]


@dataclass(frozen=True, slots=True)
class ErrorEnvelope:
    """How one app writes its errors."""

    body: BodyBuilder
    validation_status: int
    validation_message: ValidationMessage
    default_code: str | None = None  # the code of an HTTP error without one of its own

    def response(self, status: int, code: str | None, message: str, param: str | None = None,
                 headers: dict[str, str] | None = None) -> JSONResponse:
        return JSONResponse(self.body(status, code, message, param), status_code=status, headers=headers)

    def too_large(self, message: str) -> JSONResponse:
        """The 413 of BodyLimitMiddleware (the connection closes: the rest of the body is unread)."""
        return self.response(413, "body_too_large", message, headers={"Connection": "close"})


def _without_422(schema: dict[str, Any]) -> dict[str, Any]:
    for operations in schema.get("paths", {}).values():
        for operation in operations.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    for name in ("HTTPValidationError", "ValidationError"):
        schema.get("components", {}).get("schemas", {}).pop(name, None)
    return schema


def install_error_handlers(app: FastAPI, envelope: ErrorEnvelope, own: Mapping[type[Exception], Handler]) -> None:
    """Make every error ``app`` answers ``envelope``-shaped; ``own`` handles the app's own error
    classes (registered first, so they win over the generic ones)."""
    for exc_class, handler in own.items():
        app.add_exception_handler(exc_class, handler)

    async def on_validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        message, param, code = envelope.validation_message(list(exc.errors()))
        return envelope.response(envelope.validation_status, code, message, param)

    async def on_http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = HTTP_CODES.get(exc.status_code, envelope.default_code)
        return envelope.response(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    async def on_unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return envelope.response(500, "internal_error", "internal server error")

    app.add_exception_handler(RequestValidationError, on_validation_error)
    app.add_exception_handler(StarletteHTTPException, on_http_error)
    app.add_exception_handler(Exception, on_unexpected)
    if envelope.validation_status != 422:
        build_openapi = app.openapi

        def openapi() -> dict[str, Any]:
            if app.openapi_schema is None:
                app.openapi_schema = _without_422(build_openapi())
            return app.openapi_schema

        app.openapi = openapi
