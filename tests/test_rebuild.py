"""Index loss and repair on real stores: the chunk files alone are the truth.

A lost or corrupt index makes the CLI fail with a clear message pointing at `rebuild`; rebuild
restores exactly the valid chunks (corrupt ones go to quarantine/); verify --repair adopts files
without a row, drops rows without a file, and removes leftover temp files, as gc and open do.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from chunkstore import ChunkStore, chain_pages
from chunkstore.cli import main
from chunkstore.disk.index import ChunkIndex, db_files, sqlite_url
from chunkstore.disk.keys import PageRef
from chunkstore.disk.maintenance import gc, rebuild, verify
from chunkstore.testing.tensors import same_bytes
from tests.helpers import TINY, kv_pages


@pytest.fixture
def saved(tmp_path) -> tuple[Path, list[PageRef], list[torch.Tensor]]:
    """A closed store of 8 + 3 chunks in two namespaces, with its WAL not checkpointed."""
    root = tmp_path / "store"
    pages = chain_pages(TINY, list(range(TINY.page_size * 8)))
    other = chain_pages(TINY, list(range(100, 100 + TINY.page_size * 3)), namespace="other")
    tensors = kv_pages(TINY, 8, seed=3) + kv_pages(TINY, 3, seed=4)
    with ChunkStore(root, TINY) as s:
        assert s.put(pages, tensors[:8]).ok and s.put(other, tensors[8:]).ok
    return root, pages + other, tensors


def _drop_rows(root: Path, keys: list[bytes]) -> int:
    """Delete index rows and leave their files (a crash between publish and row commit), through an
    index of the test's own on the store's file."""
    index = ChunkIndex(sqlite_url(root))
    try:
        return index.delete(keys)
    finally:
        index.close()


def _keys_in_index(root: Path) -> set[bytes]:
    with ChunkStore(root, TINY, read_only=True) as s:
        return {r.key for r in s.iter_rows()}


def _assert_all_load(root: Path, pages: list[PageRef], tensors: list[torch.Tensor]) -> None:
    with ChunkStore(root, TINY, read_only=True) as s:
        got = s.get(pages)
    for p, t, want in zip(pages, got, tensors):
        assert t is not None and same_bytes(t, want), p.key.hex()


def _lose_index(root: Path, how: str) -> None:
    for f in db_files(sqlite_url(root)):
        if how == "deleted":
            f.unlink(missing_ok=True)
        else:
            f.write_bytes(os.urandom(8192))


def _chunk_path(root: Path, key: bytes) -> Path:
    h = key.hex()
    return root / "chunks" / h[:2] / h[2:4] / (h + ".kv")


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# -- a lost or corrupt index ------------------------------------------------------------------

@pytest.mark.parametrize("how", ["deleted", "garbage"])
def test_stats_fails_cleanly_without_a_usable_index(saved, capsys, how):
    root, _, _ = saved
    _lose_index(root, how)
    code, out, err = _cli(capsys, "stats", "--disk-path", str(root))
    assert code == 2
    assert err.startswith("chunkstore: error:") and "Traceback" not in err
    assert out == ""


def test_stats_with_a_garbage_index_suggests_rebuild(saved, capsys):
    root, _, _ = saved
    _lose_index(root, "garbage")
    code, _, err = _cli(capsys, "stats", "--disk-path", str(root))
    assert code == 2 and f"chunkstore rebuild --disk-path {root}" in err


def test_stats_with_a_deleted_index_suggests_rebuild(saved, capsys):
    root, _, _ = saved
    _lose_index(root, "deleted")
    code, _, err = _cli(capsys, "stats", "--disk-path", str(root))
    assert code == 2 and "rebuild" in err and "db upgrade" not in err


def test_read_only_open_does_not_create_an_index(saved, capsys):
    root, _, _ = saved
    _lose_index(root, "deleted")
    _cli(capsys, "stats", "--disk-path", str(root))
    assert [f for f in db_files(sqlite_url(root)) if f.exists()] == []


def _damage_two(root: Path, pages: list[PageRef]) -> set[bytes]:
    """A payload bit flip in one chunk and another chunk's file copied over a third: the damaged
    keys (the copied-from chunk stays valid)."""
    flipped = _chunk_path(root, pages[2].key)
    data = bytearray(flipped.read_bytes())
    data[-3] ^= 0x01
    flipped.write_bytes(bytes(data))
    shutil.copyfile(_chunk_path(root, pages[9].key), _chunk_path(root, pages[5].key))
    return {pages[2].key, pages[5].key}


@pytest.mark.parametrize("how", ["deleted", "garbage"])
def test_cli_rebuild_restores_exactly_the_valid_chunks(saved, capsys, how):
    root, pages, tensors = saved
    before = _keys_in_index(root)
    assert before == {p.key for p in pages}
    bad = _damage_two(root, pages)
    _lose_index(root, how)
    code, out, err = _cli(capsys, "rebuild", "--disk-path", str(root), "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report == {"scanned": 11, "indexed": 9, "quarantined": 2}
    assert _keys_in_index(root) == before - bad
    good = [(p, t) for p, t in zip(pages, tensors) if p.key not in bad]
    _assert_all_load(root, [p for p, _ in good], [t for _, t in good])
    quarantined = sorted(p.name[:64] for p in (root / "quarantine").iterdir())
    assert quarantined == sorted(k.hex() for k in bad)
    assert not any(_chunk_path(root, k).exists() for k in bad)
    code, out, _ = _cli(capsys, "stats", "--disk-path", str(root), "--json")
    doc = json.loads(out)
    assert code == 0 and doc["num_chunks"] == 9
    assert {n["namespace"]: n["num_chunks"] for n in doc["namespaces"]} == {"default": 6, "other": 3}
    code, out, _ = _cli(capsys, "verify", "--disk-path", str(root), "--json")
    assert code == 0 and json.loads(out)["ok"] == 9


def test_rebuild_via_maintenance(saved):
    root, pages, tensors = saved
    _lose_index(root, "garbage")
    with ChunkStore(root, TINY, reset_index=True) as s:
        report = rebuild(s)
        assert (report.scanned, report.indexed, report.quarantined) == (11, 11, 0)
        assert {r.key for r in s.iter_rows()} == {p.key for p in pages}
        rows = s.chunk_rows([p.key for p in pages])
        assert all(rows[p.key].parent_key == p.parent_key and rows[p.key].namespace == p.namespace
                   for p in pages)
        assert s.longest_prefix([p.key for p in pages[:8]]) == 8
    _assert_all_load(root, pages, tensors)


def test_rebuild_twice_is_a_no_op(saved):
    root, pages, tensors = saved
    for _ in range(2):
        with ChunkStore(root, TINY, reset_index=True) as s:
            assert rebuild(s).indexed == 11
    _assert_all_load(root, pages, tensors)


# -- verify --repair, gc, open ----------------------------------------------------------------

def test_file_without_a_row_is_adopted_by_repair(saved, capsys):
    root, pages, tensors = saved
    with ChunkStore(root, TINY) as s:  # as if the process died between publish and row insert
        assert _drop_rows(root, [pages[7].key, pages[10].key]) == 2
        assert s.exists([pages[7].key, pages[10].key]) == [False, False]
        assert s.get([pages[7]]) == [None]  # invisible, and the file is left alone
        assert _chunk_path(root, pages[7].key).exists()
        report = verify(s)  # without --repair orphans are reported, and nothing is adopted or changed
        assert (report.orphans, report.adopted, report.damage) == (2, 0, 2)
        assert s.exists([pages[7].key]) == [False]
    code, out, _ = _cli(capsys, "verify", "--repair", "--disk-path", str(root), "--json")
    report = json.loads(out)
    assert code == 0 and (report["orphans"], report["adopted"], report["quarantined"]) == (2, 2, 0)
    assert _keys_in_index(root) == {p.key for p in pages}
    _assert_all_load(root, pages, tensors)
    with ChunkStore(root, TINY) as s:
        assert s.chunk_rows([pages[10].key])[pages[10].key].namespace == "other"
        assert s.stats().num_chunks == 11


def test_orphan_that_fails_verification_is_quarantined_by_repair(saved):
    root, pages, _ = saved
    with ChunkStore(root, TINY) as s:
        _drop_rows(root, [pages[4].key])
        _chunk_path(root, pages[4].key).write_bytes(b"not a chunk")
        report = verify(s, repair=True)
        assert (report.orphans, report.adopted, report.quarantined) == (1, 0, 1)
        assert not _chunk_path(root, pages[4].key).exists()
        assert s.exists([pages[4].key]) == [False]


def test_row_without_a_file_is_reported_then_dropped(saved, capsys):
    root, pages, tensors = saved
    _chunk_path(root, pages[3].key).unlink()
    code, out, _ = _cli(capsys, "verify", "--disk-path", str(root), "--json")
    report = json.loads(out)
    assert code == 1 and (report["missing"], report["rows_dropped"]) == (1, 0)
    assert pages[3].key in _keys_in_index(root)  # reported, not changed
    with ChunkStore(root, TINY) as s:
        report = verify(s, repair=True)
        assert (report.missing, report.rows_dropped) == (1, 1)
        assert s.exists([pages[3].key]) == [False]
        assert s.longest_prefix([p.key for p in pages[:8]]) == 3
        clean = verify(s)
        assert (clean.checked, clean.ok, clean.missing) == (10, 10, 0)
    rest = [(p, t) for i, (p, t) in enumerate(zip(pages, tensors)) if i != 3]
    _assert_all_load(root, [p for p, _ in rest], [t for _, t in rest])


def test_row_without_a_file_is_dropped_on_get(saved):
    root, pages, _ = saved
    _chunk_path(root, pages[3].key).unlink()
    with ChunkStore(root, TINY) as s:
        assert s.exists([pages[3].key]) == [True]
        assert s.get([pages[3]]) == [None]
        assert s.exists([pages[3].key]) == [False]
        assert s.stats().quarantined == 0


def _leave_temps(root: Path, n: int = 3) -> list[Path]:
    temps = [root / "tmp" / f"tmp-{os.urandom(32).hex()}-{99999 + i}-1" for i in range(n)]
    for t in temps:
        t.write_bytes(b"half a chunk")
    return temps


def test_leftover_temps_are_removed_by_repair_gc_and_open(saved):
    root, pages, tensors = saved
    keep = root / "tmp" / "not-a-temp-file"
    keep.write_bytes(b"x")
    with ChunkStore(root, TINY) as s:
        temps = _leave_temps(root)
        assert len(s.payloads.leftovers()) == 3
        assert verify(s).temps_removed == 0 and all(t.exists() for t in temps)  # no repair: untouched
        assert verify(s, repair=True).temps_removed == 3
        assert not any(t.exists() for t in temps)
        temps = _leave_temps(root, 2)
        assert gc(s).temps_removed == 2
        assert not any(t.exists() for t in temps)
        temps = _leave_temps(root, 4)
    with ChunkStore(root, TINY) as s:
        assert len(s.payloads.leftovers()) == 0
        assert not any(t.exists() for t in temps)
    assert keep.exists()  # only our temp files are removed
    _assert_all_load(root, pages, tensors)


def test_cli_gc_removes_temps(saved, capsys):
    root, _, _ = saved
    _leave_temps(root, 2)
    code, out, _ = _cli(capsys, "gc", "--disk-path", str(root), "--json")
    # opening for writing already removed them, so gc itself finds none
    assert code == 0 and json.loads(out)["temps_removed"] == 0
    assert list((root / "tmp").iterdir()) == []
