"""The management API over a sealed store: DELETE /namespaces/{ns}?shred=true crypto-shreds one
tenant and leaves the others, the figures show the store sealed and its authentication failures,
and a database writer who moves a chunk's row into another tenant's namespace shows that tenant
nothing of the chunk."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator

import pytest

from chunkstore import ChunkStore, chain_pages
from chunkstore.api import StoreBackend
from chunkstore.disk import FileKeyProvider, write_key_file
from tests.helpers import TINY, kv_pages
from tests.helpers.api import TENANT, Served, decode_tokens, served_store


@pytest.fixture
def sealed_server(tmp_path) -> Iterator[Served]:
    write_key_file(tmp_path / "seal.key")
    key = FileKeyProvider(tmp_path / "seal.key")
    root = tmp_path / "store"
    pages = chain_pages(TINY, list(range(100, 100 + TINY.page_size * 4)))
    other = chain_pages(TINY, list(range(TINY.page_size * 2)), namespace="other")
    with ChunkStore(root, TINY, seal_key=key) as s:
        assert s.put(pages, kv_pages(TINY, 4)).ok and s.put(other, kv_pages(TINY, 2, seed=1)).ok
    with served_store(StoreBackend(root, seal_key=key, decode=decode_tokens), root, pages, other) as served:
        yield served


def _stored_name(served: Served, page) -> str:
    with served.backend.using_store() as store:
        return store.sealing.stored_pages([page])[0].key.hex()


def test_a_sealed_stores_figures_and_its_chunks_for_their_own_tenant(sealed_server):
    name = _stored_name(sealed_server, sealed_server.other[0])
    with sealed_server.client() as c:
        disk = c.get("/stats").json()["disk"]
        assert disk["sealed"] and disk["auth_failures"] == 0 and disk["num_chunks"] == 6
        metrics = c.get("/metrics").text
        assert "chunkstore_disk_sealed 1.0" in metrics
    with sealed_server.backend.using_store() as store:  # the server's own store, in this process
        assert store.get(sealed_server.pages[:2]) != [None, None]
    with sealed_server.client() as c:
        work = c.get("/stats").json()["disk"]["sealing_work"]
        assert work["opened_chunks"] == 2 and work["opened_bytes"] > 0 and work["open_cpu_s"] > 0
        assert work["sealed_chunks"] == 0  # the chunks were sealed by another process
        metrics = c.get("/metrics").text
        assert "chunkstore_disk_opened_bytes_total" in metrics and "chunkstore_disk_open_cpu_seconds_total" in metrics
    with sealed_server.client(TENANT) as c:
        detail = c.get(f"/chunks/{name}").json()
        assert detail["file"]["status"] == "ok" and detail["token_ids"] == list(range(TINY.page_size))


def test_a_row_moved_into_another_namespace_shows_that_tenant_nothing(sealed_server):
    """A database writer moves a chunk of `default` into `other`, whose token they hold."""
    name = _stored_name(sealed_server, sealed_server.pages[0])
    with sqlite3.connect(sealed_server.root / "index.db") as db:
        db.execute("UPDATE chunks SET namespace = 'other' WHERE key = ?", (bytes.fromhex(name),))
    with sealed_server.client(TENANT) as c:
        detail = c.get(f"/chunks/{name}").json()
    assert detail["file"]["status"].startswith("unauthentic")
    assert detail["token_ids"] is None and detail["text"] is None
    assert "t100" not in str(detail)


def test_shred_destroys_one_tenants_key_and_chunks(sealed_server):
    with sealed_server.client() as c:
        reply = c.delete("/namespaces/default", params={"shred": "true"})
        assert reply.status_code == 200, reply.text
        done = reply.json()
        assert done["key_destroyed"] is True and done["num_chunks"] == 4
        assert c.get("/stats").json()["disk"]["num_chunks"] == 2
    with sealed_server.backend.using_store() as store:
        assert [k.namespace for k in store.namespace_keys()] == ["other"]
        assert store.get(sealed_server.pages) == [None] * 4
        assert all(t is not None for t in store.get(sealed_server.other))
    with sealed_server.client(TENANT) as c:  # a tenant's token shreds nothing
        assert c.delete("/namespaces/other", params={"shred": "true"}).status_code == 403


def test_shred_is_refused_on_an_unsealed_store_and_delete_works(store_server):
    with store_server.client() as c:
        reply = c.delete("/namespaces/other", params={"shred": "true"})
        assert reply.status_code == 422 and "sealed" in reply.json()["error"]["message"]
        done = c.delete("/namespaces/other").json()
        assert done["num_chunks"] == 2 and done["key_destroyed"] is None
