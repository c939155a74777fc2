"""`chunkstore keys` and `--seal-key` on the store commands, run in-process: a new key, a sealed
store's stats and verify, the refusals that name the key expected, rotation and shredding."""

from __future__ import annotations

import json
import os

import pytest

from chunkstore import ChunkStore, chain_pages
from chunkstore.cli import main
from chunkstore.disk import FileKeyProvider
from tests.helpers import TINY, kv_pages


def run(capsys, *argv: str) -> tuple[int, dict | str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    try:
        return code, json.loads(out.out), out.err
    except ValueError:
        return code, out.out, out.err


@pytest.fixture
def sealed(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("CHUNKSTORE_SEAL_KEY_FILE", raising=False)
    monkeypatch.delenv("CHUNKSTORE_SEAL_KEY", raising=False)
    key = tmp_path / "seal.key"
    code, doc, _ = run(capsys, "keys", "new", str(key), "--json")
    assert code == 0 and doc["key_id"] == FileKeyProvider(key).master_key().key_id
    root = tmp_path / "store"
    with ChunkStore(root, TINY, seal_key=FileKeyProvider(key)) as store:
        for ns in ("a", "b"):
            pages = chain_pages(TINY, list(range(TINY.page_size * 3)), namespace=ns)
            assert store.put(pages, kv_pages(TINY, 3)).ok
    return root, key, doc["key_id"]


def test_keys_new_writes_a_private_file_and_never_overwrites(tmp_path, capsys):
    path = tmp_path / "k"
    code, out, _ = run(capsys, "keys", "new", str(path))
    assert code == 0 and "wrote seal key" in out and os.stat(path).st_mode & 0o777 == 0o600
    before = path.read_bytes()
    code, _, err = run(capsys, "keys", "new", str(path))
    assert code == 2 and "never overwritten" in err and path.read_bytes() == before


def test_store_commands_take_the_key_and_name_it_when_it_is_missing_or_wrong(tmp_path, capsys, sealed):
    root, key, key_id = sealed
    code, _, err = run(capsys, "stats", "--disk-path", str(root))
    assert code == 2 and f"sealed (master key id {key_id})" in err and "Traceback" not in err
    main(["keys", "new", str(tmp_path / "other.key")])
    capsys.readouterr()
    code, _, err = run(capsys, "verify", "--disk-path", str(root), "--seal-key", str(tmp_path / "other.key"))
    assert code == 2 and f"sealed with master key id {key_id}" in err
    code, doc, _ = run(capsys, "stats", "--disk-path", str(root), "--seal-key", str(key), "--json")
    assert code == 0 and doc["sealed"] and doc["num_chunks"] == 6 and doc["auth_failures"] == 0
    code, doc, _ = run(capsys, "verify", "--disk-path", str(root), "--seal-key", str(key), "--json")
    assert code == 0 and doc["ok"] == 6
    os.environ["CHUNKSTORE_SEAL_KEY_FILE"] = str(key)  # the variable stands for the flag
    try:
        code, doc, _ = run(capsys, "keys", "list", "--disk-path", str(root), "--json")
    finally:
        del os.environ["CHUNKSTORE_SEAL_KEY_FILE"]
    assert code == 0 and doc["master_key_id"] == key_id
    assert [n["namespace"] for n in doc["namespaces"]] == ["a", "b"]


def test_rotate_then_shred(tmp_path, capsys, sealed):
    root, key, key_id = sealed
    new = tmp_path / "new.key"
    main(["keys", "new", str(new)])
    capsys.readouterr()
    code, doc, _ = run(capsys, "keys", "rotate", "--disk-path", str(root), "--seal-key", str(key),
                       "--new-seal-key", str(new), "--json")
    assert code == 0 and doc["namespaces"] == 2 and doc["from_master_key_id"] == key_id
    code, _, err = run(capsys, "stats", "--disk-path", str(root), "--seal-key", str(key))
    assert code == 2 and "sealed with master key id" in err
    code, doc, _ = run(capsys, "keys", "shred", "--disk-path", str(root), "--seal-key", str(new), "--namespace", "a",
                       "--json")
    assert code == 0 and doc["key_destroyed"] and doc["num_chunks"] == 3
    code, doc, _ = run(capsys, "keys", "list", "--disk-path", str(root), "--seal-key", str(new), "--json")
    assert [n["namespace"] for n in doc["namespaces"]] == ["b"]
    code, _, err = run(capsys, "keys", "shred", "--disk-path", str(root), "--namespace", "b")
    assert code == 2 and "needs the store's key" in err


def test_shred_refuses_an_unsealed_store(tmp_path, capsys):
    root = tmp_path / "plain"
    with ChunkStore(root, TINY) as store:
        assert store.put(chain_pages(TINY, list(range(8))), kv_pages(TINY, 2)).ok
    main(["keys", "new", str(tmp_path / "k")])
    capsys.readouterr()
    code, _, err = run(capsys, "keys", "shred", "--disk-path", str(root), "--seal-key", str(tmp_path / "k"),
                       "--namespace", "default")
    assert code == 2 and "holds unsealed chunks" in err
