"""A client that leaves cancels its non-streaming generation, as a stream's does: over real sockets to
real uvicorn, the tiny preset. The request ends as ``abort`` long before its ``max_tokens`` (4,000
tokens take the tiny preset about 15 s on two cores), its slot is free for the next request, and the
server counts it in ``requests_cancelled`` (stats) and ``chunkstore_requests_cancelled_total``."""

from __future__ import annotations

import json
import socket
import time

import pytest

from chunkstore.engine import FinishReason, RequestHandle

pytestmark = pytest.mark.slow  # generations of seconds: left out of the fast subset

MAX_TOKENS = 4000
WAIT_S = 30.0  # every wait is bounded; the generation left alone would run about 15 s on two cores


def _long(path: str, prompt: str) -> dict:
    if path == "/generate":
        return {"text": prompt, "sampling_params": {"max_new_tokens": MAX_TOKENS, "ignore_eos": True,
                                                    "temperature": 0}}
    if path == "/v1/chat/completions":
        return {"messages": [{"role": "user", "content": prompt}], "max_tokens": MAX_TOKENS, "ignore_eos": True,
                "temperature": 0}
    return {"prompt": prompt, "max_tokens": MAX_TOKENS, "ignore_eos": True, "temperature": 0}


def _post(url: str, path: str, body: dict) -> socket.socket:
    """Send a whole POST on a socket of its own and leave the answer unread."""
    host, port = url.removeprefix("http://").split(":")
    data = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)))
    sock.sendall(f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    return sock


def _running_handle(served) -> RequestHandle:
    deadline = time.monotonic() + WAIT_S
    while not (handles := served.live.app.state.in_flight.handles()):
        assert time.monotonic() < deadline, "the request never reached the engine"
        time.sleep(0.01)
    [handle] = handles
    return handle


def _metric(text: str, name: str) -> float:
    [line] = [line for line in text.splitlines() if line.startswith(name + " ")]
    return float(line.split()[1])


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/generate"])
def test_a_client_that_leaves_cancels_its_generation(served, path):
    before = served.engine.serving.snapshot()
    sock = _post(served.url, path, _long(path, f"left behind on {path}"))
    handle = _running_handle(served)
    time.sleep(0.5)  # generating, its client waiting for the whole answer
    assert not handle.is_done
    sock.close()

    result = handle.result(WAIT_S)
    assert result.finish_reason is FinishReason.ABORT
    assert 0 < result.completion_tokens < MAX_TOKENS
    deadline = time.monotonic() + WAIT_S
    while served.live.app.state.in_flight.handles() or served.engine.serving.snapshot().requests_active:
        assert time.monotonic() < deadline, "the engine never let go of the request"
        time.sleep(0.01)
    after = served.engine.serving.snapshot()
    assert after.requests_cancelled == before.requests_cancelled + 1
    assert after.requests_failed == before.requests_failed

    # The slot is free: the next request runs at once, and the figures show the cancelled one.
    reply = served.client.post("/v1/completions", json={"prompt": "next", "max_tokens": 2})
    assert reply.status_code == 200 and reply.json()["choices"][0]["finish_reason"] == "length"
    stats = served.client.get("/api/v1/stats").json()["serving"]
    assert stats["requests_cancelled"] == after.requests_cancelled
    metrics = served.client.get("/metrics").text
    assert _metric(metrics, "chunkstore_requests_cancelled_total") == after.requests_cancelled


def test_a_client_that_stays_gets_its_whole_answer(served):
    """The watch on the connection cancels nothing while the client waits."""
    before = served.engine.serving.snapshot().requests_cancelled
    reply = served.client.post("/generate", json={"text": "stay", "sampling_params": {
        "max_new_tokens": 40, "ignore_eos": True, "temperature": 0}})
    assert reply.status_code == 200, reply.text
    meta = reply.json()["meta_info"]
    assert meta["finish_reason"]["type"] == "length" and meta["completion_tokens"] == 40
    assert served.engine.serving.snapshot().requests_cancelled == before
