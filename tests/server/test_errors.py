"""Bad requests over HTTP: each gets a 4xx with a clear message in OpenAI's error shape."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from chunkstore.engine import Engine, EngineConfig, FinishReason
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import Served, cache_config

CHAT = [{"role": "user", "content": "hello"}]


def assert_error(reply: httpx.Response, status: int, *, code: str | None = None, param: str | None = None,
                 says: str = "") -> dict:
    assert reply.status_code == status, reply.text
    error = reply.json()["error"]
    assert set(error) == {"message", "type", "code", "param"}
    assert error["message"] and says.lower() in error["message"].lower(), error
    if code is not None:
        assert error["code"] == code, error
    if param is not None:
        assert error["param"] == param, error
    return error


@pytest.mark.parametrize("path,body,status,code,param,says", [
    ("/v1/completions", {"prompt": "x", "n": 2}, 400, "invalid_request", "n", "n=1"),
    ("/v1/completions", {"prompt": "x", "best_of": 3}, 400, None, "best_of", "best_of"),
    ("/v1/completions", {"prompt": "x", "logprobs": 2}, 400, None, "logprobs", "logprobs"),
    ("/v1/completions", {"prompt": "x", "echo": True}, 400, None, "echo", "echo"),
    ("/v1/completions", {"prompt": "x", "model": "gpt-4"}, 404, "model_not_found", "model", "gpt-4"),
    ("/v1/completions", {"prompt": "x", "temperature": 3}, 400, None, "temperature", "temperature"),
    ("/v1/completions", {"prompt": "x", "max_tokens": -1}, 400, None, "max_tokens", ""),
    ("/v1/completions", {"prompt": "x", "stop": [""]}, 400, None, "stop", "empty"),
    ("/v1/completions", {"prompt": ["a", "b"]}, 400, None, "prompt", "one prompt per request"),
    ("/v1/completions", {"prompt": [1, 300]}, 400, None, "prompt", "token ids"),
    ("/v1/completions", {"prompt": "x" * 5000}, 400, "context_length_exceeded", "prompt", "at most 4096"),
    ("/v1/completions", {"max_tokens": 3}, 400, None, "prompt", "field required"),
    ("/v1/chat/completions", {"messages": []}, 400, None, "messages", ""),
    ("/v1/chat/completions", {"messages": CHAT, "n": 3}, 400, None, "n", "n=1"),
    ("/v1/chat/completions", {"messages": CHAT, "tools": [{"type": "function"}]}, 400, None, "tools", "tools"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, 400, None,
     "messages.0.content", "text"),
    ("/v1/chat/completions", {"messages": CHAT, "response_format": {"type": "json_object"}}, 400, None,
     "response_format", "text"),
    ("/generate", {"input_ids": [1, 2], "sampling_params": {"temperature": -1}}, 400, None,
     "sampling_params.temperature", ""),
    ("/generate", {"text": "x", "return_logprob": True}, 400, None, "return_logprob", "logprobs"),
])
def test_bad_request(served, path, body, status, code, param, says):
    assert_error(served.client.post(path, json=body), status, code=code, param=param, says=says)


def test_invalid_json_and_bodies_that_are_not_objects(served):
    bad = served.client.post("/v1/completions", content=b'{"prompt": "x",',
                             headers={"content-type": "application/json"})
    assert_error(bad, 400, code="invalid_json", says="not valid JSON")
    assert "line 1 column 16" in bad.json()["error"]["message"]  # where
    form = served.client.post("/generate", content=b'{"text": "x"}',
                              headers={"content-type": "application/x-www-form-urlencoded"})
    assert_error(form, 400, says="Content-Type: application/json")
    assert_error(served.client.post("/v1/chat/completions", json=[1, 2]), 400, says="JSON object")


def test_unknown_routes_and_methods(served):
    assert_error(served.client.get("/v1/nothing"), 404, code="not_found")
    reply = served.client.get("/v1/completions")
    assert_error(reply, 405, code="method_not_allowed")
    assert reply.headers["allow"] == "POST"
    reply = served.client.options("/generate")
    assert_error(reply, 405, code="method_not_allowed")
    assert reply.headers["allow"] == "POST"


def test_namespace_must_be_sane(served):
    reply = served.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 1, "user": "u" * 300})
    assert_error(reply, 400, param="user", says="namespace")


@pytest.fixture(scope="module")
def small(tiny, tmp_path_factory):
    """One request at a time, one waiting, bodies up to 4 KiB."""
    engine = Engine(tiny, cache_config(tmp_path_factory.mktemp("small")),
                    EngineConfig(max_queue_size=1, max_running_requests=1))
    with Served(engine, ServerSettings(max_body_bytes="4KiB")) as s:
        yield s


def test_body_too_large(small):
    big = {"prompt": "x" * 5000, "max_tokens": 1}
    assert_error(small.client.post("/v1/completions", json=big), 413, code="body_too_large", says="4096 bytes")

    def chunked():  # no Content-Length: the limit is enforced while the body streams in
        yield b'{"prompt": "'
        for _ in range(10):
            yield b"x" * 1000
        yield b'"}'

    reply = small.client.post("/v1/completions", content=chunked(), headers={"content-type": "application/json"})
    assert_error(reply, 413, code="body_too_large")
    assert small.client.post("/v1/completions", json={"prompt": "fits", "max_tokens": 1}).status_code == 200


def test_queue_full_is_429_and_a_stream_can_be_cancelled(small):
    long = {"prompt": "long", "max_tokens": 3000, "ignore_eos": True, "temperature": 0, "stream": True}
    queued_replies: list[int] = []
    with httpx.Client(base_url=small.url, timeout=60) as other:
        def post_queued() -> None:
            queued_replies.append(other.post("/v1/completions", json={"prompt": "queued", "max_tokens": 1}).status_code)

        queued = threading.Thread(target=post_queued, daemon=True)
        with small.client.stream("POST", "/v1/completions", json=long) as running:
            lines = running.iter_lines()  # kept: dropping a half-read iterator closes the connection
            assert any('"text":"' in line and '"text":""' not in line for line in lines)  # decoding
            [long_handle] = small.live.app.state.in_flight.handles()
            queued.start()
            deadline = time.monotonic() + 30
            while small.engine.num_queued < 1:  # the queued request takes the one slot...
                assert time.monotonic() < deadline
                time.sleep(0.01)
            reply = small.client.post("/v1/completions", json={"prompt": "third", "max_tokens": 1})
            error = assert_error(reply, 429, code="queue_full", says="retry later")  # ...the next is refused
            assert error["type"] == "rate_limit_error" and reply.headers["retry-after"] == "1"
        # leaving the stream closed its connection: the engine aborts the long request, the queued one runs
        assert long_handle.result(30).finish_reason is FinishReason.ABORT
        queued.join(30)
    assert queued_replies == [200]
    assert small.client.post("/v1/completions", json={"prompt": "after", "max_tokens": 1}).status_code == 200


def test_loopback_server_refuses_other_host_names(served):
    """DNS rebinding: a page on evil.example that resolves to 127.0.0.1 must not read the answers."""
    assert_error(served.client.get("/v1/models", headers={"Host": "evil.example:8000"}), 400, code="invalid_host")
    assert_error(served.client.get("/health", headers={"Host": "127.0.0.1.evil.example"}), 400, code="invalid_host")
    for host in ("localhost:8000", "127.0.0.1", "[::1]:9", "127.3.4.5:80"):
        assert served.client.get("/health", headers={"Host": host}).status_code == 200, host
