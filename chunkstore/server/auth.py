"""Who is calling, and which cache namespace their requests use.

Invariants: with API keys configured a request is a tenant's only when its bearer token's SHA-256
equals that tenant's, compared against every key without stopping early (chunkstore.http.bearer:
the time does not tell which key matched, nor how much of one); a tenant's requests always
use the tenant's namespace, whatever they ask for (the server decides, so tenants cannot read each
other's prefixes); without keys the namespace is the ``X-Chunkstore-Namespace`` header, else the
OpenAI ``user`` field, else ``default`` (empty ones count as not given); a namespace keeps the one
rule every layer keeps (chunkstore/disk/namespaces.py: 1-256 characters of UTF-8 text without
control characters or ``/``, not ``.`` or ``..``).
"""

from __future__ import annotations

from dataclasses import dataclass

from chunkstore.disk.keys import DEFAULT_NAMESPACE
from chunkstore.disk.namespaces import check_namespace as namespace_rule
from chunkstore.http.bearer import DigestRing, MalformedAuthorization, bearer_token
from chunkstore.http.errors import ErrorCode
from chunkstore.server.errors import ApiError
from chunkstore.server.settings import Tenant

NAMESPACE_HEADER = "X-Chunkstore-Namespace"


class KeyRing:
    """The configured API keys (as digests), each with its tenant."""

    def __init__(self, tenants: tuple[Tenant, ...]) -> None:
        self._ring: DigestRing[Tenant] = DigestRing((t.digest, t) for t in tenants)

    @property
    def is_enabled(self) -> bool:
        return len(self._ring) > 0

    def identify(self, token: str) -> Tenant | None:
        """The tenant whose key is ``token``, else None. Constant time in the token's content."""
        return self._ring.identify(token)

    def authenticate(self, authorization: str | None) -> "Caller":
        """The caller of a request with this ``Authorization`` header. Raises ApiError 401 when keys
        are configured and the header does not carry one of them."""
        if not self.is_enabled:
            return Caller(None)
        try:
            token = bearer_token(authorization)
        except MalformedAuthorization:
            raise ApiError(401, "the Authorization header is not `Bearer <key>`", code=ErrorCode.INVALID_API_KEY,
                           headers={"WWW-Authenticate": "Bearer"}) from None
        if token is None:
            raise ApiError(401, "missing API key: send the header `Authorization: Bearer <key>`",
                           code=ErrorCode.MISSING_API_KEY, headers={"WWW-Authenticate": "Bearer"})
        tenant = self.identify(token)
        if tenant is None:
            raise ApiError(401, "invalid API key", code=ErrorCode.INVALID_API_KEY,
                           headers={"WWW-Authenticate": "Bearer"})
        return Caller(tenant)


def check_namespace(namespace: str, param: str) -> str:
    """``namespace`` when it keeps the namespace rule (chunkstore/disk/namespaces.py). Raises
    ApiError 400 naming ``param``, the namespace (cut short) and the rule."""
    try:
        return namespace_rule(namespace)
    except ValueError as exc:
        raise ApiError.bad_request(str(exc), param=param) from None


@dataclass(frozen=True, slots=True)
class Caller:
    """The authenticated side of a request: a tenant, or None when the server has no keys."""

    tenant: Tenant | None

    def namespace(self, header: str | None, user: str | None = None) -> str:
        """The namespace of this caller's request: the tenant's when keys are configured (the header
        and ``user`` are then ignored), else the header, then ``user``, then ``default``. Raises
        ApiError 400 for a malformed header or user."""
        if self.tenant is not None:
            return self.tenant.namespace
        if header:  # an empty header or user counts as not given
            return check_namespace(header, NAMESPACE_HEADER)
        if user:
            return check_namespace(user, "user")
        return DEFAULT_NAMESPACE
