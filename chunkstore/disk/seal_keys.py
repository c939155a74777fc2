"""Master seal keys: the key file's format, and where a store finds its key (a key provider).

Invariants: a key file holds one random 32-byte secret and the key id derived from it, is written
0600 and never overwritten, and is refused when others may read it or when its id does not match
its secret (a damaged or hand-edited file); a key's id is public (stores and chunks name it), its
secret never leaves the process that read it (no message, repr or log shows it). Providers are
immutable values, so a StoreSpec that holds one stays hashable; a provider reads its key when asked,
not when made. Imports no layer above the disk tier.
"""

from __future__ import annotations

import abc
import base64
import binascii
import hashlib
import json
import os
import secrets
import stat
from dataclasses import dataclass, field
from pathlib import Path

KEY_FILE_FORMAT = "chunkstore seal key"
KEY_FILE_VERSION = 1
SECRET_BYTES = 32  # AES-256
KEY_ID_BYTES = 8
ENV_KEY_FILE = "CHUNKSTORE_SEAL_KEY_FILE"  # the path of a key file
ENV_KEY = "CHUNKSTORE_SEAL_KEY"  # a key file's text itself (for a secret manager that sets variables)
_KEY_ID_PERSON = b"chunkstore:keyid"


class SealKeyError(ValueError):
    """A seal key that cannot be used: missing, unreadable, malformed, readable by others, or not
    the key a store is sealed with (the message names the key ids involved, never a secret)."""


def key_id_of(secret: bytes) -> str:
    """The public id of a master secret: 16 hex digits of a hash of it (so a file cannot name
    another key's id, and two different keys have different ids)."""
    return hashlib.blake2b(secret, digest_size=KEY_ID_BYTES, person=_KEY_ID_PERSON).hexdigest()


@dataclass(frozen=True, slots=True)
class MasterKey:
    """A master seal key: it wraps the namespaces' data and naming keys (sealing.py), nothing else."""

    secret: bytes = field(repr=False)
    source: str = ""  # where it was read from, for messages

    def __post_init__(self) -> None:
        if len(self.secret) != SECRET_BYTES:
            raise SealKeyError(f"a seal key's secret is {SECRET_BYTES} bytes, got {len(self.secret)}")

    @property
    def key_id(self) -> str:
        return key_id_of(self.secret)

    @classmethod
    def generate(cls) -> MasterKey:
        return cls(secrets.token_bytes(SECRET_BYTES), "a new key")


def key_text(key: MasterKey) -> str:
    """The key file's text: one JSON object and a newline."""
    return json.dumps({"format": KEY_FILE_FORMAT, "version": KEY_FILE_VERSION, "key_id": key.key_id,
                       "secret": base64.b64encode(key.secret).decode()}) + "\n"


def parse_key_text(text: str, source: str) -> MasterKey:
    """The key in a key file's ``text``; raises SealKeyError naming ``source`` and what is wrong."""
    try:
        doc = json.loads(text)
    except ValueError:
        raise SealKeyError(f"{source} is not a chunkstore seal key (not JSON)") from None
    if not isinstance(doc, dict) or doc.get("format") != KEY_FILE_FORMAT:
        raise SealKeyError(f"{source} is not a chunkstore seal key (no \"format\": \"{KEY_FILE_FORMAT}\")")
    if doc.get("version") != KEY_FILE_VERSION:
        raise SealKeyError(f"{source} is a seal key of format version {doc.get('version')!r}; "
                           f"this chunkstore reads version {KEY_FILE_VERSION}")
    try:
        secret = base64.b64decode(str(doc.get("secret", "")), validate=True)
    except (binascii.Error, ValueError):
        raise SealKeyError(f"{source}: the secret is not base64") from None
    if len(secret) != SECRET_BYTES:
        raise SealKeyError(f"{source}: the secret is {len(secret)} bytes, a seal key's is {SECRET_BYTES}")
    key = MasterKey(secret, source)
    if doc.get("key_id") != key.key_id:
        raise SealKeyError(f"{source}: its key id {doc.get('key_id')!r} is not its secret's ({key.key_id}); "
                           "the file was damaged or edited")
    return key


def write_key_file(path: str | os.PathLike, key: MasterKey | None = None) -> MasterKey:
    """Write a new key file at ``path`` (mode 0600; a new random key unless ``key`` is given) and
    return its key. Refuses (FileExistsError) to overwrite anything: a lost key makes every chunk
    it sealed unreadable. The file is fsynced before this returns."""
    from chunkstore.disk.files import create_private_file

    key = key or MasterKey.generate()
    create_private_file(Path(path), [key_text(key).encode()])
    return MasterKey(key.secret, str(path))


class KeyProvider(abc.ABC):
    """Where a store's master key comes from: a file or an environment variable today; a KMS can
    stand behind this interface (``master_key`` once per store opening)."""

    @property
    @abc.abstractmethod
    def source(self) -> str:
        """Where the key is, for messages (a path, a variable's name)."""

    @abc.abstractmethod
    def master_key(self) -> MasterKey:
        """Read the key. Raises SealKeyError saying what is wrong."""


@dataclass(frozen=True, slots=True)
class FileKeyProvider(KeyProvider):
    """A key file (``chunkstore keys new``). Refused when group or others may read or write it."""

    path: Path

    @property
    def source(self) -> str:
        return str(self.path)

    def master_key(self) -> MasterKey:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            raise SealKeyError(f"no seal key file at {self.path} (make one with `chunkstore keys new PATH`)") from None
        except OSError as exc:
            raise SealKeyError(f"cannot read the seal key file {self.path}: {exc.strerror or exc}") from None
        with os.fdopen(fd, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if not stat.S_ISREG(mode):
                raise SealKeyError(f"the seal key {self.path} is not a regular file")
            if mode & 0o077:
                raise SealKeyError(f"the seal key file {self.path} may be read by others (mode {stat.S_IMODE(mode):04o}); "
                                   f"make it the owner's alone: chmod 600 {self.path}")
            data = f.read(64 << 10)
        try:
            text = data.decode()
        except UnicodeDecodeError:
            raise SealKeyError(f"{self.path} is not a chunkstore seal key (not text)") from None
        return parse_key_text(text, str(self.path))


@dataclass(frozen=True, slots=True)
class EnvKeyProvider(KeyProvider):
    """A key file's text in an environment variable (``CHUNKSTORE_SEAL_KEY`` by default)."""

    variable: str = ENV_KEY

    @property
    def source(self) -> str:
        return f"${self.variable}"

    def master_key(self) -> MasterKey:
        text = os.environ.get(self.variable)
        if not text:
            raise SealKeyError(f"${self.variable} is not set")
        return parse_key_text(text, self.source)


def seal_key_provider(path: str | os.PathLike | None = None) -> KeyProvider | None:
    """The key a command or engine uses: the file at ``path`` when given (an empty string: none),
    else ``$CHUNKSTORE_SEAL_KEY_FILE``'s file, else ``$CHUNKSTORE_SEAL_KEY``'s text, else None (an
    unsealed store)."""
    if path is not None:
        text = os.fspath(path)
        return FileKeyProvider(Path(text).expanduser()) if text else None
    if os.environ.get(ENV_KEY_FILE):
        return FileKeyProvider(Path(os.environ[ENV_KEY_FILE]).expanduser())
    if os.environ.get(ENV_KEY):
        return EnvKeyProvider()
    return None
