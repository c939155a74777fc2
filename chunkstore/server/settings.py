"""ServerSettings: what `chunkstore serve` runs with (defaults < CHUNKSTORE_* environment < flags), and its tenants.

Invariants: settings are valid from construction on and immutable (the cache's own settings live in
CacheConfig; the model, preset and dtype are checked when the model loads); every API key belongs to
exactly one tenant, whose namespace the server fixes: a named key's NAME, else a digest of the key,
never the key itself (namespaces are written to disk); no two entries share a key or a name; keys
are kept only as SHA-256 digests.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from chunkstore.cache.config import ENV_PREFIX
from chunkstore.http.bearer import token_digest
from chunkstore.http import connection_limits as limits
from chunkstore.http.settings import BodyBytes, ConnectionCount, Port, TimeoutS, split_list

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
_TENANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}")
_NAMESPACE_PERSON = b"chunkstore-ns"


key_digest = token_digest  # SHA-256 of an API key: what the server keeps and compares


@dataclass(frozen=True, slots=True)
class Tenant:
    """One API key and the namespace every request made with it uses."""

    name: str
    namespace: str
    digest: bytes = field(repr=False)

    @classmethod
    def parse(cls, entry: str) -> "Tenant":
        """``NAME=KEY`` (namespace NAME) or a bare ``KEY`` (namespace ``key-`` + 16 hex digits of a
        digest of the key). An entry is named when the part before the first ``=`` is a name
        (letters, digits, ``_.@-``, at most 64) and the rest is a key that does not start with
        ``=``, so base64 keys ending in ``==`` stay bare keys. Raises ValueError for an empty key or
        one with whitespace."""
        name, sep, key = entry.partition("=")
        if sep and _TENANT_NAME.fullmatch(name) and key and not key.startswith("="):
            _check_key(key)
            return cls(name, name, key_digest(key))
        _check_key(entry)
        namespace = "key-" + hashlib.blake2b(entry.encode(), digest_size=8, person=_NAMESPACE_PERSON).hexdigest()
        return cls(namespace, namespace, key_digest(entry))


def _check_key(key: str) -> None:
    if not key or any(c.isspace() for c in key):
        raise ValueError("an API key must be non-empty and contain no whitespace")


class ServerSettings(BaseSettings):
    """Settings of `chunkstore serve` besides the cache's. Raises pydantic.ValidationError (a
    ValueError) naming the field."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid", validate_default=True)

    host: str = Field("127.0.0.1", description="address to bind")
    port: Port = Field(8000, description="TCP port (0: any free port, printed at start)")
    model: Path | None = Field(None, description="a local Hugging Face model folder (nothing is downloaded)")
    preset: str = Field("tiny", description="built-in model with seeded weights, when --model is not given")
    served_model_name: str | None = Field(None, description="the model's name in the APIs (default: the "
                                                            "preset's name or the folder's name)")
    dtype: str | None = Field(None, description="compute and KV dtype: float32, bfloat16, float16 (default: "
                                                "float32 on the CPU, the folder's own on CUDA)")
    seed: int = Field(0, ge=0, description="seed of a preset's weights")
    device: str | None = Field(None, description="torch device of the model and the device pool (default: "
                                                 "CUDA when present, else the CPU)")
    max_queue_size: int = Field(64, ge=1, description="requests waiting for the engine; more are refused (429)")
    max_running_requests: int = Field(4, ge=1, description="requests decoded at once, in one batched forward per token")
    torch_threads: int | None = Field(None, ge=1, description="threads of the model's forward (torch."
                                      "set_num_threads; default: torch's, one per core: on 2 cores the "
                                      "disk benchmark served 7.3 req/s with 2 against 6.2 with 1, the "
                                      "store's threads running at background priority)")
    api_key: Annotated[tuple[str, ...], NoDecode] = Field(
        (), description="API keys, KEY or NAME=KEY; the environment variable takes several, separated by commas")
    max_body_bytes: BodyBytes = Field(8 * 2**20, description="largest request body (bytes, or a size such as 8MiB)")
    shutdown_timeout_s: float = Field(10.0, ge=0, description="on SIGTERM/SIGINT, how long running requests may "
                                                              "finish before they are aborted")
    header_timeout_s: TimeoutS = Field(limits.HEADER_TIMEOUT_S, description="seconds a request's header may take "
                                       "from its first byte (a new connection's start); then 408, connection closed")
    body_timeout_s: TimeoutS = Field(limits.BODY_TIMEOUT_S, description="longest pause in seconds while a request's "
                                     "body arrives; then 408, connection closed")
    max_connections: ConnectionCount = Field(limits.MAX_CONNECTIONS, description="connections open at once; more "
                                             "are answered 503 and closed as they open")
    log_level: str = Field("info", description="log level: " + ", ".join(LOG_LEVELS))

    @field_validator("model", "served_model_name", "dtype", "device", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value  # CHUNKSTORE_MODEL=""

    @field_validator("api_key", mode="before")
    @classmethod
    def _split_keys(cls, value: Any) -> Any:
        return split_list(value)  # CHUNKSTORE_API_KEY="alice=k1, bob=k2"

    @field_validator("log_level", mode="before")
    @classmethod
    def _parse_level(cls, value: Any) -> str:
        level = str(value).lower()
        if level not in LOG_LEVELS:
            raise ValueError(f"unknown log level {value!r}; choose one of {', '.join(LOG_LEVELS)}")
        return level

    @model_validator(mode="after")
    def _check_tenants(self) -> "ServerSettings":
        tenants = self.tenants  # raises for a malformed entry
        if len({t.digest for t in tenants}) != len(tenants):
            raise ValueError("the same API key is given twice")
        if len({t.name for t in tenants}) != len(tenants):
            raise ValueError("two API keys have the same tenant name")
        return self

    @property
    def tenants(self) -> tuple[Tenant, ...]:
        """One tenant per ``api_key`` entry (none: the server needs no key)."""
        return tuple(Tenant.parse(entry) for entry in self.api_key)

    @property
    def model_name(self) -> str:
        """What the APIs call the model."""
        if self.served_model_name:
            return self.served_model_name
        return self.model.resolve().name if self.model is not None else self.preset
