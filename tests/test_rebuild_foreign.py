"""`chunkstore rebuild` over a store.json that is not its chunks' own (copied from another model's
store): the rebuild refuses, naming both models, and nothing is moved, indexed or lost; `--force`
rebuilds as before (indexing what verifies under store.json's model, quarantining the rest).
Real stores in tmp_path, the real CLI; a sealed store's chunks are judged with its keys."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import pytest

from chunkstore import ChunkStore, ModelIdentity, chain_pages
from chunkstore.cli import main
from chunkstore.disk.chunk_owner import ForeignChunksError, judge
from chunkstore.disk.files import ChunkFiles
from chunkstore.disk.index import db_files, sqlite_url
from chunkstore.disk.keys import engine_pages
from chunkstore.disk.maintenance import rebuild
from chunkstore.disk.seal_keys import FileKeyProvider, write_key_file
from chunkstore.testing.tensors import same_bytes
from tests.helpers import TINY, kv_pages

SAME_SHAPE = dataclasses.replace(TINY, model_id="tiny-other")  # only the root keys differ
OTHER_SHAPE = dataclasses.replace(TINY, model_id="tiny-wide", num_layers=3)  # pages of another shape


def _fill(root: Path, identity: ModelIdentity, num_pages: int = 6, **kw) -> list:
    """A store of ``identity`` holding a chain of ``num_pages`` pages and two pages of namespace
    "other"; returns the pages."""
    pages = chain_pages(identity, list(range(identity.page_size * num_pages)))
    other = chain_pages(identity, list(range(500, 500 + identity.page_size * 2)), namespace="other")
    with ChunkStore(root, identity, **kw) as s:
        assert s.put(pages + other, kv_pages(identity, num_pages + 2, seed=7)).ok
    return pages + other


def _files(root: Path, folder: str) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in (root / folder).rglob("*") if p.is_file()}


def _lose_index(root: Path) -> None:
    for f in db_files(sqlite_url(root)):
        f.unlink(missing_ok=True)


def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _swap_store_json(tmp_path: Path, identity: ModelIdentity) -> tuple[Path, bytes]:
    """The store of TINY at tmp_path/"a", its store.json replaced by that of a store of
    ``identity``; returns its folder and its own store.json."""
    root = tmp_path / "a"
    own = (root / "store.json").read_bytes()
    _fill(tmp_path / "b", identity)
    shutil.copyfile(tmp_path / "b" / "store.json", root / "store.json")
    return root, own


@pytest.mark.parametrize("index", ["kept", "lost"])
@pytest.mark.parametrize("other", [SAME_SHAPE, OTHER_SHAPE], ids=["same-shape", "other-shape"])
def test_rebuild_refuses_another_models_store_json_and_changes_nothing(tmp_path, capsys, other, index):
    pages = _fill(tmp_path / "a", TINY)
    root, own = _swap_store_json(tmp_path, other)
    if index == "lost":
        _lose_index(root)
    chunks, index_files = _files(root, "chunks"), {f: f.read_bytes() for f in db_files(sqlite_url(root))
                                                     if f.exists()}
    code, out, err = _cli(capsys, "rebuild", "--disk-path", str(root))
    assert code == 2 and out == "", err
    assert err.startswith("chunkstore: error: refusing to rebuild") and "Traceback" not in err
    assert "these chunks were written by" in err and f"not by model {other.model_id!r}" in err
    assert "--force" in err
    if index == "kept":  # the old index still says whose they are
        assert f"written by model {TINY.model_id!r}" in err
    elif other is OTHER_SHAPE:  # else their page shape does
        assert f"of shape {TINY.page_shape}" in err
    assert _files(root, "chunks") == chunks and _files(root, "quarantine") == {}
    assert {f: f.read_bytes() for f in db_files(sqlite_url(root)) if f.exists()} == index_files
    (root / "store.json").write_bytes(own)  # put back: everything is where it was
    if index == "lost":
        assert _cli(capsys, "rebuild", "--disk-path", str(root))[0] == 0
    with ChunkStore(root, TINY, read_only=True) as s:
        assert s.num_chunks() == len(pages)
        assert all(t is not None for t in s.get(pages))


@pytest.mark.parametrize("other, indexed", [(SAME_SHAPE, 8), (OTHER_SHAPE, 0)], ids=["same-shape", "other-shape"])
def test_force_rebuilds_as_before(tmp_path, capsys, other, indexed):
    _fill(tmp_path / "a", TINY)
    root, _ = _swap_store_json(tmp_path, other)
    chunks = _files(root, "chunks")
    code, out, err = _cli(capsys, "rebuild", "--disk-path", str(root), "--force", "--json")
    assert code == 0, err
    assert json.loads(out) == {"scanned": 8, "indexed": indexed, "quarantined": 8 - indexed}
    assert len(_files(root, "quarantine")) == 8 - indexed
    assert len(_files(root, "chunks")) == len(chunks) - (8 - indexed)


def test_a_long_chain_is_followed_to_its_first_page(tmp_path, capsys):
    _fill(tmp_path / "a", TINY, num_pages=64)
    root, _ = _swap_store_json(tmp_path, SAME_SHAPE)
    _lose_index(root)
    assert _cli(capsys, "rebuild", "--disk-path", str(root))[0] == 2
    with ChunkStore(tmp_path / "b", SAME_SHAPE) as s:  # the judging itself: bounded reads, the sample's verdicts
        ownership = judge(s.payloads, TINY, max_reads=4096)
        assert ownership.is_foreign and ownership.matching == 0 and ownership.judged == 8
        assert judge(s.payloads, TINY, max_reads=0).judged == 0  # nothing read: nothing known, no refusal
    ownership = judge(ChunkFiles(root), TINY)
    assert not ownership.is_foreign and ownership.matching == 1  # a chunk of its own ends the sample


def test_one_chunk_of_store_jsons_model_is_enough(tmp_path, capsys):
    """A store shared by two models (allow_other_models) rebuilds: some chunks are its own."""
    pages = _fill(tmp_path / "a", TINY)
    others = chain_pages(SAME_SHAPE, list(range(900, 900 + TINY.page_size * 20)))
    with ChunkStore(tmp_path / "a", SAME_SHAPE, allow_other_models=True) as s:
        assert s.put(others, kv_pages(TINY, 20)).ok
    _lose_index(tmp_path / "a")
    code, out, err = _cli(capsys, "rebuild", "--disk-path", str(tmp_path / "a"), "--json")
    assert code == 0, err
    assert json.loads(out)["indexed"] == len(pages) + len(others)


def test_the_store_refuses_in_rebuild_too_before_it_indexes_or_quarantines(tmp_path):
    """Library callers (the management API's rebuild job) get the same refusal from rebuild itself."""
    _fill(tmp_path / "a", TINY)
    root, _ = _swap_store_json(tmp_path, OTHER_SHAPE)
    chunks = _files(root, "chunks")
    with ChunkStore(root, OTHER_SHAPE, reset_index=True) as s:
        with pytest.raises(ForeignChunksError, match=f"not by model {OTHER_SHAPE.model_id!r}"):
            rebuild(s)
        assert s.num_chunks() == 0
        assert _files(root, "chunks") == chunks and _files(root, "quarantine") == {}
        assert rebuild(s, force=True).quarantined == 8


def test_engine_keyed_stores_are_told_apart_too(tmp_path, capsys):
    a = ModelIdentity("sglang:a", "bfloat16", num_layers=2, num_kv_heads=2, head_dim=16, page_size=4,
                      key_scheme="engine")
    b = dataclasses.replace(a, model_id="sglang:b")
    for root, identity in ((tmp_path / "a", a), (tmp_path / "b", b)):
        with ChunkStore(root, identity) as s:
            assert s.put(engine_pages(identity, [bytes([i]) * 32 for i in range(5)]), kv_pages(identity, 5)).ok
    shutil.copyfile(tmp_path / "b" / "store.json", tmp_path / "a" / "store.json")
    code, _, err = _cli(capsys, "rebuild", "--disk-path", str(tmp_path / "a"))
    assert code == 2 and "'sglang:a'" in err and "'sglang:b'" in err


def test_a_sealed_store_is_judged_with_its_keys_and_nothing_is_quarantined(tmp_path, capsys):
    write_key_file(tmp_path / "seal.key")
    key = str(tmp_path / "seal.key")
    pages = _fill(tmp_path / "a", TINY, seal_key=FileKeyProvider(Path(key)))
    root, own = _swap_store_json(tmp_path, SAME_SHAPE)
    chunks = _files(root, "chunks")
    code, _, err = _cli(capsys, "rebuild", "--disk-path", str(root), "--seal-key", key)
    assert code == 2, err
    assert f"written by model {TINY.model_id!r}" in err and f"not by model {SAME_SHAPE.model_id!r}" in err
    assert _files(root, "chunks") == chunks and _files(root, "quarantine") == {}
    (root / "store.json").write_bytes(own)  # the keys were kept: the right store.json rebuilds it all
    code, out, err = _cli(capsys, "rebuild", "--disk-path", str(root), "--seal-key", key, "--json")
    assert code == 0 and json.loads(out)["indexed"] == len(pages), err
    with ChunkStore(root, TINY, read_only=True, seal_key=FileKeyProvider(Path(key))) as s:
        want = kv_pages(TINY, len(pages), seed=7)
        assert all(same_bytes(t, w) for t, w in zip(s.get(pages), want))
