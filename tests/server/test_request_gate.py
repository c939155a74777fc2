"""One error envelope per API, one code per fault, on both APIs of `chunkstore serve` (the generation
APIs and the management API mounted under /api/v1): bodies that are not UTF-8, not JSON, nested too
deep or compressed; keys checked before a body is read; JSON's types strictly; ``Allow`` on 405;
the spec and the server agreeing. Real servers (uvicorn on loopback, the tiny preset)."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from chunkstore.engine import Engine
from chunkstore.http.json_body import MAX_DEPTH
from chunkstore.http.json_types import MAX_JSON_INT
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import Served, cache_config
from tests.server.test_errors import assert_error

KEY = "alice-gate-key-0123"
JSON = {"content-type": "application/json"}
CHAT = [{"role": "user", "content": "hello"}]
SERVER_POST = "/v1/completions"
ADMIN_POST = "/api/v1/evict"


def admin_token(root: Path) -> str:
    return (root / "disk" / "admin-token").read_text().strip()


@pytest.fixture(scope="module")
def open_server(tiny, tmp_path_factory) -> Iterator[tuple[Served, str]]:
    """No API keys; the admin API mounted, with its token."""
    root = tmp_path_factory.mktemp("open")
    with Served(Engine(tiny, cache_config(root)), ServerSettings()) as served:
        yield served, admin_token(root)


@pytest.fixture(scope="module")
def keyed_server(tiny, tmp_path_factory) -> Iterator[tuple[Served, str]]:
    """API keys: alice's; the admin API mounted, with its token."""
    root = tmp_path_factory.mktemp("keyed")
    with Served(Engine(tiny, cache_config(root)), ServerSettings(api_key=(f"alice={KEY}",))) as served:
        yield served, admin_token(root)


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def post(served: Served, path: str, content: bytes, **headers: str) -> httpx.Response:
    return served.client.post(path, content=content, headers={**JSON, **headers})


def admin_error(reply: httpx.Response, status: int, code: str) -> dict:
    """The management API's envelope: code, message, param (and nothing of OpenAI's)."""
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"code", "message", "param"} and error["code"] == code and error["message"], error
    return error


def both_apis(served: Served, token: str, content: bytes, status: int, code: str, **headers: str) -> None:
    """The same bytes get the same status and code from both APIs, each in its own envelope."""
    assert_error(post(served, SERVER_POST, content, **headers), status, code=code)
    admin_error(post(served, ADMIN_POST, content, **bearer(token), **headers), status, code)


@pytest.mark.parametrize("content,code", [
    (b'{"prompt": "\xff\xfe"}', "invalid_encoding"),
    (b'\xef\xbb\xbf{"prompt": "x"}\xc3', "invalid_encoding"),  # a BOM, then a cut-off character
    (b"[" * 10_000 + b"]" * 10_000, "too_deep"),
    (b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1), "too_deep"),
    (b"\x00", "invalid_json"),
    (b'{"prompt": "x",', "invalid_json"),
    ('{"prompt": "x"}'.encode("utf-16"), "invalid_encoding"),
])
def test_a_body_that_is_not_json_text_is_400_with_its_code_on_both_apis(open_server, content, code):
    served, token = open_server
    both_apis(served, token, content, 400, code)


def test_nesting_up_to_the_limit_reaches_validation(open_server):
    served, token = open_server
    deep = b"[" * MAX_DEPTH + b"]" * MAX_DEPTH
    assert_error(post(served, SERVER_POST, deep), 400, code="invalid_request")  # not an object: the model's word
    admin_error(post(served, ADMIN_POST, deep, **bearer(token)), 422, "invalid_request")


@pytest.mark.parametrize("encoding", ["gzip", "deflate, identity", "br"])
def test_a_compressed_body_is_415_on_both_apis(open_server, encoding):
    served, token = open_server
    content = gzip.compress(json.dumps({"prompt": "x", "max_tokens": 1}).encode())
    both_apis(served, token, content, 415, "unsupported_encoding", **{"Content-Encoding": encoding})
    reply = post(served, SERVER_POST, content, **{"Content-Encoding": encoding})
    assert reply.headers["accept-encoding"] == "identity"
    plain = post(served, SERVER_POST, b'{"prompt": "x", "max_tokens": 1}', **{"Content-Encoding": "identity"})
    assert plain.status_code == 200, plain.text


@pytest.mark.parametrize("content", [b'{"prompt": "\xff"}', b"\x00", b"[" * 100 + b"]" * 100, b"not json"])
def test_keys_are_checked_before_a_body_is_read(keyed_server, content):
    served, token = keyed_server
    for path in (SERVER_POST, "/v1/chat/completions", "/generate"):
        assert_error(post(served, path, content), 401, code="missing_api_key")
        assert_error(post(served, path, content, **bearer("wrong")), 401, code="invalid_api_key")
        assert_error(post(served, path, content, **{"Authorization": "Basic x"}), 401, code="invalid_api_key")
        assert post(served, path, content, **bearer(KEY)).status_code == 400
    gz = post(served, SERVER_POST, gzip.compress(b"{}"), **{"Content-Encoding": "gzip"})
    assert_error(gz, 401, code="missing_api_key")
    for path in (ADMIN_POST, "/api/v1/clear"):  # the management API: a token first, a tenant's key is one
        admin_error(post(served, path, content), 401, "missing_api_key")
        admin_error(post(served, path, content, **bearer("wrong")), 401, "invalid_api_key")
        assert post(served, path, content, **bearer(KEY)).status_code == 400
        assert post(served, path, content, **bearer(token)).status_code == 400


def test_a_401_says_whether_a_key_was_sent_on_both_apis(keyed_server):
    served, _ = keyed_server
    assert_error(served.client.get("/v1/models"), 401, code="missing_api_key")
    assert_error(served.client.get("/v1/models", headers=bearer("wrong")), 401, code="invalid_api_key")
    admin_error(served.client.get("/api/v1/stats"), 401, "missing_api_key")
    admin_error(served.client.get("/api/v1/stats", headers=bearer("wrong")), 401, "invalid_api_key")


@pytest.mark.parametrize("path,body,param", [
    ("/v1/chat/completions", {"messages": CHAT, "max_completion_tokens": False}, "max_completion_tokens"),
    ("/v1/chat/completions", {"messages": CHAT, "presence_penalty": False}, "presence_penalty"),
    ("/v1/chat/completions", {"messages": CHAT, "stream": 1}, "stream"),
    ("/v1/completions", {"prompt": "x", "max_tokens": "5"}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "seed": "5"}, "seed"),
    ("/v1/completions", {"prompt": "x", "temperature": "0.5"}, "temperature"),
    ("/v1/completions", {"prompt": "x", "max_tokens": 2.5}, "max_tokens"),
    ("/v1/completions", {"prompt": "x", "n": True}, "n"),
    ("/v1/completions", {"prompt": "x", "logprobs": 1}, "logprobs"),
    ("/v1/completions", {"prompt": "x", "echo": 0}, "echo"),
    ("/v1/completions", {"prompt": ["a", "b"]}, "prompt"),
    ("/v1/completions", {"prompt": [1, -1]}, "prompt.1"),
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": True}}, "sampling_params.max_new_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"top_k": "-1"}}, "sampling_params.top_k"),
    ("/generate", {"text": "x", "sampling_params": [None]}, "sampling_params"),
    ("/generate", {"text": "x", "stream": "true"}, "stream"),
])
def test_json_types_are_strict(open_server, path, body, param):
    served, _ = open_server
    assert_error(served.client.post(path, json=body), 400, code="invalid_request", param=param)


@pytest.mark.parametrize("path,body", [
    ("/v1/completions", {"prompt": ["AAA"], "max_tokens": 1}),  # a batch of one, as OpenAI takes it
    ("/v1/completions", {"prompt": [[65, 66]], "max_tokens": 1.0}),  # 1.0: JSON Schema's integer
    ("/v1/completions", {"prompt": "x", "max_tokens": 1, "presence_penalty": 0.0, "n": 1, "logprobs": False,
                         "logit_bias": {}, "user": ""}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
                              "max_completion_tokens": 1, "tools": [], "response_format": {"type": "text"}}),
    ("/generate", {"input_ids": [[72, 105]], "sampling_params": [{"max_new_tokens": 1, "top_k": 0, "n": 1.0}]}),
    ("/generate", {"text": "x", "sampling_params": None, "return_logprob": False}),
])
def test_what_the_spec_calls_valid_is_served(open_server, path, body):
    served, _ = open_server
    if path == "/generate" and body.get("sampling_params") is None:
        body = {**body, "stream": True}  # SGLang's default budget (128 tokens): stop reading after the first event
        with served.client.stream("POST", path, json=body) as reply:
            assert reply.status_code == 200
        return
    reply = served.client.post(path, json=body)
    assert reply.status_code == 200, reply.text


def test_a_seed_beyond_the_engines_is_taken_modulo_2_63(open_server):
    served, _ = open_server
    body = {"prompt": "seeded", "max_tokens": 8, "temperature": 1.0, "ignore_eos": True}
    texts = [served.client.post(SERVER_POST, json={**body, "seed": seed}).json()["choices"][0]["text"]
             for seed in (5, 2**63 + 5, 2**64 + 5)]
    assert texts[0] == texts[1] == texts[2]


def spec_of(served: Served, path: str) -> dict:
    return served.client.get(path).raise_for_status().json()


def test_the_spec_says_what_the_server_takes(open_server):
    served, _ = open_server
    schemas = spec_of(served, "/openapi.json")["components"]["schemas"]
    prompt = schemas["CompletionRequest"]["properties"]["prompt"]["anyOf"]
    text, ids = prompt[0], prompt[1]
    assert text == {"type": "string", "minLength": 1}
    vocab = served.engine.tokenizer.vocab_size
    assert ids["minItems"] == 1 and ids["maxItems"] == served.engine.loaded.max_positions
    assert ids["items"] == {"type": "integer", "minimum": 0, "maximum": vocab - 1}
    assert {"type": "array", "items": text, "minItems": 1, "maxItems": 1} in prompt  # a batch of one
    generate = schemas["GenerateRequest"]
    assert generate["properties"]["input_ids"]["anyOf"][0]["minItems"] == 1
    assert {tuple(rule["required"]) for rule in generate["oneOf"]} == {("text",), ("input_ids",)}
    sampling = schemas["GenerateSamplingParams"]["properties"]
    assert sampling["top_k"]["enum"] == [-1, 0] and sampling["n"]["enum"] == [1]
    body = schemas["ChatCompletionRequest"]["properties"]
    assert body["presence_penalty"]["enum"] == [None, 0] and body["tools"]["enum"] == [None, []]
    assert body["max_completion_tokens"]["anyOf"][0] == {"type": "integer", "minimum": 0}
    assert "pattern" in body["user"]["anyOf"][0] and body["user"]["anyOf"][0]["maxLength"] == 256


def test_every_token_id_the_spec_allows_is_served(open_server):
    served, _ = open_server
    top = served.engine.tokenizer.vocab_size - 1
    assert served.client.post(SERVER_POST, json={"prompt": [0, top], "max_tokens": 1}).status_code == 200
    assert_error(served.client.post(SERVER_POST, json={"prompt": [top + 1]}), 400, param="prompt")


def test_error_answers_are_json_in_the_spec(open_server, keyed_server):
    served, _ = open_server
    flush = spec_of(served, "/openapi.json")["paths"]["/flush_cache"]["post"]["responses"]
    assert flush["401"]["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorResponse"}}}
    assert "text/plain" in flush["200"]["content"]
    keyed, _ = keyed_server
    reply = keyed.client.post("/flush_cache")
    assert reply.headers["content-type"] == "application/json"
    assert_error(reply, 401, code="missing_api_key")
    generation = spec_of(served, "/openapi.json")["paths"][SERVER_POST]["post"]["responses"]
    assert {"400", "401", "413", "415"} <= set(generation)


def test_sizes_have_an_exact_maximum_in_the_spec(open_server):
    served, token = open_server
    spec = spec_of(served, "/api/v1/openapi.json")
    quota = spec["components"]["schemas"]["QuotaUpdate"]["properties"]["quota_bytes"]["anyOf"][0]
    assert quota["maximum"] == MAX_JSON_INT  # a double that holds it exactly, unlike 2^62's 4611686018427388000
    with httpx.Client(base_url=served.url + "/api/v1", headers=bearer(token)) as admin:
        assert admin.put("/namespaces/default/quota", json={"quota_bytes": MAX_JSON_INT}).status_code == 200
        admin_error(admin.put("/namespaces/default/quota", json={"quota_bytes": MAX_JSON_INT + 1}), 422,
                    "invalid_request")
        assert admin.put("/namespaces/default/quota", json={"quota_bytes": None}).status_code == 200


@pytest.mark.parametrize("method,path,allow", [
    ("OPTIONS", "/v1/completions", "POST"),
    ("GET", "/flush_cache", "POST"),
    ("PUT", "/v1/models", "GET"),
    ("OPTIONS", "/api/v1/config", "GET, PATCH"),
    ("DELETE", "/api/v1/config", "GET, PATCH"),
    ("GET", "/api/v1/jobs/gc", "POST"),
    ("DELETE", "/api/v1/namespaces/default/quota", "PUT"),
    ("GET", "/api/v1/namespaces/default", "DELETE"),
    ("POST", "/metrics", "GET"),
])
def test_405_names_every_method_of_the_path(open_server, method, path, allow):
    served, token = open_server
    reply = served.client.request(method, path, headers=bearer(token))
    assert reply.status_code == 405, reply.text
    assert reply.headers["allow"] == allow
    assert reply.json()["error"]["code"] == "method_not_allowed"


def test_a_job_id_is_not_a_job_kind(open_server):
    served, token = open_server
    with httpx.Client(base_url=served.url + "/api/v1", headers=bearer(token)) as admin:
        admin_error(admin.get("/jobs/verify-1-1"), 404, "not_found")
        job_id = admin.post("/jobs/verify").json()["id"]
        assert admin.get(f"/jobs/{job_id}").status_code == 200
