"""Sealed chunks on a store's folder, tried as an attacker who can read and write the data folder
(a copied disk, a shared volume) but holds no seal key: nothing in a file or index row reveals a
prompt, names computed from a guessed prompt match nothing, and every forged, damaged, moved or
replayed chunk is a miss, quarantined, counted and logged as a security event, never served."""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import struct

import pytest
import torch

from chunkstore import ChunkStore, ModelIdentity, chain_pages
from chunkstore.disk import keyring as keyring_mod
from chunkstore.disk import maintenance
from chunkstore.disk.keyring import SEAL_META
from chunkstore.disk.payloads import PayloadsUnavailable
from chunkstore.disk.seal_keys import (ENV_KEY, EnvKeyProvider, FileKeyProvider, MasterKey, SealKeyError, key_text,
                                       seal_key_provider, write_key_file)
from chunkstore.disk.sealing import PREAMBLE_BYTES, SEAL_MAGIC, SEAL_OVERHEAD_BYTES, AuthenticationError, NamespaceKeys, open_sealed, seal
from chunkstore.testing.tensors import same_bytes
from tests.helpers import TINY, kv_pages
from tests.helpers.corruption import chunk_bytes

PROMPT = list(range(1000, 1000 + TINY.page_size * 6))  # ids whose bytes differ as u8, u16 and u32


@pytest.fixture
def key(tmp_path) -> FileKeyProvider:
    write_key_file(tmp_path / "seal.key")
    return FileKeyProvider(tmp_path / "seal.key")


@pytest.fixture
def sealed(tmp_path, key):
    """A sealed store holding PROMPT's six pages in namespace "tenant-a" and two of "tenant-b"."""
    store = ChunkStore(tmp_path / "store", TINY, seal_key=key)
    pages = chain_pages(TINY, PROMPT, namespace="tenant-a")
    tensors = kv_pages(TINY, len(pages), seed=1)
    assert store.put(pages, tensors).ok
    other = chain_pages(TINY, [7] * TINY.page_size * 2, namespace="tenant-b")
    assert store.put(other, kv_pages(TINY, 2, seed=2)).ok
    yield store, pages, tensors
    store.close()


def _files(root) -> list:
    return [p for p in root.rglob("*") if p.is_file() and p.name != "seal.key"]


def _chunk_file(store: ChunkStore, page):
    """The file that holds ``page`` (found with the key: the test's view, not the attacker's)."""
    (stored,) = store.sealing.stored_pages([page])
    return store.payloads.path_for(stored.key)


def _encodings(token_ids) -> list[bytes]:
    """The prompt as a reader would look for it: u8 (byte tokenizers), u16 and u32 little-endian."""
    out = [bytes(t & 0xFF for t in token_ids)]
    out += [struct.pack(f"<{len(token_ids)}{c}", *[t & mask for t in token_ids]) for c, mask in (("H", 0xFFFF),
                                                                                               ("I", 0xFFFFFFFF))]
    return out


# -- keys -----------------------------------------------------------------------------------------

def test_a_key_file_is_the_owners_alone_and_never_overwritten(tmp_path):
    path = tmp_path / "k"
    key = write_key_file(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert FileKeyProvider(path).master_key().secret == key.secret
    with pytest.raises(FileExistsError):
        write_key_file(path)
    assert FileKeyProvider(path).master_key().secret == key.secret  # untouched
    os.chmod(path, 0o640)
    with pytest.raises(SealKeyError, match="may be read by others.*chmod 600"):
        FileKeyProvider(path).master_key()
    with pytest.raises(SealKeyError, match="no seal key file"):
        FileKeyProvider(tmp_path / "absent").master_key()
    assert key.secret.hex() not in repr(key) and key.secret.hex() not in repr(FileKeyProvider(path))


def test_a_damaged_or_foreign_key_file_is_refused_with_what_is_wrong(tmp_path):
    text = key_text(MasterKey.generate())
    cases = {
        "not JSON": "garbage",
        "key id .* is not its secret": text.replace(text.split('"key_id": "')[1][:16], "0" * 16),
        "format version": text.replace('"version": 1', '"version": 2'),
        "not a chunkstore seal key": '{"format": "other"}',
    }
    for i, (why, body) in enumerate(cases.items()):
        path = tmp_path / f"k{i}"
        path.write_text(body)
        path.chmod(0o600)
        with pytest.raises(SealKeyError, match=why):
            FileKeyProvider(path).master_key()


def test_the_key_comes_from_the_flag_then_the_environment(tmp_path, monkeypatch, key):
    monkeypatch.delenv("CHUNKSTORE_SEAL_KEY_FILE", raising=False)
    monkeypatch.delenv(ENV_KEY, raising=False)
    assert seal_key_provider(None) is None
    assert seal_key_provider("") is None
    monkeypatch.setenv(ENV_KEY, key_text(key.master_key()))
    assert seal_key_provider(None) == EnvKeyProvider()
    assert EnvKeyProvider().master_key().key_id == key.master_key().key_id
    monkeypatch.setenv("CHUNKSTORE_SEAL_KEY_FILE", str(key.path))
    assert seal_key_provider(None) == FileKeyProvider(key.path)
    assert seal_key_provider(tmp_path / "x") == FileKeyProvider(tmp_path / "x")


# -- what a copy of the folder reveals --------------------------------------------------------------

def test_no_file_or_index_row_holds_a_prompt_and_guessed_names_match_nothing(tmp_path, sealed):
    store, pages, tensors = sealed
    store.flush()
    blobs = [p.read_bytes() for p in _files(tmp_path / "store")]
    for needle in _encodings(PROMPT[:TINY.page_size]) + _encodings([7] * TINY.page_size):
        assert not any(needle in blob for blob in blobs)
    # The public chain keys of the right guess name no file and no row.
    for guess in (chain_pages(TINY, PROMPT, namespace="tenant-a"), chain_pages(TINY, PROMPT)):
        for p in guess:
            assert not store.payloads.path_for(p.key).exists()
            assert p.key.hex() not in " ".join(str(f) for f in _files(tmp_path / "store"))
            assert not any(p.key in blob for blob in blobs)
        assert store.chunk_rows([p.key for p in guess]) == {}
    # Only the key's holder finds them.
    assert store.longest_prefix([p.key for p in pages], namespace="tenant-a") == len(pages)
    assert all(same_bytes(t, want) for t, want in zip(store.get(pages), tensors))
    assert store.stats().sealed


def test_a_sealed_stores_figures_count_what_it_sealed_opened_and_named(tmp_path, sealed):
    store, pages, tensors = sealed
    before = store.stats().sealing_work
    stored_bytes = store.stats().stored_bytes  # sealed payloads: each chunk file and 62 bytes of seal
    assert before.sealed_chunks == 8 and before.opened_chunks == 0
    assert before.sealed_bytes == stored_bytes - 8 * SEAL_OVERHEAD_BYTES
    assert before.seal_cpu_s > 0 and before.named_keys >= 16  # each page's key and its parent's
    assert all(same_bytes(t, want) for t, want in zip(store.get(pages), tensors))
    after = store.stats().sealing_work
    assert after.opened_chunks == len(pages) and after.open_cpu_s > 0
    assert after.opened_bytes == sum(r.stored_bytes for r in store.chunk_rows(
        [s.key for s in store.sealing.stored_pages(pages)]).values())
    assert after.name_cpu_s > before.name_cpu_s and after.sealed_chunks == 8
    with ChunkStore(tmp_path / "plain", TINY) as plain:  # a store without a key has nothing to count
        assert plain.put(pages, tensors).ok and plain.stats().sealing_work is None


def test_a_sealed_chunk_shows_only_magic_version_key_id_and_nonce(sealed):
    store, pages, _ = sealed
    data = _chunk_file(store, pages[0]).read_bytes()
    assert data.startswith(SEAL_MAGIC)
    key_id = bytes.fromhex(store.namespace_keys()[0].key_id)
    assert data[10:18] == key_id
    assert b"tenant-a" not in data and b"CSKVCHNK" not in data  # the namespace and the inner header are sealed


def test_a_chunk_opens_from_a_writable_read_buffer_and_a_flipped_bit_still_fails():
    """A load opens the chunk from its own writable read buffer (a memoryview, as a file's read
    gives it) on every release of cryptography the project allows (51 refuses an output that
    overlaps the input, so nothing may be decrypted where it lies): the chunk is the one a bytes
    payload opens to, the buffer keeps its ciphertext, and a damaged payload fails."""
    keys = NamespaceKeys.generate("tenant-a")
    name, binding = os.urandom(32), os.urandom(32)
    chunk = os.urandom(300_000)
    segments, size = seal(keys, name, binding, [chunk[:1000], chunk[1000:]])
    payload = b"".join(bytes(s) for s in segments)
    assert len(payload) == size
    assert bytes(open_sealed(keys, name, binding, payload)) == chunk
    buffer = bytearray(payload)
    assert bytes(open_sealed(keys, name, binding, memoryview(buffer))) == chunk
    assert bytes(buffer) == payload
    damaged = bytearray(payload)
    damaged[PREAMBLE_BYTES + 5000] ^= 1
    with pytest.raises(AuthenticationError):
        open_sealed(keys, name, binding, memoryview(damaged))


def test_a_chunk_sealed_in_one_call_or_in_streamed_segments_has_one_format():
    """The store seals a chunk file in one segment with one call; any other caller's segments are
    streamed. Both are the same layout (preamble, ciphertext, tag): each opens with the other's
    reader, and a payload moved under another name fails either way."""
    keys = NamespaceKeys.generate("tenant-a")
    name, binding = os.urandom(32), os.urandom(32)
    chunk = os.urandom(200_003)
    one, one_size = seal(keys, name, binding, [memoryview(chunk)])
    one_payload = b"".join(bytes(s) for s in one)  # (copied before the next seal reuses the buffer)
    streamed, streamed_size = seal(keys, name, binding, [chunk[:7], chunk[7:150_000], chunk[150_000:]])
    streamed_payload = b"".join(bytes(s) for s in streamed)
    assert one_size == streamed_size == len(chunk) + SEAL_OVERHEAD_BYTES == len(one_payload)
    assert one_payload[:PREAMBLE_BYTES - 28] == streamed_payload[:PREAMBLE_BYTES - 28]  # magic, version, key id
    for payload in (one_payload, streamed_payload):
        assert bytes(open_sealed(keys, name, binding, payload)) == chunk
        with pytest.raises(AuthenticationError):
            open_sealed(keys, os.urandom(32), binding, payload)


# -- forgeries --------------------------------------------------------------------------------------

def _forge(store, pages, tensors, victim: int, how: str) -> None:
    """Damage the victim's file as an attacker with write access (no key) could."""
    path = _chunk_file(store, pages[victim])
    data = path.read_bytes()
    v = pages[victim]
    if how == "reencoded":  # a valid, unsealed chunk of zeroed KV under the right chain key
        zeros = torch.zeros_like(tensors[victim])
        forged = chunk_bytes(store, v.key, v.parent_key, v.token_ids, v.namespace, zeros)
    elif how == "truncated":
        forged = data[: len(data) // 2]
    elif how == "zeroed":
        forged = data[:PREAMBLE_BYTES] + bytes(len(data) - PREAMBLE_BYTES)
    elif how == "bitflip":
        forged = data[:-20] + bytes([data[-20] ^ 1]) + data[-19:]
    elif how == "swapped":  # another page's sealed body, same namespace and key
        forged = _chunk_file(store, pages[(victim + 1) % len(pages)]).read_bytes()
    elif how == "other-namespace":  # the same page of another tenant, sealed under that tenant's key
        twin = chain_pages(TINY, PROMPT, namespace="tenant-b")
        assert store.put(twin, tensors).ok
        forged = _chunk_file(store, twin[victim]).read_bytes()
    else:
        raise AssertionError(how)
    path.chmod(0o600)
    path.write_bytes(forged)


@pytest.mark.parametrize("how", ["reencoded", "truncated", "zeroed", "bitflip", "swapped", "other-namespace",
                                 "other-model"])
def test_a_forged_chunk_is_a_miss_quarantined_and_a_security_event(tmp_path, key, sealed, how, caplog):
    store, pages, tensors = sealed
    if how == "other-model":  # the same tenant, prompt and master key, in another model's store
        other = ModelIdentity("another-model", "bfloat16", num_layers=2, num_kv_heads=2, head_dim=16, page_size=4)
        with ChunkStore(tmp_path / "other", other, seal_key=key) as other_store:
            twin = chain_pages(other, PROMPT, namespace="tenant-a")
            assert other_store.put(twin, tensors).ok
            body = _chunk_file(other_store, twin[2]).read_bytes()
        _chunk_file(store, pages[2]).write_bytes(body)
    else:
        _forge(store, pages, tensors, 2, how)
    before = store.stats()
    with caplog.at_level(logging.ERROR, logger="chunkstore.security"):
        got = store.get(pages)
        again = store.get([pages[2]])
    assert got[2] is None and again == [None]
    for i, (t, want) in enumerate(zip(got, tensors)):
        assert i == 2 or same_bytes(t, want)
    after = store.stats()
    assert after.auth_failures == before.auth_failures + 1
    assert after.quarantined == before.quarantined + 1
    assert store.longest_prefix([p.key for p in pages], namespace="tenant-a") == 2  # the prefix up to the hole
    security = [r for r in caplog.records if r.name == "chunkstore.security"]
    assert len(security) == 1 and "tenant-a" in security[0].getMessage()
    ns = {n.namespace: n for n in after.namespaces}
    assert ns["tenant-a"].auth_failures == 1 and ns["tenant-b"].auth_failures == 0


def test_security_events_are_logged_once_then_summarised(sealed, caplog):
    store, pages, tensors = sealed
    for victim in (1, 3, 5):
        path = _chunk_file(store, pages[victim])
        path.write_bytes(path.read_bytes()[:-1] + b"\0")
    with caplog.at_level(logging.ERROR, logger="chunkstore.security"):
        assert store.get(pages)[1] is None
        store.close()
    lines = [r.getMessage() for r in caplog.records if r.name == "chunkstore.security"]
    assert len(lines) == 2 and "2 more" in lines[1]  # the first at once, the rest in one summary
    assert store.stats().auth_failures == 3


def test_an_unsealed_chunk_in_a_sealed_store_is_never_read(tmp_path, key):
    """No downgrade: a chunk written by an unsealed store of the same model, copied in under a
    sealed name (the attacker can list names), is not served."""
    plain = ChunkStore(tmp_path / "plain", TINY)
    pages = chain_pages(TINY, PROMPT, namespace="tenant-a")
    tensors = kv_pages(TINY, len(pages))
    assert plain.put(pages, tensors).ok
    store = ChunkStore(tmp_path / "store", TINY, seal_key=key)
    assert store.put(pages, tensors).ok
    shutil.copyfile(plain.payloads.path_for(pages[0].key), _chunk_file(store, pages[0]))
    assert store.get(pages[:1]) == [None]
    assert store.stats().auth_failures == 1
    plain.close()
    store.close()


# -- opening ----------------------------------------------------------------------------------------

def test_opening_without_the_key_or_with_another_names_the_key_expected(tmp_path, sealed, key):
    store, _, _ = sealed
    expected = key.master_key().key_id
    store.close()
    with pytest.raises(SealKeyError, match=f"sealed \\(master key id {expected}\\).*--seal-key"):
        ChunkStore(tmp_path / "store", TINY)
    with pytest.raises(SealKeyError, match=f"sealed \\(master key id {expected}\\)"):
        ChunkStore(tmp_path / "store", TINY, read_only=True)
    write_key_file(tmp_path / "wrong.key")
    wrong = FileKeyProvider(tmp_path / "wrong.key").master_key().key_id
    with pytest.raises(SealKeyError, match=f"sealed with master key id {expected}; the key given .* is {wrong}"):
        ChunkStore(tmp_path / "store", TINY, seal_key=FileKeyProvider(tmp_path / "wrong.key"))
    with ChunkStore(tmp_path / "store", TINY, seal_key=key, read_only=True) as again:  # the right key reads
        assert again.num_chunks() == 8


def test_a_key_cannot_seal_a_store_that_holds_unsealed_chunks(tmp_path, key):
    pages = chain_pages(TINY, PROMPT)
    with ChunkStore(tmp_path / "store", TINY) as plain:
        assert plain.put(pages, kv_pages(TINY, len(pages))).ok
    with pytest.raises(SealKeyError, match="holds unsealed chunks"):
        ChunkStore(tmp_path / "store", TINY, seal_key=key)
    with ChunkStore(tmp_path / "store", TINY) as plain:  # still readable as it was
        assert plain.longest_prefix([p.key for p in pages]) == len(pages)


# -- the key's lifecycle ------------------------------------------------------------------------------

def test_rotating_the_master_key_rewraps_keys_and_rewrites_no_chunk(tmp_path, sealed, key):
    store, pages, tensors = sealed
    files = {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in _files(tmp_path / "store") if p.suffix == ".kv"}
    new = write_key_file(tmp_path / "new.key")
    done = store.rotate_seal_key(new)
    assert (done.namespaces, done.unopened, done.to_master_key_id) == (2, (), new.key_id)
    assert all(same_bytes(t, w) for t, w in zip(store.get(pages), tensors))  # this store goes on
    store.close()
    assert {p: (p.read_bytes(), p.stat().st_mtime_ns) for p in files} == files
    with pytest.raises(SealKeyError, match=f"sealed with master key id {new.key_id}"):
        ChunkStore(tmp_path / "store", TINY, seal_key=key)
    with ChunkStore(tmp_path / "store", TINY, seal_key=FileKeyProvider(tmp_path / "new.key")) as again:
        assert all(same_bytes(t, w) for t, w in zip(again.get(pages), tensors))
        assert {k.master_key_id for k in again.namespace_keys()} == {new.key_id}
        assert again._index.get_meta(SEAL_META) == new.key_id


def test_a_shredded_namespace_reads_nothing_even_from_an_old_copy(tmp_path, sealed, key):
    store, pages, tensors = sealed
    others = chain_pages(TINY, [7] * TINY.page_size * 2, namespace="tenant-b")
    old = {f.relative_to(tmp_path / "store"): f.read_bytes() for f in (tmp_path / "store").rglob("*.kv")}
    done = store.shred_namespace("tenant-a")
    assert done.key_destroyed and done.num_chunks == 6
    assert [k.namespace for k in store.namespace_keys()] == ["tenant-b"]
    assert store.get(pages) == [None] * 6
    assert all(t is not None for t in store.get(others))  # the other tenant is untouched
    # The tenant comes back: new keys, new names. The old files put back under the new names, or
    # under their own (then found by verify --repair), are never read.
    assert store.put(pages, tensors).ok
    old_bodies = [b for b in old.values()]
    for i, p in enumerate(pages):
        _chunk_file(store, p).write_bytes(old_bodies[i])
    assert store.get(pages) == [None] * 6
    for relative, body in old.items():
        path = tmp_path / "store" / relative
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(body)
    report = maintenance.verify(store, repair=True)
    assert report.adopted == 0 and report.quarantined == 6
    assert store.longest_prefix([p.key for p in pages], namespace="tenant-a") == 0
    assert store.stats().auth_failures >= 6


def test_a_rebuild_keeps_the_keys_and_indexes_what_opens(tmp_path, sealed, key):
    store, pages, tensors = sealed
    store.close()
    with ChunkStore(tmp_path / "store", TINY, seal_key=key, reset_index=True) as again:
        report = maintenance.rebuild(again)
        assert (report.indexed, report.quarantined) == (8, 0)
        assert again.longest_prefix([p.key for p in pages], namespace="tenant-a") == 6
        assert all(same_bytes(t, w) for t, w in zip(again.get(pages), tensors))
        assert maintenance.verify(again).damage == 0


# -- a database writer's key rows -------------------------------------------------------------------

def _index(tmp_path):
    return sqlite3.connect(tmp_path / "store" / "index.db")


def test_an_altered_or_forged_key_row_is_a_miss_and_a_failed_write_never_an_error(tmp_path, sealed, caplog):
    store, pages, tensors = sealed
    store.close()
    with _index(tmp_path) as db:  # a byte of tenant-a's wrapped keys flipped; a junk row for tenant-c
        (wrapped,) = db.execute("SELECT wrapped FROM seal_keys WHERE namespace = 'tenant-a'").fetchone()
        db.execute("UPDATE seal_keys SET wrapped = ? WHERE namespace = 'tenant-a'",
                   (bytes([wrapped[0] ^ 1]) + bytes(wrapped[1:]),))
        db.execute("INSERT INTO seal_keys VALUES ('tenant-c', ?, ?, ?, 0)",
                   (b"\1" * 8, store.sealing.master_key_id, b"\0" * 76))
    with ChunkStore(tmp_path / "store", TINY, seal_key=FileKeyProvider(tmp_path / "seal.key")) as again, \
            caplog.at_level(logging.ERROR, logger="chunkstore.disk.keyring"):
        keys = [p.key for p in pages]
        assert again.exists(keys, "tenant-a") == [False] * 6 and again.longest_prefix(keys, "tenant-a") == 0
        assert again.get(pages) == [None] * 6
        for ns in ("tenant-a", "tenant-c"):
            result = again.put(chain_pages(TINY, PROMPT, namespace=ns), tensors)
            assert len(result.failed) == 6 and "no usable seal key" in next(iter(result.failed.values()))
        b = chain_pages(TINY, [7] * TINY.page_size * 2, namespace="tenant-b")
        assert all(t is not None for t in again.get(b))  # the other tenant is untouched
        done = again.rotate_seal_key(write_key_file(tmp_path / "new.key"))  # rows that do not open are named
        assert done.namespaces == 1 and done.unopened == ("tenant-a", "tenant-c")
    assert any("tenant-a" in r.getMessage() and "cannot be used" in r.getMessage() for r in caplog.records)


def test_a_server_left_on_a_rotated_key_keeps_the_keys_it_opened(tmp_path, sealed, key, monkeypatch):
    store, pages, tensors = sealed
    other = ChunkStore(tmp_path / "store", TINY, seal_key=key, read_only=True)  # a second server
    assert all(t is not None for t in other.get(pages))
    store.rotate_seal_key(write_key_file(tmp_path / "new.key"))
    monkeypatch.setattr(keyring_mod, "KEY_RECHECK_S", 0.0)  # every lookup goes to the index again
    assert all(same_bytes(t, w) for t, w in zip(other.get(pages), tensors))
    b = chain_pages(TINY, [7] * TINY.page_size * 2, namespace="tenant-b")
    assert other.get(b) == [None, None]  # a namespace it never opened: a miss until it restarts with the new key
    with pytest.raises(PayloadsUnavailable, match="could not be read"):  # nothing concluded of its chunks:
        maintenance.verify(other)  # a verify stops, it does not call them forged
    other.close()
    assert store.stats().quarantined == 0


def test_keys_found_by_their_id_are_looked_up_again_after_a_shred_elsewhere(tmp_path, sealed, key, monkeypatch):
    """A second server that opened a tenant's chunks by key id (a verify) does not keep opening
    them, or adopt their old files, once another process shredded the tenant."""
    store, pages, tensors = sealed
    old = {f.relative_to(tmp_path / "store"): f.read_bytes() for f in (tmp_path / "store").rglob("*.kv")}
    second = ChunkStore(tmp_path / "store", TINY, seal_key=key, read_only=True)
    assert maintenance.verify(second).ok == 8  # opens every chunk, by the keys of its row's namespace
    names = [p.key for p in second.sealing.stored_pages(pages)]
    assert second.verify_file(names[0]).is_ok  # by the chunk's key id alone
    store.shred_namespace("tenant-a")
    for relative, body in old.items():  # the old files put back
        (tmp_path / "store" / relative).write_bytes(body)
    monkeypatch.setattr(keyring_mod, "KEY_RECHECK_S", 0.0)
    assert second.verify_file(names[0]).is_unauthentic
    second.close()
    report = maintenance.verify(store, repair=True)
    assert report.adopted == 0 and report.quarantined == 6


def test_a_store_whose_index_holds_seal_keys_never_opens_without_a_key(tmp_path, sealed):
    store, _, _ = sealed
    store.close()
    with _index(tmp_path) as db:  # the marker deleted by a database writer
        db.execute("DELETE FROM store_meta WHERE name = ?", (SEAL_META,))
    with pytest.raises(SealKeyError, match="holds seal keys but no seal marker"):
        ChunkStore(tmp_path / "store", TINY)
