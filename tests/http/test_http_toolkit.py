"""The shared HTTP toolkit (chunkstore/http/): one Host rule, one bearer parser and token ring, one body
limit, the handler machinery under two envelopes, and the settings fields both apps share."""

from __future__ import annotations

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import BaseModel, ValidationError

from chunkstore.http.bearer import DigestRing, MalformedAuthorization, bearer_token, token_digest
from chunkstore.http.body_limit import BodyLimitMiddleware
from chunkstore.http.hosts import HostCheckMiddleware, HostRule, host_name, is_loopback
from chunkstore.http.lifecycle import BindError, bind, url_of


@pytest.mark.parametrize("header,name", [
    ("Example.ORG:8001", "example.org"), ("example.org", "example.org"), ("[::1]:8001", "::1"), ("[::1]", "::1"),
    ("::1", "::1"), ("127.0.0.1:80", "127.0.0.1"), (" localhost ", "localhost"), ("", ""),
])
def test_host_name(header, name):
    assert host_name(header) == name


def test_one_loopback_rule():
    for host in ("localhost", "LOCALHOST:9", "app.localhost", "127.0.0.1", "127.3.4.5:80", "::1", "[::1]:8000"):
        assert is_loopback(host), host
    for host in ("", "0.0.0.0", "::", "10.0.0.1", "example.org", "localhost.example", "127.0.0.1.evil.example",
                 "evillocalhost"):
        assert not is_loopback(host), host


def test_host_rule_admits_loopback_and_its_names_only():
    rule = HostRule.of(["Cache.Example", "[fd00::1]", ""])
    assert rule.names == {"cache.example", "fd00::1"}
    for header in ("cache.example:443", "[fd00::1]:80", "localhost", "127.0.0.2"):
        assert rule.allows(header), header
    for header in ("", "evil.example", "cache.example.evil.example", "fd00::2"):
        assert not rule.allows(header), header


def test_bearer_token():
    assert bearer_token(None) is None and bearer_token("  ") is None
    assert bearer_token("Bearer abc") == "abc" and bearer_token("bearer   abc ") == "abc"
    for header in ("Basic abc", "Bearer", "Bearer   ", "abc"):
        with pytest.raises(MalformedAuthorization):
            bearer_token(header)


def test_digest_ring_finds_the_one_it_holds():
    ring = DigestRing([(token_digest("a"), "alice"), (token_digest("b"), "bob")])
    assert len(ring) == 2 and ring.identify("b") == "bob" and ring.identify("a") == "alice"
    assert ring.identify("") is None and ring.identify("ab") is None
    assert len(token_digest("x")) == len(token_digest("x" * 1000)) == 32


def _refuse(raw: str):
    from starlette.responses import PlainTextResponse
    return PlainTextResponse(f"no {raw}", status_code=400)


def _too_large(message: str):
    from starlette.responses import PlainTextResponse
    return PlainTextResponse(message, status_code=413)


class Echo(BaseModel):
    text: str


def guarded_app() -> FastAPI:
    app = FastAPI()

    @app.post("/own/echo")
    async def own(body: Echo) -> dict:
        return {"n": len(body.text)}

    @app.post("/mounted/echo")
    async def mounted(body: Echo) -> dict:
        return {"n": len(body.text)}

    app.add_middleware(BodyLimitMiddleware, max_bytes=100, too_large=_too_large, hint=" (hint)",
                       exempt=("/mounted",))
    app.add_middleware(HostCheckMiddleware, rule=HostRule.of(["ok.example"]), refuse=_refuse, exempt=("/mounted",))
    return app


def test_checks_skip_the_paths_a_mounted_app_owns():
    with TestClient(guarded_app(), base_url="http://ok.example") as client:
        body = {"text": "x" * 200}
        r = client.post("/own/echo", json=body)
        assert r.status_code == 413 and r.text == "the request body is larger than 100 bytes (hint)"
        assert client.post("/mounted/echo", json=body).json() == {"n": 200}
        assert client.post("/own/echo", json={"text": "x"}).json() == {"n": 1}
        r = client.post("/own/echo", json={"text": "x"}, headers={"Host": "evil.example"})
        assert r.status_code == 400 and r.text == "no evil.example"
        assert client.post("/mounted/echo", json={"text": "x"}, headers={"Host": "evil.example"}).status_code == 200
        # a prefix owns its own paths only, not a longer name
        r = client.post("/mountedx/echo", json={"text": "x"}, headers={"Host": "evil.example"})
        assert r.status_code == 400


def test_one_handler_machinery_two_envelopes():
    from chunkstore.api.errors import ENVELOPE as ADMIN
    from chunkstore.server.errors import ENVELOPE as SERVER

    for envelope, validation_status, shape in ((SERVER, 400, {"message", "type", "code", "param"}),
                                               (ADMIN, 422, {"message", "code", "param"})):
        from chunkstore.http.errors import install_error_handlers

        app = FastAPI()

        @app.post("/echo")
        async def echo(body: Echo) -> dict:
            return {}

        @app.get("/boom")
        async def boom() -> dict:
            raise RuntimeError("secret detail")

        install_error_handlers(app, envelope, {})
        with TestClient(app, raise_server_exceptions=False) as client:
            r = client.post("/echo", json={"text": 1})
            assert r.status_code == validation_status and set(r.json()["error"]) == shape
            assert r.json()["error"]["param"] == "text"
            r = client.get("/nowhere")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
            r = client.get("/boom")
            assert r.status_code == 500 and "secret" not in r.text and r.json()["error"]["code"] == "internal_error"
            assert envelope.too_large("big").headers["connection"] == "close"
        responses = app.openapi()["paths"]["/echo"]["post"]["responses"]
        assert ("422" in responses) is (validation_status == 422)


def test_shared_settings_fields():
    from chunkstore.api.settings import AdminSettings
    from chunkstore.server.settings import ServerSettings

    assert AdminSettings(token="t", max_body_bytes="64KiB").max_body_bytes == 65536
    assert ServerSettings(max_body_bytes="1MiB").max_body_bytes == 2**20
    for make in (lambda: AdminSettings(token="t", port=65536), lambda: ServerSettings(port=-1),
                 lambda: AdminSettings(token="t", max_body_bytes=0), lambda: ServerSettings(max_body_bytes="lots")):
        with pytest.raises(ValidationError):
            make()


def test_bind():
    sock = bind("[::1]", 0) if _has_ipv6() else bind("127.0.0.1", 0)
    try:
        sock.listen()
        assert url_of(sock).startswith(("http://[::1]:", "http://127.0.0.1:"))
        with pytest.raises(BindError, match="cannot listen on"):
            bind(sock.getsockname()[0], sock.getsockname()[1]).close()  # a listening port is taken
    finally:
        sock.close()


def _has_ipv6() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False
