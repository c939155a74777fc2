"""`chunkstore bench multiturn --url` against a real `chunkstore serve` app on loopback (the tiny
model): the chat history it builds is one the server's cache hits, so the measured hit rate is the
workload's ideal (nothing is evicted at this size), and the per-tier split is the server's own; the
page size and the model come from the server. A client that resends the history as text (SGLang's
bench_multiturn.py) hits all the cache holds: a preset's replies are text that re-encodes to the
same ids. Timing is never asserted."""

from __future__ import annotations

import argparse
import json

import pytest

from chunkstore.bench import multiturn as bench
from tests.helpers.server import PAGE_SIZE, STORY


def test_url_mode_against_chunkstore_serve(served, tmp_path):
    out = tmp_path / "url.json"
    argv = ["--url", served.url, "--configs", "no-cache,server", "--num-clients", "3", "--num-rounds", "3",
            "--request-length", "40", "--output-length", "3", "--page-size", str(PAGE_SIZE),
            "--request-rate", "inf", "--no-progress", "--output", str(out)]
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    assert bench.run(parser.parse_args(argv)) == 0
    runs = {r["name"]: r for r in json.loads(out.read_text())["runs"]}
    assert runs["no-cache"]["hit_rate"] == 0.0  # a fresh namespace per request
    server = runs["server"]
    assert server["completion_tokens"] == 3 * 3 * 3 and server["num_requests"] == 9
    assert 0 < server["hit_rate"] == pytest.approx(server["ideal_hit_rate"])
    assert server["hit_rate_by_tier"]["device"] == pytest.approx(server["hit_rate"])
    assert 0 < server["ttft_avg_s"] <= server["latency_avg_s"]


def run_bench(url: str, out, *extra: str) -> int:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    argv = ["--url", url, "--num-clients", "2", "--num-rounds", "3", "--request-length", "40",
            "--request-rate", "inf", "--no-progress", "--output", str(out), *extra]
    return bench.run(parser.parse_args(argv))


def test_long_text_replies_resent_as_chat_history_hit_all_the_cache_holds(served, tmp_path):
    """Replies of 50 tokens span whole pages: every one of them must come back as a hit."""
    out = tmp_path / "long.json"
    assert run_bench(served.url, out, "--output-length", "50") == 0  # no --page-size: the server's
    doc = json.loads(out.read_text())
    assert doc["budgets"]["page_size"] == PAGE_SIZE and doc["model"]["name"] == "tiny"
    assert doc["model"]["model_id"] == served.client.get("/get_model_info").json()["model_id"]
    server = doc["runs"][0]
    assert server["completion_tokens"] == 2 * 3 * 50
    assert server["hit_rate"] == pytest.approx(server["ideal_hit_rate"]) and server["hit_rate_vs_ideal"] == 1.0


def test_a_page_size_other_than_the_servers_is_refused(served, tmp_path, capsys):
    assert run_bench(served.url, tmp_path / "x.json", "--page-size", str(PAGE_SIZE * 4)) == 2
    err = capsys.readouterr().err
    assert f"--page-size {PAGE_SIZE * 4} disagrees with the server's page size {PAGE_SIZE}" in err


def test_sglang_style_text_history_over_generate_hits_every_cached_page(served):
    """SGLang's bench_multiturn.py: POST /generate with the history as text; each round appends the
    reply's text and a new question. Cached = the previous prompt and fed reply, whole pages."""
    history, previous = "sglang-style client: " + STORY, None
    for round_index in range(4):
        body = {"text": history, "sampling_params": {"temperature": 0.0, "max_new_tokens": 37, "ignore_eos": True}}
        reply = served.client.post("/generate", json=body)
        assert reply.status_code == 200, reply.text
        meta = reply.json()["meta_info"]
        if previous is not None:
            fed = previous["prompt_tokens"] + previous["completion_tokens"] - 1  # the last token is not fed
            assert meta["cached_tokens"] == fed // PAGE_SIZE * PAGE_SIZE, round_index
        previous = meta
        history += reply.json()["text"] + f" question {round_index}: what next?"
