"""The rule of the management API's tokens, checked for every route of its OpenAPI spec (so a new
route cannot skip it): with any namespace token (or, under `chunkstore serve`, any tenant API key)
configured, every call needs a token, reads too, on a loopback bind as well (a reverse proxy on the
same host forwards `Host: 127.0.0.1`); a chunk's tokens and text are shown only to the admin token and
to the namespace's own token; the admin token never equals a namespace's token."""

from __future__ import annotations

import hashlib

import httpx
import pytest

from chunkstore.api import AdminSettings, StoreBackend, create_app
from chunkstore.api.security import TokenRing
from tests.helpers.api import ADMIN, FAST, TENANT, assert_every_route_needs_a_token, client, fill_store, live_server

@pytest.fixture
def tenants_server(tmp_path):
    """A store's API with one namespace token configured, bound to loopback."""
    root = tmp_path / "store"
    pages, other = fill_store(root)
    backend = StoreBackend(root)
    app = create_app(backend, AdminSettings(token=ADMIN, namespace_tokens=(f"other={TENANT}",), **FAST))
    try:
        with live_server(app) as url:
            yield url, pages, other
    finally:
        backend.close()


def test_with_namespace_tokens_every_route_needs_a_token(tenants_server):
    url, pages, _ = tenants_server
    assert_every_route_needs_a_token(url, pages[0].key.hex(), hidden=("other", pages[0].key.hex()))


def test_without_namespace_tokens_loopback_reads_stay_open_but_hide_chunk_content(tmp_path):
    root = tmp_path / "store"
    pages, _ = fill_store(root)
    backend = StoreBackend(root, decode=lambda ids: "text of " + " ".join(map(str, ids)))
    try:
        with live_server(create_app(backend, AdminSettings(token=ADMIN, **FAST))) as url:
            key = pages[0].key.hex()
            with client(url, token=None) as anonymous:
                assert anonymous.get("/chunks").status_code == 200
                hidden = anonymous.get(f"/chunks/{key}").json()
                assert hidden["is_content_hidden"] is True
                assert hidden["token_ids"] is None and hidden["text"] is None
                assert hidden["file"]["status"] == "ok" and hidden["num_tokens"] == len(pages[0].token_ids)
            with client(url) as admin:
                shown = admin.get(f"/chunks/{key}").json()
                assert shown["is_content_hidden"] is False
                assert shown["token_ids"] == list(pages[0].token_ids) and shown["text"].startswith("text of ")
    finally:
        backend.close()


def test_a_namespace_token_sees_its_own_chunks_content_only(tenants_server):
    url, pages, other = tenants_server
    with client(url, token=TENANT) as tenant:
        mine = tenant.get(f"/chunks/{other[0].key.hex()}").json()
        assert mine["token_ids"] == list(other[0].token_ids) and mine["is_content_hidden"] is False
        theirs = tenant.get(f"/chunks/{pages[0].key.hex()}")
        assert theirs.status_code == 403 and str(pages[0].token_ids[1]) not in theirs.text


@pytest.mark.parametrize("where", ["settings", "file"])
def test_the_admin_token_may_not_be_a_namespace_token(tmp_path, where):
    root = tmp_path / "store"
    fill_store(root)
    backend = StoreBackend(root)
    try:
        if where == "file":
            (root / "admin-token").write_text("shared-secret\n")
            settings = AdminSettings(namespace_tokens=("other=shared-secret",), **FAST)
        else:
            settings = AdminSettings(token="shared-secret", **FAST)
        digests = [("alice", hashlib.sha256(b"shared-secret").digest())] if where == "settings" else ()
        with pytest.raises(ValueError, match="admin token is also the token") as raised:
            create_app(backend, settings, namespace_digests=digests)
        assert "shared-secret" not in str(raised.value)
        if where == "file":
            assert "admin-token" in str(raised.value)  # says where the clashing admin token comes from
    finally:
        backend.close()


def test_token_ring_reports_namespace_tokens():
    assert not TokenRing("admin", []).has_namespace_tokens
    assert TokenRing("admin", [("a", "tok-a")]).has_namespace_tokens
    assert TokenRing("admin", [], [("a", b"\0" * 32)]).has_namespace_tokens
