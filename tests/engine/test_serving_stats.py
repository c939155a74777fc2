"""ServingStats: counters and histograms of what the engine served, thread-safe, fed by the handles' completions."""

from __future__ import annotations

import threading

from chunkstore.cache.stats import LATENCY_BUCKETS_S, Histogram
from chunkstore.engine import Engine
from chunkstore.engine.request import FinishReason, GenerationResult, Request
from chunkstore.engine.sampling import SamplingParams
from chunkstore.engine.serving_stats import ServingStats
from tests.helpers.engine import cache_config, random_ids


def result(prompt: int = 10, cached: int = 4, completion: int = 3, ttft_s: float = 0.02,
           latency_s: float = 0.1) -> GenerationResult:
    return GenerationResult(request_id=1, text="", token_ids=(1,) * completion, finish_reason=FinishReason.STOP,
                            prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached,
                            device_tokens=cached, host_tokens=0, disk_tokens=0, queue_s=0.0, prefill_s=0.01,
                            forward_s=0.008, ttft_s=ttft_s, latency_s=latency_s, seed=0)


def test_histogram_buckets():
    h = Histogram().observed(0.0005).observed(0.003).observed(1e6)
    assert h.count == 3 and abs(h.total - (0.0035 + 1e6)) < 1e-6
    cumulative = h.cumulative()
    assert cumulative[0] == (0.0005, 1)  # a bound is inclusive
    assert dict(cumulative)[0.005] == 2 and cumulative[-1] == (float("inf"), 3)
    assert len(cumulative) == len(LATENCY_BUCKETS_S) + 1


def test_counts_finished_failed_and_refused():
    stats = ServingStats()
    assert stats.snapshot().ttft_avg_s is None
    for _ in range(3):
        stats.record_accepted()
    assert stats.snapshot().requests_active == 3
    stats.record_not_queued()  # the queue refused one
    stats.record_completed(result(ttft_s=0.02, latency_s=0.1))
    stats.record_completed(None, RuntimeError("boom"))
    s = stats.snapshot()
    assert (s.requests_total, s.requests_failed, s.requests_active) == (2, 1, 0)
    assert (s.prompt_tokens_total, s.cached_tokens_total, s.completion_tokens_total) == (10, 4, 3)
    assert s.ttft_count == 1 and s.ttft_avg_s == s.ttft_sum_s == 0.02 and s.latency_sum_s == 0.1
    assert s.ttft.count == 1 and s.latency.count == 1


def test_no_time_to_first_token_without_a_token():
    stats = ServingStats()
    stats.record_accepted()
    stats.record_completed(result(completion=0, ttft_s=5.0))
    s = stats.snapshot()
    assert s.requests_total == 1 and s.ttft_count == 0 and s.ttft.count == 0 and s.latency.count == 1


def test_thread_safe():
    stats = ServingStats()

    def work():
        for _ in range(500):
            stats.record_accepted()
            stats.record_completed(result())

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    s = stats.snapshot()
    assert s.requests_total == 2000 and s.requests_active == 0 and s.completion_tokens_total == 6000
    assert s.latency.count == 2000 and s.ttft_count == 2000


def test_the_engine_records_each_request(tiny, tmp_path):
    with Engine(tiny, cache_config(tmp_path)) as engine:
        prompt = random_ids(40, seed=3)
        params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
        first = engine.generate(Request(token_ids=prompt, params=params), timeout_s=60)
        second = engine.generate(Request(token_ids=prompt, params=params), timeout_s=60)
        s = engine.serving.snapshot()  # recorded before the handle wakes its caller
    assert (s.requests_total, s.requests_failed, s.requests_active) == (2, 0, 0)
    assert s.prompt_tokens_total == 80 and s.completion_tokens_total == 8
    assert s.cached_tokens_total == first.cached_tokens + second.cached_tokens > 0
    assert s.ttft_count == 2 and abs(s.ttft_sum_s - first.ttft_s - second.ttft_s) < 1e-9
    assert abs(s.latency_sum_s - first.latency_s - second.latency_s) < 1e-9
