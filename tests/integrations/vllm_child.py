"""A vLLM engine with the chunkstore connector in a fresh process, run by tests/integrations/test_vllm.py.

``python vllm_child.py MODEL DATA PLAN.json`` runs the plan and prints one JSON line of results.
The plan: ``{"extra": {...} (more kv_connector_extra_config), "block_size": 32, "steps": [...]}``.
Steps: ``{"generate": [[token ids], ...], "salts": [...]}`` (greedy, 8 tokens each; one batch;
the result: per prompt its tokens and vLLM's cached-token count, and the tokens the connector's
cache found on each tier), ``{"follow_up": k, "add": [token ids]}`` (the next turn of step k's
first prompt: it, its reply, then ``add``), ``{"stats": true}`` (``chunkstore stats --json`` on
the data folder while the engine holds it), ``{"wait_chunks": N}`` (until the store holds N chunks: saves are written
in the background). vLLM keeps process-wide state, so each engine gets its own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402

# vLLM's CPU attention picks its AMX kernel for bf16 in blocks of 32 wherever the CPU lists AMX. On a
# machine of this project's (a VM listing amx_tile and amx_bf16) that kernel dies with SIGILL on
# the first prefill that has a cached prefix, with or without chunkstore (vLLM 0.32.0's CPU build).
# These tests check the connector, not vLLM's kernel choice: they run its AVX-512 kernel.
torch.cpu._is_amx_tile_supported = lambda: False

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402

from chunkstore.disk import FileKeyProvider, StoreSpec, open_store  # noqa: E402
from chunkstore.disk.store_folder import read_identity  # noqa: E402
from chunkstore.integrations.vllm import local_caches  # noqa: E402


def tier_tokens() -> dict[str, int]:
    """Tokens the connector's cache in this process has found, by tier, so far."""
    out: dict[str, int] = {}
    for cache in local_caches():
        for tier, n in cache.stats().hit_tokens.items():
            out[tier.value] = out.get(tier.value, 0) + n
    return out


def wait_chunks(data: str, count: int, extra: dict) -> int:
    deadline = time.monotonic() + 60
    while True:
        identity = read_identity(data)
        found = 0
        if identity is not None:  # (on a shared tier's index and bucket when the extra config names them)
            seal_key = FileKeyProvider(Path(extra["seal_key"])) if extra.get("seal_key") else None
            spec = StoreSpec(data, index_url=extra.get("index_url"), object_store=extra.get("object_store"),
                             read_only=True, seal_key=seal_key)
            with open_store(spec, identity) as store:
                found = store.num_chunks()
        if found >= count or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def main(model: str, data: str, plan_path: str) -> None:
    plan = json.loads(open(plan_path).read())
    extra = {"disk_path": data, "background_priority": "normal", **plan.get("extra", {})}
    config = KVTransferConfig(kv_connector="ChunkstoreConnector", kv_connector_module_path="chunkstore.integrations.vllm",
                              kv_role="kv_both", kv_load_failure_policy="recompute", kv_connector_extra_config=extra)
    llm = LLM(model=model, enforce_eager=True, block_size=plan.get("block_size", 32), enable_prefix_caching=False,
              skip_tokenizer_init=True, kv_transfer_config=config)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    results = []
    for step in plan["steps"]:
        if "wait_chunks" in step:
            results.append(wait_chunks(data, step["wait_chunks"], extra))
            continue
        if "stats" in step:  # the CLI beside the engine, which holds the store for writing
            out = subprocess.run([sys.executable, "-m", "chunkstore", "stats", "--disk-path", data, "--json"],
                                 capture_output=True, text=True, timeout=120)
            results.append(json.loads(out.stdout) if out.returncode == 0 else {"error": out.stderr[-2000:]})
            continue
        if "follow_up" in step:  # the next turn of step k's first conversation
            earlier = plan["steps"][step["follow_up"]]["generate"][0]
            step["generate"] = [earlier + results[step["follow_up"]]["outputs"][0]["tokens"] + step["add"]]
        salts = step.get("salts") or [None] * len(step["generate"])
        prompts = [{"prompt_token_ids": ids, **({"cache_salt": s} if s else {})}
                   for ids, s in zip(step["generate"], salts)]
        before = tier_tokens()
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        after = tier_tokens()
        results.append({"outputs": [{"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens or 0}
                                    for o in outs],
                        "tiers": {tier: n - before.get(tier, 0) for tier, n in after.items() if n > before.get(tier, 0)}})
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
