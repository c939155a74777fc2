"""Files on disk are private: every file in the data folder is 0600 and every folder 0700 whatever
the umask (chunk headers hold token ids, which with a byte tokenizer are the prompt's bytes), and
a store written before that is made private when a writer opens it.

The tests set a permissive umask: with 0o000 any file or folder created without an explicit
private mode comes out 0666/0777 and fails the checks.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import threading
from pathlib import Path

import pytest

from chunkstore.api.overrides import SettingsFile
from chunkstore.api.security import load_or_create_token
from chunkstore import ChunkStore, chain_pages
from chunkstore.cli import main
from chunkstore.disk.index import db_files, sqlite_url
from chunkstore.disk.maintenance import rebuild
from chunkstore.disk.store import PRIVATE_MARKER, STORE_FILENAME
from tests.helpers import TINY, kv_pages


@pytest.fixture
def open_umask():
    old = os.umask(0o000)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def _all_modes(root: Path) -> dict[str, int]:
    """Every file and folder under ``root`` (and ``root`` itself) by relative path."""
    out = {".": _mode(root)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            out[str(p.relative_to(root))] = _mode(p)
    return out


def _not_private(root: Path) -> dict[str, str]:
    bad = {}
    for rel, mode in _all_modes(root).items():
        want = 0o700 if (root / rel).is_dir() else 0o600
        if mode != want:
            bad[rel] = oct(mode)
    return bad


def _corrupt(store: ChunkStore, key: bytes) -> None:
    path = store.payloads.path_for(key)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))  # rewriting in place keeps the file's mode


def _make_public(root: Path) -> None:
    """What a store written before files were private looks like (umask 022): files 0644,
    folders 0755, and a store.json without the marker."""
    doc = json.loads((root / STORE_FILENAME).read_text())
    doc.pop(PRIVATE_MARKER, None)
    (root / STORE_FILENAME).write_text(json.dumps(doc))
    for rel in _all_modes(root):
        p = root / rel
        os.chmod(p, 0o755 if p.is_dir() else 0o644)


def test_every_file_and_folder_a_store_writes_is_private(tmp_path, open_umask):
    root = tmp_path / "data"
    pages = chain_pages(TINY, list(range(TINY.page_size * 6)))
    with ChunkStore(root, TINY) as store:
        assert store.put(pages, kv_pages(TINY, 6)).ok
        _corrupt(store, pages[5].key)
        assert store.get(pages[5:]) == [None]  # quarantined
        assert len(list(store.payloads.quarantine_dir.iterdir())) == 1
        SettingsFile(root).write({"disk_size": 1e9})
        load_or_create_token(root / "admin-token")
        assert all(f.exists() for f in db_files(sqlite_url(root)))  # the WAL and its shared memory, while open
        assert _not_private(root) == {}
    assert _not_private(root) == {}
    with ChunkStore(root, TINY, reset_index=True) as store:  # `chunkstore rebuild` makes a new index
        assert rebuild(store).indexed == 5
        assert _not_private(root) == {}
    assert {"store.json", "LOCK", "index.db", "admin-settings.json", "admin-token", "chunks", "tmp",
            "quarantine"} <= set(_all_modes(root))


def test_a_temp_file_is_private_from_the_moment_it_exists(tmp_path, open_umask):
    started, release = threading.Event(), threading.Event()

    def segments():  # the file exists, half written, while this waits
        yield b"x" * 100
        started.set()
        release.wait(30)
        yield b"y" * 100

    with ChunkStore(tmp_path / "data", TINY) as store:
        writer = threading.Thread(target=store.payloads.stage, args=(b"\1" * 32, segments()))
        writer.start()
        try:
            assert started.wait(30)
            (temp,) = store.payloads.tmp_dir.iterdir()
            assert _mode(temp) == 0o600
        finally:
            release.set()
            writer.join(30)


def test_db_upgrade_creates_a_private_index(tmp_path, open_umask, capsys):
    root = tmp_path / "data"
    root.mkdir(mode=0o700)
    assert main(["db", "upgrade", "--disk-path", str(root)]) == 0
    assert _not_private(root) == {}
    assert (root / "index.db").is_file()


def test_an_existing_store_is_made_private_when_a_writer_opens_it(tmp_path, caplog):
    root = tmp_path / "data"
    pages = chain_pages(TINY, list(range(TINY.page_size * 4)))
    with ChunkStore(root, TINY) as store:
        assert store.put(pages, kv_pages(TINY, 4)).ok
        _corrupt(store, pages[3].key)
        assert store.get(pages[3:]) == [None]
        SettingsFile(root).write({"disk_size": 1e9})
    _make_public(root)
    before = _all_modes(root)
    assert _not_private(root) != {}

    with caplog.at_level(logging.WARNING, logger="chunkstore.disk.store"):
        with ChunkStore(root, TINY, read_only=True) as store:  # a reader may not chmod: it says so
            assert store.exists([pages[0].key]) == [True]
    assert _all_modes(root) == before
    assert "open to other users" in caplog.text

    with ChunkStore(root, TINY) as store:
        assert SettingsFile(root).read() == {"disk_size": 1e9}  # the API makes its own file private
        bad = _not_private(root)
    assert bad == {}
    assert json.loads((root / STORE_FILENAME).read_text())[PRIVATE_MARKER] is True
    # All of that still loads.
    with ChunkStore(root, TINY) as store:
        assert all(t is not None for t in store.get(pages[:3]))


def test_the_chunk_tree_is_walked_once_the_top_level_on_every_open(tmp_path):
    root = tmp_path / "data"
    pages = chain_pages(TINY, list(range(TINY.page_size * 2)))
    with ChunkStore(root, TINY) as store:
        assert store.put(pages, kv_pages(TINY, 2)).ok
        deep = store.payloads.path_for(pages[0].key)
    assert json.loads((root / STORE_FILENAME).read_text())[PRIVATE_MARKER] is True
    # Loosened after the walk (by hand: the store itself never creates such files again).
    top_level = [root, root / "chunks", root / "tmp", root / "quarantine"]
    for p in top_level:
        os.chmod(p, 0o755)
    for p in [root / STORE_FILENAME, root / "LOCK", root / "index.db"]:
        os.chmod(p, 0o644)
    os.chmod(deep, 0o644)
    with ChunkStore(root, TINY):
        pass
    assert [_mode(p) for p in top_level] == [0o700] * 4
    assert [_mode(root / n) for n in (STORE_FILENAME, "LOCK", "index.db")] == [0o600] * 3
    assert _mode(deep) == 0o644  # no second walk: opening a large store stays cheap
