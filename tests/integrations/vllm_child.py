"""A vLLM engine with the chunkstore connector in a fresh process, run by tests/integrations/test_vllm.py.

``python vllm_child.py MODEL DATA PLAN.json`` runs the plan's steps and prints one JSON line of
results. Steps: ``{"generate": [[token ids], ...], "salts": [...]}`` (greedy, 8 tokens each; one
batch), ``{"wait_chunks": N}`` (until the store holds N chunks: saves are written in the
background). vLLM keeps process-wide state, so each engine gets its own process.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

from vllm import LLM, SamplingParams  # noqa: E402
from vllm.config import KVTransferConfig  # noqa: E402

from chunkstore import ChunkStore  # noqa: E402
from chunkstore.disk.store_folder import read_identity  # noqa: E402


def main(model: str, data: str, plan_path: str) -> None:
    plan = json.loads(open(plan_path).read())
    config = KVTransferConfig(kv_connector="ChunkstoreConnector", kv_connector_module_path="chunkstore.integrations.vllm",
                              kv_role="kv_both", kv_load_failure_policy="recompute",
                              kv_connector_extra_config={"disk_path": data, "background_priority": "normal"})
    llm = LLM(model=model, enforce_eager=True, block_size=32, enable_prefix_caching=False, skip_tokenizer_init=True,
              kv_transfer_config=config)
    greedy = SamplingParams(max_tokens=8, temperature=0, ignore_eos=True)
    results = []
    for step in plan:
        if "generate" in step:
            salts = step.get("salts") or [None] * len(step["generate"])
            prompts = [{"prompt_token_ids": ids, **({"cache_salt": s} if s else {})}
                       for ids, s in zip(step["generate"], salts)]
            outs = llm.generate(prompts, greedy, use_tqdm=False)
            results.append([{"tokens": list(o.outputs[0].token_ids), "cached": o.num_cached_tokens or 0}
                            for o in outs])
        else:
            deadline = time.monotonic() + 60
            while True:
                identity = read_identity(data)
                count = 0
                if identity is not None:
                    with ChunkStore(data, identity, read_only=True) as store:
                        count = store.num_chunks()
                if count >= step["wait_chunks"] or time.monotonic() > deadline:
                    results.append(count)
                    break
                time.sleep(0.1)
    print("RESULTS " + json.dumps(results), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
