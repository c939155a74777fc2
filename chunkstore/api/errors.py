"""Errors as the management API answers them: ``{"error": {"code", "message", "param"}}`` and a 4xx/5xx status.

Invariants: every error response, from a route, request validation (422, naming the field), an
unknown route, the Host check (400) or the body limit (413), has this shape and is in the OpenAPI
spec (``ERROR_RESPONSES``); a backend error maps to its own status; an unexpected error is logged
with its traceback and answered 500 without details. The handlers are chunkstore.http's, with this
envelope (``ENVELOPE``).
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.requests import Request

from chunkstore.api.backend.base import BackendError
from chunkstore.http.errors import ErrorEnvelope
from chunkstore.http.errors import install_error_handlers as install_shared_handlers

log = logging.getLogger(__name__)


class ErrorDetail(BaseModel):
    code: str
    message: str
    param: str | None = None


class ErrorBody(BaseModel):
    error: ErrorDetail


def error_json(status: int, code: str, message: str, param: str | None = None,
               headers: dict[str, str] | None = None) -> JSONResponse:
    return ENVELOPE.response(status, code, message, param, headers)


class AdminError(Exception):
    """An error answered as ``status`` with ``code`` and ``message``."""

    def __init__(self, status: int, code: str, message: str, *, param: str | None = None,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.param, self.headers = status, code, message, param, headers

    @classmethod
    def unauthorized(cls, message: str) -> "AdminError":
        return cls(401, "unauthorized", message, headers={"WWW-Authenticate": "Bearer"})

    @classmethod
    def forbidden(cls, message: str) -> "AdminError":
        return cls(403, "forbidden", message)

    @classmethod
    def not_found(cls, message: str, param: str | None = None) -> "AdminError":
        return cls(404, "not_found", message, param=param)

    @classmethod
    def invalid(cls, message: str, param: str | None = None) -> "AdminError":
        return cls(422, "invalid_request", message, param=param)

    @classmethod
    def conflict(cls, message: str) -> "AdminError":
        return cls(409, "conflict", message)


_DESCRIPTIONS = {400: "Host header not allowed", 401: "missing or invalid bearer token",
                 403: "the token may not do this (another namespace's data, or admin only)",
                 404: "no such chunk, job or route", 409: "conflicts with the current state",
                 413: "request body over the limit", 422: "invalid request (the message names the field)",
                 503: "the backend is unavailable (closed, or rebuilding its index)"}
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorBody, "description": text} for status, text in _DESCRIPTIONS.items()
}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """(message, param) for pydantic's errors: the first names its field; the rest are counted."""
    first = errors[0] if errors else {"msg": "invalid request", "loc": ()}
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    loc = [str(part) for part in first.get("loc", ()) if part not in ("body", "query", "path")]
    param = ".".join(loc) or None
    msg = str(first.get("msg", "invalid value")).removeprefix("Value error, ")
    extra = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return (f"{param}: {msg}" if param else msg) + extra, param


async def _on_admin_error(request: Request, exc: AdminError) -> JSONResponse:
    return error_json(exc.status, exc.code, exc.message, exc.param, exc.headers)


async def _on_backend_error(request: Request, exc: BackendError) -> JSONResponse:
    return error_json(exc.status, exc.code, str(exc))


def _body(status: int, code: str | None, message: str, param: str | None) -> dict:
    return ErrorBody(error=ErrorDetail(code=code or "error", message=message, param=param)).model_dump()


def _validation(errors: list[dict[str, Any]]) -> tuple[str, str | None, str]:
    message, param = validation_message(errors)
    return message, param, "invalid_request"


ENVELOPE = ErrorEnvelope(_body, validation_status=422, validation_message=_validation, default_code="error")


def install_error_handlers(app: FastAPI) -> None:
    """Make every error ``app`` answers admin-shaped (chunkstore.http's handlers with ``ENVELOPE``)."""
    install_shared_handlers(app, ENVELOPE, {AdminError: _on_admin_error, BackendError: _on_backend_error})
