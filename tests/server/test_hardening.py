"""Bad input never gets a 5xx, and one request cannot starve the others: over HTTP, real uvicorn,
the tiny preset. Faults enter through the tokenizer seam (a LoadedModel with its own tokenizer)."""

from __future__ import annotations

import dataclasses
import json
import threading
import time

import httpx
import pytest

from chunkstore.engine import Engine, EngineConfig, FinishReason, Tokenizer
from chunkstore.engine.sampling import MAX_STOP_CHARS, MAX_STOP_STRINGS
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import Served, cache_config
from tests.server.test_errors import assert_error

CHAT = [{"role": "user", "content": "hello"}]
FAIL, GATE = "FAIL-SEAM", "GATE-SEAM"  # prompts the seam tokenizer fails on, or holds until released


class SeamTokenizer(Tokenizer):
    """The byte tokenizer, except for prompts holding FAIL (an internal error whose text must not
    reach a client) or GATE (held until ``gate`` is set; ``held`` counts the callers waiting)."""

    def __init__(self, inner: Tokenizer) -> None:
        self.inner, self.gate, self.held = inner, threading.Event(), 0
        self._lock = threading.Lock()

    vocab_size = property(lambda self: self.inner.vocab_size)
    eos_token_ids = property(lambda self: self.inner.eos_token_ids)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        if FAIL in text:
            raise RuntimeError("CUDA error: device-side assert at 0x7f3a (secret internals)")
        if GATE in text:
            with self._lock:
                self.held += 1
            self.gate.wait(60)
        return self.inner.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids) -> str:
        return self.inner.decode(token_ids)

    def encode_chat(self, messages) -> list[int]:
        return self.inner.encode_chat(messages)

    def stream_decoder(self):
        return self.inner.stream_decoder()


@pytest.fixture(scope="module")
def seamed(tiny, tmp_path_factory):
    """One request running, one waiting; the seam tokenizer."""
    loaded = dataclasses.replace(tiny, tokenizer=SeamTokenizer(tiny.tokenizer))
    engine = Engine(loaded, cache_config(tmp_path_factory.mktemp("seamed")),
                    EngineConfig(max_queue_size=1, max_running_requests=1))
    with Served(engine, ServerSettings()) as s:
        yield s


def post_raw(served, path: str, raw: str) -> httpx.Response:
    """POST a JSON text as is (json= would refuse to encode a lone surrogate's escape)."""
    return served.client.post(path, content=raw.encode(), headers={"content-type": "application/json"})


def test_max_completion_tokens_is_taken(served):
    reply = served.client.post("/v1/chat/completions", json={"messages": CHAT, "max_completion_tokens": 3,
                                                             "max_tokens": 9, "ignore_eos": True})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 1e-6])
@pytest.mark.parametrize("path,body,tokens", [
    ("/v1/completions", {"prompt": "tiny temperature", "max_tokens": 6, "ignore_eos": True},
     lambda j: j["choices"][0]["text"]),
    ("/v1/chat/completions", {"messages": CHAT, "max_tokens": 6, "ignore_eos": True},
     lambda j: j["choices"][0]["message"]["content"]),
    ("/generate", {"text": "tiny temperature", "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}},
     lambda j: j["output_ids"]),
])
def test_a_temperature_below_the_epsilon_is_greedy(served, path, body, tokens, temperature):
    def with_temperature(t: float) -> dict:
        if path == "/generate":
            return {**body, "sampling_params": {**body["sampling_params"], "temperature": t}}
        return {**body, "temperature": t}

    tiny_t = served.client.post(path, json=with_temperature(temperature))
    assert tiny_t.status_code == 200, tiny_t.text
    greedy = served.client.post(path, json=with_temperature(0))
    assert tokens(tiny_t.json()) == tokens(greedy.json())


S = "\\ud800"  # a lone surrogate, as a JSON escape
SURROGATES = [
    ("/v1/completions", f'{{"prompt": "x", "model": "{S}"}}', "model"),
    ("/v1/completions", f'{{"prompt": "x", "user": "{S}"}}', "user"),
    ("/v1/completions", f'{{"prompt": "x{S}", "max_tokens": 1}}', "prompt"),
    ("/v1/completions", f'{{"prompt": ["x{S}"], "max_tokens": 1}}', "prompt"),
    ("/v1/completions", f'{{"prompt": "x", "stop": ["a", "{S}"], "stream": true}}', "stop"),
    ("/v1/completions", f'{{"prompt": "x", "user": "{S}", "stream": true}}', "user"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "x"}}], '
                             f'"response_format": {{"type": "text", "x": "{S}"}}}}', "response_format"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "{S}"}}]}}', "messages.0.content"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "{S}", "content": "x"}}]}}', "messages.0.role"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": [{{"type": "text", "text": "{S}"}}]}}]}}',
     "messages.0.content"),
    ("/v1/chat/completions", f'{{"messages": [{{"role": "user", "content": "x"}}], "model": "{S}", "stream": true}}',
     "model"),
    ("/generate", f'{{"text": "x", "rid": "{S}"}}', "rid"),
    ("/generate", f'{{"text": "x", "rid": "{S}", "stream": true}}', "rid"),
    ("/generate", f'{{"text": "{S}", "stream": true}}', "text"),
    ("/generate", f'{{"text": "x", "sampling_params": {{"stop": "{S}"}}}}', "sampling_params.stop"),
]


@pytest.mark.parametrize("path,raw,param", SURROGATES)
def test_a_lone_surrogate_is_refused_naming_the_field(served, path, raw, param):
    assert_error(post_raw(served, path, raw), 400, code="invalid_request", param=param)


@pytest.mark.parametrize("path,body,param", [
    ("/v1/completions", {"prompt": ""}, "prompt"),
    ("/v1/completions", {"prompt": []}, "prompt"),
    ("/generate", {"text": ""}, "text"),
    ("/generate", {"input_ids": []}, "input_ids"),
])
def test_an_empty_prompt_is_refused(served, path, body, param):
    assert_error(served.client.post(path, json=body), 400, code="invalid_request", param=param, says="empty")


def test_stop_lists_are_bounded(served):
    too_many = [f"s{i}" for i in range(MAX_STOP_STRINGS + 1)]
    too_long = ["z" * (MAX_STOP_CHARS + 1)]
    for stop, says in ((too_many, f"at most {MAX_STOP_STRINGS}"), (too_long, f"at most {MAX_STOP_CHARS}")):
        assert_error(served.client.post("/v1/completions", json={"prompt": "x", "stop": stop}), 400,
                     param="stop", says=says)
        assert_error(served.client.post("/v1/chat/completions", json={"messages": CHAT, "stop": stop}), 400,
                     param="stop", says=says)
        assert_error(served.client.post("/generate", json={"text": "x", "sampling_params": {"stop": stop}}), 400,
                     param="sampling_params.stop", says=says)
    at_bounds = [f"{i:02d}" + "z" * (MAX_STOP_CHARS - 2) for i in range(MAX_STOP_STRINGS)]
    reply = served.client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2, "stop": at_bounds})
    assert reply.status_code == 200, reply.text


def test_max_tokens_beyond_the_context_is_capped(served):
    max_positions = served.engine.loaded.max_positions
    prompt = [65] * (max_positions - 3)  # leaves 3 positions, and the last one predicts a token more
    reply = served.client.post("/v1/completions", json={"prompt": prompt, "max_tokens": 10**12, "ignore_eos": True,
                                                        "temperature": 0})
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["completion_tokens"] == 4
    assert reply.json()["choices"][0]["finish_reason"] == "length"


def test_internal_errors_do_not_reach_the_client(seamed):
    for reply in (seamed.client.post("/v1/completions", json={"prompt": FAIL, "max_tokens": 1}),
                  seamed.client.post("/generate", json={"text": FAIL})):
        error = assert_error(reply, 500, code="internal_error")
        assert "secret" not in error["message"] and "CUDA" not in error["message"], error


def test_a_full_queue_answers_429_while_worker_threads_are_busy(seamed):
    """Requests that wait in the tokenizer hold the server's worker threads; a new request still
    gets its 429 (with Retry-After) while the queue is full and they are held."""
    tokenizer: SeamTokenizer = seamed.engine.tokenizer
    long = {"prompt": "long", "max_tokens": 3000, "ignore_eos": True, "temperature": 0, "stream": True}
    statuses: list[int] = []

    def post(body: dict) -> None:
        with httpx.Client(base_url=seamed.url, timeout=90) as client:
            statuses.append(client.post("/v1/completions", json=body).status_code)

    with seamed.client.stream("POST", "/v1/completions", json=long) as running:
        lines = running.iter_lines()
        assert any('"text":"' in line and '"text":""' not in line for line in lines)  # decoding
        [long_handle] = seamed.live.app.state.in_flight.handles()
        queued = threading.Thread(target=post, args=({"prompt": "queued", "max_tokens": 1},), daemon=True)
        queued.start()
        deadline = time.monotonic() + 30
        while seamed.engine.num_queued < 1:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        gated = [threading.Thread(target=post, args=({"prompt": GATE, "max_tokens": 1},), daemon=True)
                 for _ in range(48)]
        for thread in gated:
            thread.start()
        # Until each gated request is answered (429) or held in the tokenizer (all worker threads busy).
        while len(statuses) + tokenizer.held < 40 and time.monotonic() < deadline:
            time.sleep(0.01)
        try:
            reply = seamed.client.post("/v1/completions", json={"prompt": "probe", "max_tokens": 1}, timeout=20)
            assert not tokenizer.gate.is_set() and seamed.engine.num_queued == 1  # answered while full and held
            assert_error(reply, 429, code="queue_full", says="retry later")
            assert reply.headers["retry-after"] == "1"
        finally:
            tokenizer.gate.set()
        for thread in gated:
            thread.join(60)
        assert statuses.count(429) == len(gated)  # refused at once: never tokenized
    assert long_handle.result(30).finish_reason is FinishReason.ABORT
    queued.join(30)
    assert sorted(statuses) == [200] + [429] * len(gated)


def test_the_spec_documents_the_error_answers(served):
    spec = served.client.get("/openapi.json").json()
    for path in ("/v1/completions", "/v1/chat/completions", "/generate"):
        responses = spec["paths"][path]["post"]["responses"]
        assert {"400", "401", "413", "429", "503"} <= set(responses) and "422" not in responses, path
        assert responses["429"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
        assert "text/event-stream" in responses["200"]["content"]
    assert json.dumps(spec).count("HTTPValidationError") == 0
