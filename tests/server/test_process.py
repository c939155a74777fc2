"""`chunkstore serve` as a real process: kill -9 then restart, SIGTERM shutdown, namespaces across restarts."""

from __future__ import annotations

import json
import signal

import pytest

from tests.helpers.server import PAGE_SIZE, STORY, disk_chunks, wait_for_disk_chunks

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset

GREEDY = {"max_tokens": 16, "temperature": 0}


def fed_pages(usage: dict) -> int:
    """Whole pages a finished request leaves in the cache: its prompt and the tokens fed back."""
    return (usage["prompt_tokens"] + usage["completion_tokens"] - 1) // PAGE_SIZE


def prompt_pages_tokens(usage: dict) -> int:
    """Prompt tokens a later identical request can take from the cache (never the last one)."""
    return (usage["prompt_tokens"] - 1) // PAGE_SIZE * PAGE_SIZE


def complete(server, prompt: str, namespace: str | None = None) -> dict:
    headers = {"X-Chunkstore-Namespace": namespace} if namespace else {}
    reply = server.client.post("/v1/completions", json={"prompt": prompt, **GREEDY}, headers=headers)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_kill9_then_restart_serves_persisted_prefixes_from_disk(serve_process, tmp_path):
    data = tmp_path / "data"
    alice_prompt, default_prompt = "alice's document: " + STORY, "the default namespace: " + STORY * 2
    first = serve_process()
    before_alice = complete(first, alice_prompt, "alice")
    before_default = first.client.post("/generate", json={"text": default_prompt, "sampling_params": {
        "max_new_tokens": 16, "temperature": 0}}).json()
    meta = before_default["meta_info"]
    wait_for_disk_chunks(data, fed_pages(before_alice["usage"]) + (meta["prompt_tokens"] + 15) // PAGE_SIZE)
    first.signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL

    second = serve_process()
    after_alice = complete(second, alice_prompt, "alice")
    assert after_alice["choices"][0]["text"] == before_alice["choices"][0]["text"]  # greedy: same output
    usage = after_alice["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == prompt_pages_tokens(usage) > 0
    assert usage["cached_tokens_details"]["disk"] == usage["prompt_tokens_details"]["cached_tokens"]
    for other in ("bob", None):  # another namespace, and the default one, do not see Alice's pages
        assert complete(second, alice_prompt, other)["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    after_default = second.client.post("/generate", json={"text": default_prompt, "sampling_params": {
        "max_new_tokens": 16, "temperature": 0}}).json()
    assert after_default["output_ids"] == before_default["output_ids"]
    assert after_default["meta_info"]["cached_tokens_details"]["disk"] > 0
    assert complete(second, alice_prompt, "alice")["usage"]["cached_tokens_details"]["device"] > 0  # loaded back


def test_sigterm_lets_streams_end_then_persists_and_exits_0(serve_process, tmp_path):
    data = tmp_path / "data"
    prompt = "kept in memory until shutdown: " + STORY
    server = serve_process("--write-policy", "write_back", "--shutdown-timeout-s", "1")
    before = complete(server, prompt)
    assert disk_chunks(data) == 0  # write-back: nothing goes down before an eviction or the shutdown
    long = {"text": "a long answer", "stream": True,
            "sampling_params": {"max_new_tokens": 4000, "ignore_eos": True, "temperature": 0}}
    events = []
    with server.client.stream("POST", "/generate", json=long) as response:
        lines = response.iter_lines()
        for line in lines:
            if line:
                events.append(line)
                break
        server.signal(signal.SIGTERM)
        events += [line for line in lines if line]  # the stream goes on until the grace period ends
    assert events[-1] == "data: [DONE]"
    last = json.loads(events[-2].removeprefix("data: "))
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < last["meta_info"]["completion_tokens"] < 4000
    assert server.wait() == 0, server.output()
    assert disk_chunks(data) >= fed_pages(before["usage"])  # the shutdown flushed the memory tiers

    again = serve_process()
    after = complete(again, prompt)
    assert after["choices"][0]["text"] == before["choices"][0]["text"]
    assert after["usage"]["cached_tokens_details"]["disk"] == prompt_pages_tokens(after["usage"]) > 0


def test_two_models_share_one_data_folder_at_once(serve_process, tmp_path):
    data = tmp_path / "data"
    tiny = serve_process()
    small = serve_process("--preset", "small")  # another model over the same --disk-path: no mismatch
    assert f"data in {data}\n" in tiny.output()
    assert f"data in {data / 'models'}/" in small.output()
    for server in (tiny, small):
        complete(server, "two models, one folder: " + STORY)
        assert complete(server, "two models, one folder: " + STORY)["usage"]["prompt_tokens_details"][
            "cached_tokens"] > 0
    for server in (tiny, small):
        server.signal(signal.SIGTERM)
        assert server.wait() == 0
    again = serve_process("--preset", "small")  # a restart finds its own store again
    assert complete(again, "two models, one folder: " + STORY)["usage"]["cached_tokens_details"]["disk"] > 0
