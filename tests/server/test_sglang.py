"""SGLang's native API over HTTP against a real uvicorn: /generate (text, input_ids, stream), /flush_cache,
/get_model_info."""

from __future__ import annotations

import json

from tests.helpers.server import PAGE_SIZE, STORY, disk_chunks, stream

GREEDY = {"temperature": 0.0, "max_new_tokens": 10}


def test_generate_text_then_cached(served):
    body = {"text": "generate: " + STORY, "sampling_params": GREEDY}
    first = served.client.post("/generate", json=body).json()
    second = served.client.post("/generate", json=body).json()
    meta = first["meta_info"]
    prompt_tokens = len(body["text"].encode()) + 1
    assert meta["prompt_tokens"] == prompt_tokens and meta["completion_tokens"] == 10
    assert meta["finish_reason"] == {"type": "length", "length": 10}
    assert meta["cached_tokens"] == 0 and meta["cached_tokens_details"] == {"device": 0, "host": 0, "disk": 0}
    assert len(first["output_ids"]) == 10 and isinstance(meta["id"], str) and meta["e2e_latency"] > 0
    assert second["text"] == first["text"] and second["output_ids"] == first["output_ids"]
    cached = second["meta_info"]["cached_tokens"]
    assert cached == (prompt_tokens - 1) // PAGE_SIZE * PAGE_SIZE > 0
    assert second["meta_info"]["cached_tokens_details"]["device"] == cached


def test_generate_input_ids_equals_text(served):
    text = "input ids: " + STORY
    by_text = served.client.post("/generate", json={"text": text, "sampling_params": GREEDY}).json()
    by_ids = served.client.post("/generate", json={"input_ids": [256, *text.encode()], "sampling_params": GREEDY,
                                                   "rid": "req-1"}).json()
    assert by_ids["output_ids"] == by_text["output_ids"] and by_ids["text"] == by_text["text"]
    assert by_ids["meta_info"]["id"] == "req-1"


def test_next_turn_from_output_ids_hits_the_reply(served):
    ids = [256, *("turns: " + STORY).encode()]
    first = served.client.post("/generate", json={"input_ids": ids, "sampling_params": {
        "max_new_tokens": 40, "temperature": 0, "ignore_eos": True}}).json()
    follow_up = list(b"\n<|user|>\nand then?\n<|assistant|>\n")
    second = served.client.post("/generate", json={"input_ids": ids + first["output_ids"] + follow_up,
                                                   "sampling_params": GREEDY}).json()
    fed = len(ids) + len(first["output_ids"]) - 1  # the last sampled token is returned, not fed
    assert second["meta_info"]["cached_tokens"] == fed // PAGE_SIZE * PAGE_SIZE > len(ids) - PAGE_SIZE


def test_generate_stream_is_cumulative(served):
    body = {"text": "generate stream: " + STORY, "sampling_params": GREEDY}
    whole = served.client.post("/generate", json=body).json()
    events = stream(served.client, "/generate", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    texts = [c["text"] for c in chunks]
    assert all(b.startswith(a) for a, b in zip(texts, texts[1:], strict=False))  # each event has the text so far
    assert texts[-1] == whole["text"]
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    counts = [c["meta_info"]["completion_tokens"] for c in chunks]
    assert counts == sorted(counts) and 0 < counts[0] and counts[-2] <= 10  # tokens streamed so far
    last = chunks[-1]
    assert last["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    assert last["meta_info"]["completion_tokens"] == 10 and last["output_ids"] == whole["output_ids"]
    assert last["meta_info"]["cached_tokens"] > 0


def test_sglang_benchmark_payload_runs_unchanged(served):
    """The body SGLang's benchmark/hicache/bench_multiturn.py sends, read the way it reads the stream."""
    payload = {"text": "bench: " + STORY, "sampling_params": {"temperature": 0.0, "max_new_tokens": 8,
                                                              "ignore_eos": True},
               "stream": True, "lora_path": "", "return_logprob": False, "logprob_start_len": -1}
    generated = ""
    with served.client.stream("POST", "/generate", json=payload) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            chunk = line.strip().removeprefix("data: ")
            if chunk and chunk != "[DONE]":
                data = json.loads(chunk)
                if data["text"]:
                    generated = data["text"]
    assert generated == served.client.post("/generate", json={**payload, "stream": False}).json()["text"]


def test_unsupported_sampling_params_are_refused(served):
    for params, field in (({"top_k": 5}, "top_k"), ({"n": 2}, "n"), ({"stop_token_ids": [1]}, "stop_token_ids"),
                          ({"repetition_penalty": 1.2}, "repetition_penalty")):
        reply = served.client.post("/generate", json={"text": "x", "sampling_params": params})
        assert reply.status_code == 400, params
        assert reply.json()["error"]["param"] == f"sampling_params.{field}"
    neutral = {"top_k": -1, "min_p": 0.0, "n": 1, "repetition_penalty": 1.0, "max_new_tokens": 1}
    assert served.client.post("/generate", json={"text": "x", "sampling_params": neutral}).status_code == 200
    for body in ({"sampling_params": {}}, {"text": "x", "input_ids": [1]}, {"text": ["a", "b"]}):
        reply = served.client.post("/generate", json=body)
        assert reply.status_code == 400 and reply.json()["error"]["message"], body


def test_flush_cache_writes_down_then_empties_memory(served):
    body = {"text": "flush: " + STORY, "sampling_params": GREEDY}
    first = served.client.post("/generate", json=body).json()
    cached_before = served.engine.stats().device.cached_pages
    reply = served.client.post("/flush_cache")
    assert reply.status_code == 200 and reply.text.startswith("Cache flushed.")
    stats = served.engine.stats()
    assert stats.device.cached_pages == 0 and stats.host.cached_pages == 0  # emptied, as SGLang's
    assert stats.disk.num_chunks >= cached_before > 0  # every page went down to disk first
    assert disk_chunks(served.engine.cache.config.disk_path) == stats.disk.num_chunks
    again = served.client.post("/generate", json=body).json()  # served from disk, same output
    assert again["output_ids"] == first["output_ids"]
    details = again["meta_info"]["cached_tokens_details"]
    assert details["disk"] > 0 and details["device"] == 0
    refused = served.client.get("/flush_cache")  # it changes state: POST only (SGLang's tools send POST)
    assert refused.status_code == 405 and refused.json()["error"]["code"] == "method_not_allowed"


def test_flush_cache_refused_while_a_request_is_in_flight(served):
    # Long enough (about 10 s here, more on a busy machine) that it is still running when the flush
    # is asked (400 tokens took 2 s, and a loaded CI machine once finished them first); leaving the
    # stream cancels the rest.
    body = {"text": "in flight: " + STORY, "stream": True,
            "sampling_params": {"temperature": 0.0, "max_new_tokens": 2000, "ignore_eos": True}}
    with served.client.stream("POST", "/generate", json=body) as response:
        next(response.iter_lines())  # the first event: the request is running
        reply = served.client.post("/flush_cache")
    assert reply.status_code == 400 and "in flight" in reply.text


def test_get_model_info(served):
    info = served.client.get("/get_model_info").json()
    assert info["model_path"] == "tiny" and info["is_generation"] is True
    assert info["model_id"].startswith("preset:tiny:") and info["page_size"] == PAGE_SIZE
