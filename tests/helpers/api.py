"""Helpers of the management API's tests: tokens, a live uvicorn server on loopback, clients, a filled
store, a warmed cache, and the table-driven token rule over the OpenAPI spec.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from chunkstore import ChunkStore, PageRef, chain_pages
from chunkstore.api import AdminSettings
from chunkstore.cache.tiered import TieredCache
from tests.cache.test_tiered import serve, settle
from tests.helpers import TINY, kv_pages

ADMIN = "admin-secret-token"


TENANT = "tenant-secret-token"  # a namespace token of "other"


START_TIMEOUT_S = 15.0


STOP_TIMEOUT_S = 15.0


FAST = dict(history_interval_s=0.1, events_interval_s=0.05, events_max_s=5.0)


OPEN_PATHS = {"/api/v1/healthz", "/api/v1/readyz"}  # probes: they say nothing about any tenant


@contextmanager
def live_server(app) -> Iterator[str]:
    """``app`` served by uvicorn on 127.0.0.1 at a free port; yields its base URL."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on", timeout_graceful_shutdown=3))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + START_TIMEOUT_S
    while not server.started:
        assert thread.is_alive(), "uvicorn exited while starting"
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.01)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(STOP_TIMEOUT_S)
        sock.close()
        assert not thread.is_alive(), "uvicorn did not stop"


def spec_calls(url: str, key: str) -> list[tuple[str, str]]:
    """(method, concrete path) for every operation in the served spec, path parameters filled."""
    spec = httpx.get(f"{url}/api/v1/openapi.json", timeout=30).json()
    values = {"key": key, "namespace": "default", "job_id": "0" * 16}
    calls = []
    for template, operations in spec["paths"].items():
        path = re.sub(r"\{(\w+)(:path)?\}", lambda m: values.get(m.group(1), m.group(0)), template)
        assert "{" not in path, f"no value for a parameter of {template}: add it to `values`"
        calls += [(method.upper(), path) for method in operations]
    return calls


def assert_every_route_needs_a_token(url: str, key: str, hidden: tuple[str, ...] = ()) -> None:
    """Every operation of the served spec but the probes answers an anonymous call with 401,
    showing none of the strings in ``hidden`` (namespaces, keys)."""
    calls = spec_calls(url, key)
    assert len(calls) >= 20  # the whole spec, not an empty one
    opened = set()
    with client(url, token=None) as anonymous:
        for method, path in calls:
            r = anonymous.request(method, path.removeprefix("/api/v1"), json={})
            if path in OPEN_PATHS:
                opened.add(path)
                assert r.status_code in (200, 503), (method, path, r.text)
                continue
            assert r.status_code == 401, (method, path, r.status_code, r.text)
            assert r.headers["www-authenticate"] == "Bearer"
            assert not any(s in r.text for s in hidden), (method, path, r.text)
    assert opened == OPEN_PATHS


def client(url: str, token: str | None = ADMIN, **headers: str) -> httpx.Client:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return httpx.Client(base_url=url + "/api/v1", headers=headers, timeout=30.0)


def wait_for(predicate, timeout_s: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def fill_store(root: Path) -> tuple[list[PageRef], list[PageRef]]:
    """Eight chained pages in `default` (the first two read once) and two in `other`."""
    pages = chain_pages(TINY, list(range(TINY.page_size * 8)))
    other = chain_pages(TINY, list(range(TINY.page_size * 2)), namespace="other")
    with ChunkStore(root, TINY) as s:
        s.put(pages, kv_pages(TINY, 8))
        s.put(other, kv_pages(TINY, 2, seed=1))
        s.get(pages[:2])
    return pages, other


@dataclass
class Served:
    url: str
    root: Path
    backend: object
    app: object
    pages: list[PageRef]
    other: list[PageRef]

    def client(self, token: str | None = ADMIN, **headers: str) -> httpx.Client:
        return client(self.url, token, **headers)


@contextmanager
def served_store(backend, root: Path, pages: list[PageRef], other: list[PageRef]) -> Iterator[Served]:
    """The API over a StoreBackend, live on loopback; the backend is closed at the end."""
    from chunkstore.api import create_app

    app = create_app(backend, settings())
    try:
        with live_server(app) as url:
            yield Served(url, root, backend, app, pages, other)
    finally:
        backend.close()


def settings(**overrides) -> AdminSettings:
    values = dict(token=ADMIN, namespace_tokens=(f"other={TENANT}",), **FAST)
    values.update(overrides)
    return AdminSettings(**values)


def decode_tokens(ids) -> str:
    return " ".join(f"t{i}" for i in ids)


def warm(cache: TieredCache) -> tuple[list[int], list[int]]:
    """Two requests through the engine's cycle (one per namespace), settled: pages on every tier."""
    a = [1000 * p + j for p in range(1, 6) for j in range(TINY.page_size)]
    b = [1000 * p + j for p in range(7, 10) for j in range(TINY.page_size)]
    serve(cache, a)
    serve(cache, b, "other")
    settle(cache)
    return a, b
