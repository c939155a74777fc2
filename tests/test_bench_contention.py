"""The contention figures of ``bench multiturn``: the forward's cost model, the contention factor,
the TTFT floor and the per-thread CPU accounting (contention.py)."""

from __future__ import annotations

import threading
import time

import pytest

from chunkstore.bench.contention import ForwardCost, contention_factor, thread_cpu_s, ttft_floor_avg_s
from chunkstore.bench.workload import Reply
from chunkstore.bench.multiturn_report import bounds, throughput_at_floor

COST = ForwardCost(fixed_s=5e-3, per_token_s=2e-4, per_pair_s=1e-7)


def _reply(prompt: int, cached: int, forward_s: float | None, tiers=None) -> Reply:
    return Reply(text="", output_ids=(), prompt_tokens=prompt, completion_tokens=1, cached_tokens=cached,
                 tier_tokens=tiers or {"device": cached, "host": 0, "disk": 0}, ttft_s=1.0, latency_s=1.0,
                 forward_s=forward_s)


def _replies(slowdown: float = 1.0) -> list[Reply]:
    shapes = [(96, 0), (196, 0), (300, 0), (404, 0), (200, 192), (304, 288), (500, 400), (120, 16)]
    return [_reply(p, c, slowdown * COST.predict(c, p - c)) for p, c in shapes]


def test_the_fit_recovers_the_fixed_per_token_and_attention_costs():
    fitted = ForwardCost.fit(_replies())
    assert fitted.fixed_s == pytest.approx(COST.fixed_s, rel=1e-6)
    assert fitted.per_token_s == pytest.approx(COST.per_token_s, rel=1e-6)
    assert fitted.per_pair_s == pytest.approx(COST.per_pair_s, rel=1e-6)


def test_a_term_the_data_push_below_zero_is_dropped():
    flat = ForwardCost(fixed_s=0.0, per_token_s=5e-4, per_pair_s=0.0)
    replies = [_reply(p, c, flat.predict(c, p - c) * (1.02 if i % 2 else 0.98)) for i, (p, c) in
               enumerate([(96, 0), (196, 0), (300, 0), (404, 0), (500, 0), (600, 0)])]
    fitted = ForwardCost.fit(replies)
    assert min(fitted.fixed_s, fitted.per_token_s, fitted.per_pair_s) >= 0
    assert contention_factor(replies, fitted) == pytest.approx(1.0, abs=0.02)


def test_the_contention_factor_is_measured_over_predicted_forward_time():
    assert contention_factor(_replies(), COST) == pytest.approx(1.0)
    assert contention_factor(_replies(slowdown=1.5), COST) == pytest.approx(1.5)
    assert contention_factor(_replies(), None) is None
    assert ForwardCost.fit([_reply(10, 0, 0.01), _reply(20, 0, 0.02)]) is None  # too few to fit


def test_the_floor_adds_the_load_cost_of_each_tier():
    r = _reply(200, 160, 0.01, tiers={"device": 32, "host": 64, "disk": 64})
    floor = ttft_floor_avg_s([r], COST, {"host": 1e-5, "disk": 1e-4})
    assert floor == pytest.approx(COST.predict(160, 40) + 64 * 1e-5 + 64 * 1e-4)
    assert ttft_floor_avg_s([r], COST, {"host": 1e-5, "disk": None}) is None  # disk tokens, no disk cost


def test_thread_cpu_counts_only_the_named_threads():
    stop = threading.Event()

    def spin():
        while not stop.is_set():
            sum(range(1000))

    worker = threading.Thread(target=spin, name="chunkstore-write_test")
    worker.start()
    try:
        time.sleep(0.5)
        busy = thread_cpu_s(("chunkstore-write",))
        assert busy is not None and busy > 0.05
        assert thread_cpu_s(("chunkstore-nothing-by-this-name",)) == 0.0
    finally:
        stop.set()
        worker.join()


def test_the_throughput_at_the_floor_takes_each_request_down_to_its_floor():
    # 10 requests in 2 s, each 0.05 s above its floor: at the floor they take 1.5 s
    run = {"num_requests": 10, "duration_s": 2.0, "ttft_served_avg_s": 0.15, "ttft_floor_avg_s": 0.10}
    assert throughput_at_floor(run) == pytest.approx(10 / 1.5)
    assert throughput_at_floor({**run, "ttft_floor_avg_s": None}) is None
    disk = {**run, "name": "device+host+disk", "throughput_at_floor_rps": 8.0}
    memory = {**run, "name": "device+host", "throughput_at_floor_rps": 5.0}
    assert bounds([disk, memory]) == {"disk_throughput_vs_device_host_at_floor": pytest.approx(1.6)}
    assert bounds([disk]) == {}
