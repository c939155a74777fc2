"""The OpenAI-compatible API over HTTP against a real uvicorn: models, completions, chat, streaming, usage."""

from __future__ import annotations

from chunkstore.server.settings import ServerSettings
from tests.helpers.server import PAGE_SIZE, STORY, stream

GREEDY = {"temperature": 0, "max_tokens": 12}


def test_health_and_models(served):
    assert served.client.get("/health").json() == {"status": "ok"}
    models = served.client.get("/v1/models").json()
    assert models["object"] == "list"
    [card] = models["data"]
    assert card["id"] == "tiny" and card["object"] == "model" and card["max_model_len"] == 4096
    assert served.client.get("/v1/models/tiny").json()["id"] == "tiny"
    missing = served.client.get("/v1/models/gpt-4")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_completion_reports_cached_tokens_on_the_second_request(served):
    body = {"model": "tiny", "prompt": "completion: " + STORY, **GREEDY}
    first = served.client.post("/v1/completions", json=body).json()
    second = served.client.post("/v1/completions", json=body).json()
    assert first["object"] == "text_completion" and first["model"] == "tiny" and first["id"].startswith("cmpl-")
    [choice] = first["choices"]
    assert choice["finish_reason"] == "length" and choice["index"] == 0 and choice["logprobs"] is None
    usage = first["usage"]
    prompt_tokens = len(body["prompt"].encode()) + 1  # the byte tokenizer's BOS
    assert usage["prompt_tokens"] == prompt_tokens and usage["completion_tokens"] == 12
    assert usage["total_tokens"] == prompt_tokens + 12
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage["cached_tokens_details"] == {"device": 0, "host": 0, "disk": 0}
    assert second["choices"][0]["text"] == choice["text"]  # greedy, now over a cached prefix
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (prompt_tokens - 1) // PAGE_SIZE * PAGE_SIZE > 0
    assert second["usage"]["cached_tokens_details"] == {"device": cached, "host": 0, "disk": 0}


def test_completion_from_token_ids_equals_the_same_text(served):
    text = "token ids: " + STORY
    ids = [256, *text.encode()]  # what the byte tokenizer makes of the text
    by_text = served.client.post("/v1/completions", json={"prompt": text, **GREEDY}).json()
    by_ids = served.client.post("/v1/completions", json={"prompt": ids, **GREEDY}).json()
    one_of_a_batch = served.client.post("/v1/completions", json={"prompt": [ids], **GREEDY}).json()
    assert by_ids["choices"][0]["text"] == by_text["choices"][0]["text"] == one_of_a_batch["choices"][0]["text"]
    assert by_ids["usage"]["prompt_tokens"] == len(ids)


def test_chat_completion(served):
    body = {"model": "tiny", "messages": [{"role": "system", "content": "Be brief."},
                                          {"role": "user", "content": [{"type": "text", "text": "chat: " + STORY}]}],
            **GREEDY}
    reply = served.client.post("/v1/chat/completions", json=body).json()
    assert reply["object"] == "chat.completion" and reply["id"].startswith("chatcmpl-")
    [choice] = reply["choices"]
    assert choice["message"]["role"] == "assistant" and isinstance(choice["message"]["content"], str)
    assert choice["finish_reason"] == "length" and reply["usage"]["completion_tokens"] == 12
    again = served.client.post("/v1/chat/completions", json=body).json()
    assert again["choices"][0]["message"]["content"] == choice["message"]["content"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def test_chat_stream_with_usage(served):
    body = {"messages": [{"role": "user", "content": "chat stream: " + STORY}], **GREEDY}
    whole = served.client.post("/v1/chat/completions", json=body).json()
    events = stream(served.client, "/v1/chat/completions",
                    {**body, "stream": True, "stream_options": {"include_usage": True}})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["id"] == chunks[0]["id"] for c in chunks)
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[1:-1])
    assert content == whole["choices"][0]["message"]["content"]
    finish = chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "length" and finish["delta"] == {}
    assert all(c["usage"] is None for c in chunks[:-1])  # include_usage: null until the last chunk
    usage_chunk = chunks[-1]
    assert usage_chunk["choices"] == [] and usage_chunk["usage"]["completion_tokens"] == 12
    assert usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the request above cached it


def test_completion_stream_without_usage(served):
    body = {"prompt": "completion stream: " + STORY, **GREEDY}
    whole = served.client.post("/v1/completions", json=body).json()
    events = stream(served.client, "/v1/completions", {**body, "stream": True})
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all("usage" not in c and c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == whole["choices"][0]["text"]
    assert [c["choices"][0]["finish_reason"] for c in chunks][-1] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])


def test_sampling_fields(served):
    base = {"prompt": "sampling: " + STORY, "max_tokens": 20, "temperature": 1.0, "top_p": 0.9, "ignore_eos": True}
    a = served.client.post("/v1/completions", json={**base, "seed": 7}).json()
    b = served.client.post("/v1/completions", json={**base, "seed": 7}).json()
    assert a["choices"][0]["text"] == b["choices"][0]["text"] and a["usage"]["completion_tokens"] == 20
    greedy = served.client.post("/v1/completions", json={"prompt": "sampling: " + STORY, **GREEDY}).json()
    text = greedy["choices"][0]["text"]
    stop = text[3:5] if len(text) >= 5 else None
    if stop:  # a random model's text: stop at what it would print at characters 3-4
        stopped = served.client.post("/v1/completions", json={"prompt": "sampling: " + STORY, "stop": [stop],
                                                              **GREEDY}).json()
        assert stopped["choices"][0]["finish_reason"] == "stop"
        assert stopped["choices"][0]["text"] == text[:text.index(stop)]
    zero = served.client.post("/v1/completions", json={"prompt": "prefill only: " + STORY, "max_tokens": 0}).json()
    assert zero["choices"][0]["text"] == "" and zero["usage"]["completion_tokens"] == 0


def test_user_field_and_header_choose_the_namespace(served):
    body = {"prompt": "namespaces: " + STORY, **GREEDY}

    def cached(**kwargs) -> int:
        reply = served.client.post("/v1/completions", **kwargs).json()
        return reply["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert cached(json={**body, "user": "alice"}) == 0
    assert cached(json={**body, "user": "alice"}) > 0
    assert cached(json=body, headers={"X-Chunkstore-Namespace": "alice"}) > 0  # the same namespace
    assert cached(json={**body, "user": "bob"}) == 0
    assert cached(json={**body, "user": "alice"}, headers={"X-Chunkstore-Namespace": "carol"}) == 0  # header wins
    assert cached(json=body) == 0  # "default"


def test_the_management_api_reports_the_servers_own_address(served):
    """Under `chunkstore serve` the management API shares the server's port (not admin's 8001)."""
    response = served.client.get("/api/v1/config")
    assert response.status_code == 200, response.text
    admin = response.json()["admin"]
    assert (admin["host"], admin["port"]) == ("127.0.0.1", ServerSettings().port)
