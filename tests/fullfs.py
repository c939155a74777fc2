"""A real full file system for tests: a small tmpfs mounted under tmp_path, and a filler file that
takes every free block, so that writes fail with the kernel's own ENOSPC and SQLite's own
"database or disk is full" (no fault is simulated).

Mounting needs root (CI runs as root): without it, or where the kernel refuses the mount, the test
is skipped with the reason.
"""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest


@contextmanager
def small_tmpfs(folder: Path, size_bytes: int) -> Iterator[Path]:
    """A tmpfs of ``size_bytes`` mounted at ``folder`` (created), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs (a real full disk) needs root")
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes},mode=0755", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {folder}: {mounted.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def fill(folder: Path) -> Path:
    """Take every free block of ``folder``'s file system with one file (returned: unlink it to free
    the space); every later write that needs a new block fails with ENOSPC."""
    filler = folder / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for block in (1 << 20, 1 << 16, 1 << 12, 1):  # down to single bytes: the last page is full too
            data = b"\0" * block
            while True:
                try:
                    os.write(fd, data)
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    finally:
        os.close(fd)
    return filler
