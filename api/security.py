"""Who is calling the management API, and what they may see and change.

Invariants: a bearer token is compared as its SHA-256 digest with ``hmac.compare_digest`` against
every known token without stopping early (the time tells neither which token matched nor how much
of one); tokens are never logged or answered; a generated admin token is written once, with mode
0600, by an exclusive create (two starting processes agree on one token); a namespace caller is
confined to its namespace (403 elsewhere) and never sees cache-wide figures; an anonymous caller
(no Authorization header) may only read, and only while the API binds loopback.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import os
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from chunkstore.choices import Choice

from api.settings import TOKEN_FILENAME, AdminSettings

log = logging.getLogger(__name__)

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` reaches this machine only."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def allowed_host_names(settings: AdminSettings) -> frozenset[str]:
    """Host header names the API answers: loopback names, the bind address unless it is a wildcard,
    and the configured ones."""
    names = set(LOOPBACK_NAMES) | set(settings.allowed_hosts)
    bind = settings.host.strip().strip("[]").lower()
    if bind not in ("0.0.0.0", "::", ""):
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


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()


class TokenRing:
    """The admin token and the namespace tokens, as digests."""

    def __init__(self, admin_token: str, namespace_tokens: list[tuple[str, str]]) -> None:
        self._entries = [(_digest(admin_token), Caller(Role.ADMIN))]
        self._entries += [(_digest(token), Caller(Role.NAMESPACE, ns)) for ns, token in namespace_tokens]

    def identify(self, token: str) -> Caller | None:
        """The caller whose token this is, else None; constant time in the token's content."""
        digest = _digest(token)
        found = None
        for known, caller in self._entries:  # no early exit
            if hmac.compare_digest(digest, known):
                found = caller
        return found


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


def resolve_tokens(settings: AdminSettings, data_dir: Path | None) -> AdminToken:
    """The token ring: the admin token from the settings, else from (or generated into) the token
    file (default ``<data_dir>/admin-token``). Raises ValueError when there is neither a token nor a
    place for its file."""
    pairs = settings.namespace_token_pairs
    if settings.token is not None:
        return AdminToken(TokenRing(settings.token.get_secret_value(), pairs), TokenSource.SETTINGS, None)
    path = settings.token_file or (data_dir / TOKEN_FILENAME if data_dir is not None else None)
    if path is None:
        raise ValueError("no admin token: set CHUNKSTORE_ADMIN_TOKEN (or --admin-token), or a token_file; "
                         "there is no data folder to keep a generated one in")
    token, created = load_or_create_token(Path(path))
    if any(token == t for _, t in pairs):
        raise ValueError("a namespace token equals the admin token")
    return AdminToken(TokenRing(token, pairs), TokenSource.GENERATED if created else TokenSource.FILE, Path(path))
