"""The chunk folder tree, the default PayloadStore: fan-out paths, atomic publish, bounded reads,
quarantine, temp cleanup.

Invariants: a chunk path holds a complete file or nothing (temp file in tmp/, write, fsync per the
durability setting, rename, fsync the folder); a failed write leaves no file at the chunk path
and no temp file behind; files are write-once. Temp files live in one tmp/ folder on the same
file system so that crash cleanup lists one folder instead of scanning the fan-out tree.
Files are private: every file this module creates is 0600 from the moment it exists (created with
that mode by ``os.open``, never chmod-ed after) and every folder 0700, whatever the umask; chunk
headers hold token ids, which with a byte tokenizer are the prompt's bytes.
"""

from __future__ import annotations

import errno
import itertools
import logging
import mmap
import os
import secrets
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Executor
from pathlib import Path

from chunkstore.choices import Choice
from chunkstore.disk.payloads import _ALIGN, PayloadStore, Staged, aligned_size, read_buffer

log = logging.getLogger(__name__)

CHUNK_SUFFIX = ".kv"
TMP_PREFIX = "tmp-"
# umask can only clear bits, so creating with these modes never yields more than them.
PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


class Durability(Choice):
    """``fsync``: files and folders are fsynced before a chunk is indexed (survives power loss).
    ``none``: no fsync; survives a process crash (the page cache keeps the data), not power loss."""

    FSYNC = "fsync"
    NONE = "none"


def _checked_size(fd: int, max_size_bytes: int) -> int:
    size = os.fstat(fd).st_size
    if size > max_size_bytes:
        raise OSError(errno.EFBIG, f"chunk file of {size} bytes exceeds {max_size_bytes}")
    return size


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private(path: Path, mode: int) -> bool:
    """chmod ``path`` to ``mode`` if it exists with another one; returns whether it changed.
    A file we may not chmod (another owner) is logged and left: privacy is best effort there,
    and refusing to open the store would be worse."""
    try:
        if os.stat(path).st_mode & 0o7777 == mode:  # chmod follows a symlink: so does the check
            return False
        os.chmod(path, mode)
        return True
    except FileNotFoundError:
        return False
    except PermissionError as exc:
        log.warning("cannot make %s private (mode %o): %s", path, mode, exc)
        return False


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and missing parents, with default modes: they are not ours) as a 0700
    folder, or make the existing one 0700."""
    Path(path).mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    make_private(path, PRIVATE_DIR_MODE)


def write_private_file(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: a 0600 temp file in the same folder, write,
    fsync, rename, fsync the folder. A crash leaves the old file or the new one (and maybe the
    temp file); an error leaves no temp file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)


def _os_write(fd: int, data: memoryview) -> int:
    return os.write(fd, data)  # looked up at each call, so a patched os.write applies too


def create_private_file(path: Path, segments, *, fsync: bool = True, write=_os_write) -> None:
    """Create ``path`` (0600; never an existing file: FileExistsError) holding ``segments``
    concatenated (each written whole by ``write(fd, view)``, a seam for tests), fsynced when
    ``fsync``. On any error the file is removed and the error raised: what exists after a return
    is complete. A write that writes nothing is a full disk (ENOSPC)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, PRIVATE_FILE_MODE)
    try:
        for seg in segments:
            data = memoryview(seg).cast("B")
            while len(data):
                n = write(fd, data)
                if n <= 0:  # a regular file only writes short when the disk is full
                    raise OSError(errno.ENOSPC, "short write")
                data = data[n:]
        if fsync:
            os.fsync(fd)
    except BaseException:
        os.close(fd)
        Path(path).unlink(missing_ok=True)
        raise
    os.close(fd)


class _PrivateWalk:
    """One walk of ``ChunkFiles.make_tree_private``: chmods without a stat first (one system call
    per entry; most need the change), and warns once, not once per file, about files it may not
    chmod."""

    def __init__(self) -> None:
        self.changed = 0
        self._warned = False

    def folder(self, path: Path | str) -> None:
        try:
            it = os.scandir(path)
        except FileNotFoundError:
            return
        with it:
            for entry in it:
                if entry.is_dir(follow_symlinks=False):
                    self._chmod(entry.path, PRIVATE_DIR_MODE)
                    self.folder(entry.path)
                elif entry.is_file(follow_symlinks=False):
                    self._chmod(entry.path, PRIVATE_FILE_MODE)

    def _chmod(self, path: str, mode: int) -> None:
        try:
            os.chmod(path, mode)
        except FileNotFoundError:  # removed meanwhile
            return
        except PermissionError as exc:
            if not self._warned:
                log.warning("cannot make the files under %s private: %s", Path(path).parent, exc)
                self._warned = True
            return
        self.changed += 1


class ChunkFiles(PayloadStore):
    """The files of one store under ``root``: chunks/ab/cd/<key hex>.kv, tmp/ (staged payloads:
    temp files), quarantine/."""

    def __init__(self, root: Path, durability: Durability = Durability.FSYNC, direct_reads: bool = True):
        self.root = Path(root)
        self.location = str(self.root)
        self.chunks_dir = self.root / "chunks"
        self.tmp_dir = self.root / "tmp"
        self.quarantine_dir = self.root / "quarantine"
        self.durability = durability
        self.direct_reads = direct_reads and hasattr(os, "O_DIRECT")
        self._local = threading.local()
        self._made_dirs: set[str] = set()  # bounded by the 65,536 fan-out folders
        self._temp_seq = itertools.count()  # next() on a count is atomic under the GIL
        # The write(2) of temp files, as (fd, bytes) -> bytes written. A public fault seam: tests
        # put one here that fails (ENOSPC) to make a real store's writes fail.
        self.os_write = _os_write

    def create(self) -> None:
        """Create (or make private) chunks/, tmp/ and quarantine/: cheap, on every writable open."""
        for d in (self.chunks_dir, self.tmp_dir, self.quarantine_dir):
            make_private_dir(d)

    def make_private(self) -> int:
        """chmod every folder under chunks/, tmp/ and quarantine/ 0700 and every file 0600 (a full
        walk, for a store written before files were private: about 15 us per entry, as much as
        listing it); returns how many entries it chmod-ed. Symlinks are skipped, not followed."""
        walk = _PrivateWalk()
        for top in (self.chunks_dir, self.tmp_dir, self.quarantine_dir):
            walk.folder(top)
        return walk.changed

    def path_for(self, key: bytes) -> Path:
        h = key.hex()
        return self.chunks_dir / h[0:2] / h[2:4] / (h + CHUNK_SUFFIX)

    # -- writing ---------------------------------------------------------------------------

    def stage(self, key: bytes, segments: Sequence[bytes | memoryview]) -> Staged:
        """Write a complete temp file for ``key``; on any error remove it and re-raise."""
        # Unique per call: two puts of one key must never share (and truncate) a temp file.
        tmp = self.tmp_dir / f"{TMP_PREFIX}{key.hex()}-{os.getpid()}-{next(self._temp_seq)}"
        create_private_file(tmp, segments, fsync=self.durability is Durability.FSYNC, write=self.os_write)
        return Staged(key, tmp)

    def publish(self, staged: Sequence[Staged], executor: Executor | None = None) -> None:
        """Rename temp files to their chunk paths, then fsync each folder touched once (on
        ``executor`` when given: keys are random, so a batch touches about one folder per page and
        the fsyncs, done one after another, would serialise a many-core writer)."""
        folders: set[Path] = set()
        for item in staged:
            dest = self.path_for(item.key)
            self._ensure_dir(dest.parent)
            os.replace(item.handle, dest)
            folders.add(dest.parent)
        if self.durability is Durability.FSYNC:
            if executor is None or len(folders) < 4:
                for folder in folders:
                    _fsync_dir(folder)
            else:
                list(executor.map(_fsync_dir, folders))

    def _ensure_dir(self, folder: Path) -> None:
        s = str(folder)
        if s in self._made_dirs:
            return
        if not folder.is_dir():
            top = folder.parent
            if not top.is_dir():
                top.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
                if self.durability is Durability.FSYNC:
                    _fsync_dir(top.parent)
            folder.mkdir(mode=PRIVATE_DIR_MODE, exist_ok=True)
            if self.durability is Durability.FSYNC:
                _fsync_dir(top)
        self._made_dirs.add(s)

    def discard(self, staged: Staged) -> None:
        Path(staged.handle).unlink(missing_ok=True)

    def delete(self, key: bytes) -> bool:
        try:
            self.path_for(key).unlink()
            return True
        except (FileNotFoundError, NotADirectoryError):  # no such file, or its folder is not one
            return False

    # -- reading ---------------------------------------------------------------------------

    def read(self, key: bytes, max_size_bytes: int, buffer: mmap.mmap | None = None) -> memoryview:
        """The whole file of ``key`` in ``buffer`` (page-aligned, at least ``aligned_size(
        max_size_bytes)`` long), or by default in a per-thread buffer valid until this thread's next
        read.

        Reads go around the page cache (O_DIRECT) when ``direct_reads`` is on and the file system
        allows it: the host tier above is the cache, and a cold read then costs a fraction of the
        CPU of a buffered one. A short direct read is retried buffered, so only a file that really
        is short comes back short. Raises FileNotFoundError when absent, and OSError(EFBIG) for a
        file over ``max_size_bytes`` (a swapped or hostile file never makes us allocate more than
        a chunk can hold).
        """
        path = self.path_for(key)
        if self.direct_reads:
            try:
                view = self._read_direct(path, max_size_bytes, buffer)
            except OSError as exc:
                if exc.errno != errno.EINVAL:
                    raise
                self.direct_reads = False  # this file system refuses O_DIRECT
            else:
                if view is not None:
                    return view
        return self._read_buffered(path, max_size_bytes, buffer)

    def _buffer(self, size: int, buffer: mmap.mmap | None) -> memoryview:
        return read_buffer(self._local, size, buffer)

    def _read_direct(self, path: Path, max_size_bytes: int, buffer: mmap.mmap | None) -> memoryview | None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        try:
            size = _checked_size(fd, max_size_bytes)
            buf = self._buffer(size, buffer)
            got, want = 0, aligned_size(size)
            while got < size:
                n = os.preadv(fd, [buf[got:want]], got)
                if n <= 0 or (got + n < size and n % _ALIGN):
                    return None  # short or unaligned: let a buffered read decide
                got += n
            return buf[:size]
        finally:
            os.close(fd)

    def _read_buffered(self, path: Path, max_size_bytes: int, buffer: mmap.mmap | None) -> memoryview:
        with open(path, "rb", buffering=0) as f:
            size = _checked_size(f.fileno(), max_size_bytes)
            view = self._buffer(size, buffer)[:size]
            got = 0
            while got < size:
                n = f.readinto(view[got:])
                if not n:
                    break
                got += n
            return view[:got]

    # -- housekeeping ----------------------------------------------------------------------

    def exists(self, key: bytes) -> bool:
        return self.path_for(key).is_file()

    def modified_at(self, key: bytes) -> float | None:
        try:
            return self.path_for(key).stat().st_mtime
        except (FileNotFoundError, NotADirectoryError):
            return None

    def quarantine(self, key: bytes) -> str | None:
        """Move the file of ``key`` to quarantine/; returns its new path, None if it was already gone."""
        src = self.path_for(key)
        dest = self.quarantine_dir / f"{key.hex()}-{time.time_ns()}{CHUNK_SUFFIX}"
        try:
            os.replace(src, dest)
        except FileNotFoundError:
            return None
        make_private(dest, PRIVATE_FILE_MODE)  # a file written before files were private
        return str(dest)

    def purge_quarantine(self) -> int:
        n = 0
        try:
            entries = list(os.scandir(self.quarantine_dir))
        except FileNotFoundError:
            return 0
        for entry in entries:
            Path(entry.path).unlink(missing_ok=True)
            n += 1
        return n

    def leftovers(self, keep_own: bool = False) -> set[str]:
        """The temp files in tmp/ (their names); ``keep_own`` leaves out this process's, which may
        be puts in flight."""
        own = f"-{os.getpid()}-"
        try:
            entries = list(os.scandir(self.tmp_dir))
        except FileNotFoundError:
            return set()
        return {e.name for e in entries if e.name.startswith(TMP_PREFIX) and not (keep_own and own in e.name)}

    def remove_leftovers(self, keep_own: bool = False) -> int:
        """Delete leftover temp files (call only while holding the store's writer lock, so no
        other process writes here). ``keep_own`` spares this process's temp files, which may be
        puts in flight; on open there are none, so everything goes."""
        names = self.leftovers(keep_own)
        for name in names:
            (self.tmp_dir / name).unlink(missing_ok=True)
        return len(names)

    def has_any(self) -> bool:
        """Whether any fan-out folder exists (a cheap test: it lists only chunks/)."""
        try:
            with os.scandir(self.chunks_dir) as it:
                return any(e.is_dir() for e in it)
        except FileNotFoundError:
            return False

    def keys(self) -> Iterator[bytes]:
        """The key of every chunk file in the fan-out tree (a full scan: for verify and rebuild
        only); files whose name is not a key are left out."""
        for path in self.iter_chunk_paths():
            if (key := self.key_from_path(path)) is not None:
                yield key

    def iter_chunk_paths(self) -> Iterator[Path]:
        """Every chunk file in the fan-out tree."""
        if not self.chunks_dir.is_dir():
            return
        for top in sorted(os.scandir(self.chunks_dir), key=lambda e: e.name):
            if not top.is_dir():
                continue
            for mid in sorted(os.scandir(top.path), key=lambda e: e.name):
                if not mid.is_dir():
                    continue
                for entry in os.scandir(mid.path):
                    if entry.name.endswith(CHUNK_SUFFIX) and entry.is_file():
                        yield Path(entry.path)

    @staticmethod
    def key_from_path(path: Path) -> bytes | None:
        name = path.name
        if not name.endswith(CHUNK_SUFFIX):
            return None
        try:
            key = bytes.fromhex(name[: -len(CHUNK_SUFFIX)])
        except ValueError:
            return None
        return key if len(key) == 32 else None
