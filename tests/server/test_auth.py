"""API keys over HTTP: 401 without a valid key, /health open, and namespaces fixed per key (tenants isolated)."""

from __future__ import annotations

import pytest

from chunkstore.engine import Engine
from chunkstore.server.auth import KeyRing
from chunkstore.server.settings import ServerSettings, Tenant
from tests.server.conftest import STORY, Served, cache_config

ALICE, BOB, PLAIN = "alice-key-0123", "bob-key-4567", "unnamed-key-89ab"


@pytest.fixture(scope="module")
def keyed(tiny, tmp_path_factory):
    settings = ServerSettings(api_key=(f"alice={ALICE}", f"bob={BOB}", PLAIN))
    with Served(Engine(tiny, cache_config(tmp_path_factory.mktemp("keyed"))), settings) as s:
        yield s


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("method,path,body", [
    ("GET", "/v1/models", None),
    ("POST", "/v1/completions", {"prompt": "x"}),
    ("POST", "/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}]}),
    ("POST", "/generate", {"text": "x"}),
    ("POST", "/flush_cache", None),
    ("GET", "/get_model_info", None),
])
def test_every_route_but_health_needs_the_key(keyed, method, path, body):
    for headers in ({}, bearer("wrong-key"), {"Authorization": f"Basic {ALICE}"}, bearer(ALICE + "x")):
        reply = keyed.client.request(method, path, json=body, headers=headers)
        assert reply.status_code == 401, (path, headers)
        error = reply.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] in ("missing_api_key", "invalid_api_key")
        assert reply.headers["www-authenticate"] == "Bearer"
    small = {"max_tokens": 1} if path.startswith("/v1/c") else {}
    ok = keyed.client.request(method, path, json={**body, **small} if body else None, headers=bearer(ALICE))
    assert ok.status_code == 200, ok.text


def test_health_needs_no_key(keyed):
    assert keyed.client.get("/health").status_code == 200


def test_tenants_are_isolated_whatever_they_ask_for(keyed):
    body = {"prompt": "tenants: " + STORY, "max_tokens": 4, "temperature": 0}

    def cached(key: str, **extra) -> int:
        reply = keyed.client.post("/v1/completions", json={**body, **extra.pop("json", {})}, headers={
            **bearer(key), **extra.pop("headers", {})})
        assert reply.status_code == 200, reply.text
        return reply.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached(ALICE) == 0
    assert cached(ALICE, json={"user": "someone"}) > 0  # the key fixes the namespace; user is ignored
    # Bob asks for Alice's namespace both ways and still misses: the server decides.
    assert cached(BOB, json={"user": "alice"}, headers={"X-Chunkstore-Namespace": "alice"}) == 0
    assert cached(BOB) > 0
    assert cached(PLAIN, headers={"X-Chunkstore-Namespace": "alice"}) == 0
    generate = keyed.client.post("/generate", json={"text": body["prompt"], "sampling_params": {"max_new_tokens": 1}},
                                 headers={**bearer(ALICE), "X-Chunkstore-Namespace": "bob"})
    assert generate.json()["meta_info"]["cached_tokens"] > 0  # Alice's namespace, not Bob's


def test_key_ring_compares_digests():
    tenants = (Tenant.parse(f"alice={ALICE}"), Tenant.parse(PLAIN))
    ring = KeyRing(tenants)
    assert ring.identify(ALICE) is tenants[0] and ring.identify(PLAIN) is tenants[1]
    assert ring.identify("alice") is None and ring.identify("") is None
    assert ALICE not in repr(tenants[0]) and tenants[0].namespace == "alice"
    assert tenants[1].namespace.startswith("key-") and PLAIN not in tenants[1].namespace
    assert not KeyRing(()).is_enabled and KeyRing(()).authenticate(None).tenant is None
