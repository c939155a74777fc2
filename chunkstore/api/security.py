"""Who is calling the management API, and what they may see and change.

Invariants: a bearer token is compared as its SHA-256 digest against every known token without
stopping early (chunkstore.http.bearer: the time tells neither which token matched nor how much of
one); tokens are never logged or answered; a generated admin token is written once, with mode
0600, by an exclusive create (two starting processes agree on one token); a namespace caller is
confined to its namespace (403 elsewhere) and never sees cache-wide figures; an anonymous caller
(no Authorization header) may only read, and only while the API binds loopback and no namespace has a
token of its own (tenants configured: every call needs a token); the admin token never equals a
namespace's token, however either was given.
"""

from __future__ import annotations

import hmac
import logging
import os
import secrets
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from chunkstore.api.settings import TOKEN_FILENAME, AdminSettings
from chunkstore.choices import Choice
from chunkstore.disk.namespaces import check_namespace
from chunkstore.http.bearer import DigestRing, token_digest
from chunkstore.http.hosts import WILDCARD_ADDRESSES, host_name, is_loopback

log = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


__all__ = ["LOOPBACK_NAMES", "AdminToken", "Caller", "Role", "TokenRing", "TokenSource", "allowed_host_names",
           "is_loopback", "load_or_create_token", "resolve_tokens"]


def allowed_host_names(settings: AdminSettings) -> frozenset[str]:
    """Host header names the API answers besides every loopback name (chunkstore.http.hosts'
    rule): the usual loopback names, the bind address unless it is a wildcard, and the configured ones."""
    names = set(LOOPBACK_NAMES) | set(settings.allowed_hosts)
    bind = host_name(settings.host)
    if bind not in WILDCARD_ADDRESSES:
        names.add(bind)
    return frozenset(names)


class Role(Choice):
    ADMIN = "admin"
    NAMESPACE = "namespace"
    ANONYMOUS = "anonymous"  # no token: reads on a loopback-only API


@dataclass(frozen=True, slots=True)
class Caller:
    role: Role
    namespace: str | None = None  # set for a namespace token

    @property
    def is_namespace_scoped(self) -> bool:
        return self.role is Role.NAMESPACE

    def describe(self) -> str:
        return f"namespace token of {self.namespace!r}" if self.is_namespace_scoped else self.role.value


class TokenRing:
    """The admin token and the namespace tokens, as digests: the namespace tokens given to the API,
    and ``namespace_digests``, (namespace, SHA-256 digest) pairs of tokens kept elsewhere (the API keys
    of `chunkstore serve`'s tenants, so a tenant's key reads its own namespace here too). Raises
    ValueError when the admin token is also a namespace's token, or a token's namespace breaks the
    namespace rule (chunkstore/disk/namespaces.py)."""

    def __init__(self, admin_token: str, namespace_tokens: list[tuple[str, str]],
                 namespace_digests: Sequence[tuple[str, bytes]] = ()) -> None:
        admin = token_digest(admin_token)
        scoped = [(token_digest(token), ns) for ns, token in namespace_tokens] + [(d, ns) for ns, d in namespace_digests]
        for _, ns in scoped:
            try:
                check_namespace(ns)
            except ValueError as exc:
                raise ValueError(f"a namespace token's namespace cannot be one: {exc}") from None
        clash = [ns for digest, ns in scoped if hmac.compare_digest(digest, admin)]
        if clash:
            raise ValueError(f"the admin token is also the token (or API key) of namespace {clash[0]!r}: "
                             f"give the admin a token of its own")
        self._ring: DigestRing[Caller] = DigestRing(
            [(admin, Caller(Role.ADMIN))] + [(digest, Caller(Role.NAMESPACE, ns)) for digest, ns in scoped])

    @property
    def has_namespace_tokens(self) -> bool:
        """Whether any namespace (tenant) has a token: then every call needs one."""
        return len(self._ring) > 1

    def identify(self, token: str) -> Caller | None:
        """The caller whose token this is, else None; constant time in the token's content."""
        return self._ring.identify(token)


class TokenSource(Choice):
    SETTINGS = "settings"  # CHUNKSTORE_ADMIN_TOKEN or --admin-token
    FILE = "file"  # read from the token file
    GENERATED = "generated"  # created into the token file at this start


def load_or_create_token(path: Path) -> tuple[str, bool]:
    """The token in ``path``, or a new one written there with mode 0600; returns (token, created).
    Raises OSError when the file can be neither read nor created, ValueError when it is empty."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            log.warning("the admin token file %s is readable by others (mode %o); making it 0600", path, mode)
            os.chmod(path, 0o600)
        token = path.read_text().strip()
        if not token:
            raise ValueError(f"the admin token file {path} is empty; delete it to generate a new token") from None
        return token, False
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
        f.flush()
        os.fsync(f.fileno())
    return token, True


@dataclass(frozen=True, slots=True)
class AdminToken:
    ring: TokenRing
    source: TokenSource
    path: Path | None  # the token file, when the token is kept in one


def resolve_tokens(settings: AdminSettings, data_dir: Path | None,
                   namespace_digests: Sequence[tuple[str, bytes]] = ()) -> AdminToken:
    """The token ring: the admin token from the settings, else from (or generated into) the token
    file (default ``<data_dir>/admin-token``), with the settings' namespace tokens and
    ``namespace_digests`` (see ``TokenRing``). Raises ValueError when there is neither a token nor a
    place for its file, or when the admin token is also a namespace's token."""
    pairs = settings.namespace_token_pairs
    if settings.token is not None:
        ring = TokenRing(settings.token.get_secret_value(), pairs, namespace_digests)
        return AdminToken(ring, TokenSource.SETTINGS, None)
    path = settings.token_file or (data_dir / TOKEN_FILENAME if data_dir is not None else None)
    if path is None:
        raise ValueError("no admin token: set CHUNKSTORE_ADMIN_TOKEN (or --admin-token), or a token_file; "
                         "there is no data folder to keep a generated one in")
    token, created = load_or_create_token(Path(path))
    try:
        ring = TokenRing(token, pairs, namespace_digests)
    except ValueError as exc:
        raise ValueError(f"{exc} (the admin token is read from {path})") from None
    return AdminToken(ring, TokenSource.GENERATED if created else TokenSource.FILE, Path(path))
