"""Bearer tokens: one parser of the Authorization header and one constant-time lookup of a token.

Invariants: tokens are kept and compared only as SHA-256 digests (equal length whatever the token);
``DigestRing.identify`` compares the digest with ``hmac.compare_digest`` against every entry
without stopping early, so the time tells neither which entry matched nor how much of one; a
header that is absent or blank is "no token" (each app decides what that means), anything else
that is not ``Bearer <token>`` is malformed; tokens are never logged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")


class MalformedAuthorization(ValueError):
    """An Authorization header that is not ``Bearer <token>``."""


def token_digest(token: str) -> bytes:
    """SHA-256 of a token or API key: what the apps keep and compare."""
    return hashlib.sha256(token.encode()).digest()


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header; None when the header is absent or
    blank. Raises MalformedAuthorization for another scheme or a missing token."""
    if authorization is None or not authorization.strip():
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise MalformedAuthorization("the Authorization header is not `Bearer <token>`")
    return token.strip()


class DigestRing(Generic[T]):
    """Known token digests, each with what it stands for (a tenant, a caller)."""

    def __init__(self, entries: Iterable[tuple[bytes, T]]) -> None:
        self._entries: list[tuple[bytes, T]] = list(entries)

    def __len__(self) -> int:
        return len(self._entries)

    def identify(self, token: str) -> T | None:
        """What ``token`` stands for, else None. Constant time in the token's content."""
        digest = token_digest(token)
        found: T | None = None
        for known, value in self._entries:  # no early exit: every entry is compared
            if hmac.compare_digest(digest, known):
                found = value
        return found
