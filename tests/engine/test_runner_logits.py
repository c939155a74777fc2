"""Logits computed on a cached prefix equal a full recompute, whichever tier the prefix came from.

Tolerances (docs/ENGINE.md#tolerances): the pool and the model share one dtype, so a page comes
back from any tier bit for bit (test_kv_pages.py); what differs is the compute. A full recompute
runs every position in one forward, a cached prefill ran the prefix in an earlier, shorter forward
and runs only the rest now, and PyTorch's CPU kernels (SDPA blocking, small-M GEMM paths) pick
their reduction order from the shapes. Measured on this machine over 30 random prompts and
splits: fp32 is bit-identical in 2 of 3 cases and never off by more than 2.4e-6 on logits of
magnitude ~4 (about 20 float32 ulps); bf16 is identical in 28 of 30 and off by at most 0.031
(two bf16 ulps at 4). The bounds below leave ~4x headroom and are still orders of magnitude
below what a wrong page, position or layer does (``test_wrong_kv_is_caught``: > 0.1).
"""

from __future__ import annotations

import torch

from chunkstore.cache.tiered import TieredCache
from chunkstore.engine import ModelRunner, load_model
from tests.helpers.engine import PAGE_SIZE, cache_config, random_ids

FP32_TOL = 1e-5  # relative to the largest reference logit
BF16_TOL = 1 / 32
NS = "default"


def max_rel_diff(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max() / ref.abs().max())


def prefill_and_compare(runner: ModelRunner, tokens: list[int], tol: float, *, namespace: str = NS):
    """Prefill ``tokens`` through the cache; check every computed position against a full
    recompute; return the sequence (finished)."""
    seq = runner.prefill(tokens, namespace, all_logits=True)
    try:
        ref = runner.full_logits(tokens)[seq.cached_tokens:]
        assert seq.logits.shape == ref.shape
        diff = max_rel_diff(seq.logits, ref)
        assert diff <= tol, f"cached prefill differs from a full recompute by {diff:.3g} (relative)"
        assert torch.equal(seq.logits.argmax(-1), ref.argmax(-1)) or tol > FP32_TOL
        print(f"cached {seq.cached_tokens} (device {seq.device_tokens}, host {seq.host_tokens}, "
              f"disk {seq.disk_tokens}): exact={torch.equal(seq.logits, ref)} max rel diff {diff:.3g}")
    finally:
        runner.finish(seq)
    return seq


def run(runner: ModelRunner, tokens: list[int], namespace: str = NS):
    seq = runner.prefill(tokens, namespace)
    runner.finish(seq)
    return seq


def device_hit_logits(loaded, tmp_path, prefix: list[int], prompt: list[int]) -> torch.Tensor:
    """Logits of ``prompt`` prefilled on ``prefix``'s pages straight from the device pool of a
    fresh cache: what the same split gives with no tier below the device involved."""
    config = cache_config(tmp_path / "device-only", use_disk=False)
    with TieredCache.open(config, loaded.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(loaded, cache)
        run(runner, prefix)
        seq = runner.prefill(prompt, NS, all_logits=True)
        runner.finish(seq)
        assert seq.device_tokens == len(prefix) // PAGE_SIZE * PAGE_SIZE
        return seq.logits


def test_device_hit_equals_full_recompute(tiny, tmp_path):
    prompt = random_ids(1000, seed=1)
    with TieredCache.open(cache_config(tmp_path), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        first = prefill_and_compare(runner, prompt[:600], FP32_TOL)
        assert first.cached_tokens == 0 and first.inserted_pages == 600 // PAGE_SIZE
        seq = prefill_and_compare(runner, prompt, FP32_TOL)
        assert seq.cached_tokens == seq.device_tokens == 592  # 37 whole pages of the 600


def test_fully_cached_page_aligned_prompt_still_computes_its_last_token(tiny, tmp_path):
    prompt = random_ids(4 * PAGE_SIZE, seed=2)
    with TieredCache.open(cache_config(tmp_path), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        run(runner, prompt)
        seq = prefill_and_compare(runner, prompt, FP32_TOL)
        assert seq.cached_tokens == 3 * PAGE_SIZE and seq.logits.shape[0] == PAGE_SIZE
        cache.flush()
        stats = cache.stats()  # the re-inserted last page's slot was given back, nothing leaked
        assert stats.device.used_pages == stats.device.cached_pages == 4
        assert stats.device.locked_pages == 0


def test_host_hit_equals_full_recompute(tiny, tmp_path):
    prompt = random_ids(130, seed=3)
    with TieredCache.open(cache_config(tmp_path, device_pages=8, host_pages=32), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        run(runner, prompt[:90])  # 5 pages, written through to the host
        run(runner, random_ids(8 * PAGE_SIZE + 1, seed=4))  # 8 pages: evicts the 5 from the device
        # The 8 stay locked until their write-through backup lands, and a match's load-back does
        # not wait for that (it takes the room there is): let the backups land first.
        cache.flush()
        seq = prefill_and_compare(runner, prompt, FP32_TOL)
        assert (seq.device_tokens, seq.host_tokens, seq.disk_tokens) == (0, 80, 0)
    # The pages crossed the tiers bit for bit: the same split from the device gives the same bits.
    assert torch.equal(seq.logits, device_hit_logits(tiny, tmp_path, prompt[:90], prompt))


def test_disk_hit_equals_full_recompute(tiny, tmp_path):
    prompt = random_ids(130, seed=5)
    with TieredCache.open(cache_config(tmp_path, device_pages=8, host_pages=8), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        run(runner, prompt[:90])
        cache.flush()  # the 5 pages are on disk
        run(runner, random_ids(8 * PAGE_SIZE + 1, seed=6))
        cache.flush()  # backing up these 8 pages pushed the 5 out of host memory
        seq = prefill_and_compare(runner, prompt, FP32_TOL)
        assert (seq.device_tokens, seq.host_tokens, seq.disk_tokens) == (0, 0, 80)
    assert torch.equal(seq.logits, device_hit_logits(tiny, tmp_path, prompt[:90], prompt))


def test_disk_hit_after_restart_equals_full_recompute(tiny, tmp_path):
    prompt = random_ids(700, seed=7)
    config = cache_config(tmp_path)
    with TieredCache.open(config, tiny.identity(PAGE_SIZE)) as cache:
        run(ModelRunner(tiny, cache), prompt[:500])
        cache.close(flush=True)
    reloaded = load_model("tiny")  # the same seeded weights, built again
    assert reloaded.model_id == tiny.model_id
    with TieredCache.open(config, reloaded.identity(PAGE_SIZE)) as cache:
        seq = prefill_and_compare(ModelRunner(reloaded, cache), prompt, FP32_TOL)
        assert seq.disk_tokens == seq.cached_tokens == 496
    assert torch.equal(seq.logits, device_hit_logits(tiny, tmp_path, prompt[:500], prompt))


def test_bf16_device_and_restart_within_tolerance(tiny_bf16, tmp_path):
    prompt = random_ids(800, seed=8)
    config = cache_config(tmp_path)
    with TieredCache.open(config, tiny_bf16.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny_bf16, cache)
        run(runner, prompt[:300])
        assert prefill_and_compare(runner, prompt[:600], BF16_TOL).device_tokens == 288
        cache.close(flush=True)
    with TieredCache.open(config, tiny_bf16.identity(PAGE_SIZE)) as cache:
        seq = prefill_and_compare(ModelRunner(tiny_bf16, cache), prompt, BF16_TOL)
        assert seq.disk_tokens == 592


def test_wrong_kv_is_caught(tiny, tmp_path):
    """The tolerance is meaningful: one cached page served for another page's tokens (a key mix-up)
    moves the logits far past it. (Swapping two pages would not: K is stored after RoPE, so a page
    carries its positions, and attention is a sum over (K, V) pairs in any order.)"""
    prompt = random_ids(200, seed=9)
    with TieredCache.open(cache_config(tmp_path, write_policy="write_back"), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        run(runner, prompt[:100])
        seq = runner.prefill(prompt, NS)
        slots = seq.hit.device_slots[:2].tolist()
        runner.finish(seq)
        buffer = cache.device_pool.buffer
        buffer[slots[0]] = buffer[slots[1]].clone()
        seq = runner.prefill(prompt, NS, all_logits=True)
        assert seq.cached_tokens == 192
        diff = max_rel_diff(seq.logits, runner.full_logits(prompt)[192:])
        runner.finish(seq)
        print(f"one wrong page: max rel diff {diff:.3g}")
        assert diff > 100 * FP32_TOL, diff


def test_batched_decode_equals_one_decode_each(tiny, tmp_path):
    """Sequences of different lengths (one from a cache hit) fed in one forward: each row equals
    its own single decode within the fp32 tolerance, over several steps, and the sequences stay
    consistent (their KV and token ids grow by one each step)."""
    with TieredCache.open(cache_config(tmp_path), tiny.identity(PAGE_SIZE)) as cache:
        runner = ModelRunner(tiny, cache)
        prompts = [random_ids(n, seed=n) for n in (5, 37, 120)]
        warm = runner.prefill(prompts[2], NS)
        runner.finish(warm)  # the third prompt's pages are now cached: its batch row starts from a hit
        batched = [runner.prefill(p, NS) for p in prompts]
        single = [runner.prefill(p, NS) for p in prompts]
        assert batched[2].cached_tokens > 0
        try:
            for step in range(3):
                tokens = [7 + step, 65 + step, 200 + step]
                rows = runner.decode_batch(batched, tokens)
                for seq, ref_seq, token, row in zip(single, batched, tokens, rows, strict=True):
                    ref = runner.decode(seq, token)
                    assert max_rel_diff(row, ref) <= FP32_TOL and torch.equal(row.argmax(), ref.argmax())
                    assert ref_seq.num_tokens == seq.num_tokens == ref_seq.kv.get_seq_length()
        finally:
            for seq in batched + single:
                runner.abort(seq)
