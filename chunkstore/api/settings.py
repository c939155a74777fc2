"""AdminSettings: how the management API runs (defaults < CHUNKSTORE_ADMIN_* environment < flags).

Invariants: settings are valid from construction on and immutable; tokens are held as SecretStr
(never printed, never in ``GET /config``); every namespace token names exactly one namespace and
no token is given twice. Nothing here is created at import time: ``create_app`` takes an instance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from chunkstore.http import connection_limits as limits
from chunkstore.http.settings import BodyBytes, ConnectionCount, Port, TimeoutS, split_list

ENV_PREFIX = "CHUNKSTORE_ADMIN_"
TOKEN_FILENAME = "admin-token"


def parse_namespace_token(entry: str) -> tuple[str, str]:
    """``NAMESPACE=TOKEN`` -> (namespace, token). Raises ValueError for a missing part or whitespace."""
    namespace, sep, token = entry.partition("=")
    if not sep or not namespace or not token or any(c.isspace() for c in token):
        raise ValueError("a namespace token is NAMESPACE=TOKEN, with a non-empty token without whitespace")
    return namespace, token


class AdminSettings(BaseSettings):
    """Settings of the management API. Raises pydantic.ValidationError (a ValueError) naming the field."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid", validate_default=True)

    host: str = Field("127.0.0.1", description="address the API binds (or, mounted in `serve`, the server's)")
    port: Port = Field(8001, description="TCP port of `chunkstore admin` (0: any free port)")
    token: SecretStr | None = Field(None, description="the admin bearer token (env CHUNKSTORE_ADMIN_TOKEN); "
                                                      "unset: read from, or generated into, token_file")
    token_file: Path | None = Field(None, description="where a generated token is kept (mode 0600); default "
                                                      "<data folder>/admin-token")
    namespace_tokens: Annotated[tuple[SecretStr, ...], NoDecode] = Field(
        (), description="NAMESPACE=TOKEN entries: tokens that see and change only their namespace")
    allowed_hosts: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="Host header names accepted besides loopback names and the bind address")
    max_body_bytes: BodyBytes = Field(64 * 1024, description="largest request body (bytes, or a size such as "
                                                             "64KiB); larger ones get 413")
    header_timeout_s: TimeoutS = Field(limits.HEADER_TIMEOUT_S, description="`chunkstore admin`: seconds a request's "
                                       "header may take from its first byte (a new connection's start); then 408")
    body_timeout_s: TimeoutS = Field(limits.BODY_TIMEOUT_S, description="`chunkstore admin`: longest pause in "
                                     "seconds while a request's body arrives; then 408")
    max_connections: ConnectionCount = Field(limits.MAX_CONNECTIONS, description="`chunkstore admin`: connections "
                                             "open at once; more are answered 503 and closed as they open")
    history_interval_s: float = Field(5.0, gt=0, description="seconds between two samples of the stats history")
    history_max_rows: int = Field(17_280, ge=1, description="samples kept (the oldest go first); 17,280 = "
                                                             "one day at 5 s")
    events_interval_s: float = Field(2.0, gt=0, description="default seconds between two GET /events snapshots")
    events_max_s: float = Field(600.0, gt=0, description="longest life of one GET /events stream")
    job_history: int = Field(50, ge=1, description="finished jobs kept for GET /jobs")

    @field_validator("namespace_tokens", "allowed_hosts", mode="before")
    @classmethod
    def _split_lists(cls, value: Any) -> Any:
        return split_list(value)  # CHUNKSTORE_ADMIN_ALLOWED_HOSTS="a.example, b.example"

    @field_validator("allowed_hosts")
    @classmethod
    def _lower_hosts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(h.strip().lower().strip("[]") for h in value)

    @model_validator(mode="after")
    def _check_tokens(self) -> "AdminSettings":
        pairs = self.namespace_token_pairs  # raises for a malformed entry
        tokens = [t for _, t in pairs] + ([self.token.get_secret_value()] if self.token else [])
        if len(set(tokens)) != len(tokens):
            raise ValueError("the same token is given twice (admin and namespace tokens must all differ)")
        if len({ns for ns, _ in pairs}) != len(pairs):
            raise ValueError("two namespace tokens name the same namespace")
        if self.token is not None and not self.token.get_secret_value().strip():
            raise ValueError("token: an empty admin token is not allowed")
        return self

    @property
    def namespace_token_pairs(self) -> list[tuple[str, str]]:
        return [parse_namespace_token(entry.get_secret_value()) for entry in self.namespace_tokens]
