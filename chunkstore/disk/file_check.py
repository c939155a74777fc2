"""What verifying one chunk file found: a status from a closed set, and for a bad file why.

Invariant: ``status`` is one of ``FileStatus``; ``reason`` is empty for ``OK`` and ``MISSING`` and
says what failed otherwise; ``UNAVAILABLE`` (the storage did not answer) is neither bad nor missing,
so nothing acts on it but a miss; ``text`` is the one string shown to people and written to logs and
the management API ("ok", "missing", or the reason).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from chunkstore.disk.chunkfile import ChunkHeader


class FileStatus(enum.Enum):
    OK = "ok"
    MISSING = "missing"  # no file (the row, if any, is stale)
    UNREADABLE = "unreadable"  # the file exists and reading it failed (an I/O error)
    CORRUPT = "corrupt"  # read, and failed verification (checksum, header, identity, row)
    UNAUTHENTIC = "unauthentic"  # a sealed store's chunk that does not authenticate (forged, damaged,
    # moved, or sealed under a key the store does not hold): a security event, and bad as CORRUPT is
    UNAVAILABLE = "unavailable"  # the storage could not be reached (an object store gone away):
    # nothing is known of the payload, so it is a miss and nothing is changed


@dataclass(frozen=True, slots=True)
class FileCheck:
    status: FileStatus
    header: ChunkHeader | None = None
    size_bytes: int = 0
    reason: str = ""
    parent_key: bytes | None = None  # (OK) the parent's key as the index names it (keyring.py)

    @property
    def is_ok(self) -> bool:
        return self.status is FileStatus.OK

    @property
    def is_bad(self) -> bool:
        """Present and not usable: what a repair quarantines."""
        return self.status in (FileStatus.UNREADABLE, FileStatus.CORRUPT, FileStatus.UNAUTHENTIC)

    @property
    def is_unauthentic(self) -> bool:
        return self.status is FileStatus.UNAUTHENTIC

    @property
    def text(self) -> str:
        return self.reason or self.status.value

    @classmethod
    def ok(cls, header: ChunkHeader, size_bytes: int, parent_key: bytes | None = None) -> "FileCheck":
        return cls(FileStatus.OK, header, size_bytes, parent_key=header.parent_key if parent_key is None else parent_key)

    @classmethod
    def missing(cls) -> "FileCheck":
        return cls(FileStatus.MISSING)

    @classmethod
    def unreadable(cls, exc: OSError) -> "FileCheck":
        return cls(FileStatus.UNREADABLE, reason=f"unreadable: {exc}")

    @classmethod
    def unavailable(cls, exc: OSError) -> "FileCheck":
        return cls(FileStatus.UNAVAILABLE, reason=f"unavailable: {exc}")

    @classmethod
    def unauthentic(cls, reason: str, size_bytes: int = 0) -> "FileCheck":
        return cls(FileStatus.UNAUTHENTIC, None, size_bytes, f"unauthentic: {reason}")

    @classmethod
    def corrupt(cls, reason: str, size_bytes: int = 0) -> "FileCheck":
        return cls(FileStatus.CORRUPT, None, size_bytes, reason or "corrupt")
