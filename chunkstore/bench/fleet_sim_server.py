"""One simulated server of ``bench fleet --simulate-servers``: a process of its own, with its own
store (its own folder, local copy, connection pool and threads) on the shared tier, replaying its
requests of the trace (fleet_trace.py) with no model. A request is what a server asks of its disk
tier: a prefix lookup, a load of the pages hit, and a put of the pages it would have computed
(the prompt's pages past the hit and the answer's).

Invariants: requests run at their scheduled times (open loop: a late one runs at once and its
lateness is recorded), one at a time; the KV bytes are random and reused (the keys, not the bytes,
decide what the tier does; the codec is off, so encoding costs no CPU to speak of).

Protocol with the parent (fleet_scale.py), one line each on stdout and stdin: the plan is JSON in
argv[1]; the child prints ``ready`` once its store is open, reads the trace's start (epoch
seconds), replays, prints ``done``, waits for a line, closes its store and writes its result
(JSON) to argv[2]. The AWS_* variables of the parent reach the bucket.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from chunkstore.bench.fleet_trace import Request, TraceConfig, schedule, tokens

KV_POOL_PAGES = 16  # random pages whose bytes every put reuses


@dataclass(frozen=True, slots=True)
class ServerPlan:
    server: int
    trace: TraceConfig
    folder: str
    index_url: str
    object_store: str
    capacity_bytes: int | None
    local_copy_bytes: int
    identity: dict  # ModelIdentity's fields

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ServerPlan:
        raw = json.loads(text)
        return cls(**{**raw, "trace": TraceConfig(**raw["trace"])})


def replay(plan: ServerPlan, start_at: float, store) -> list[dict]:
    """This server's requests of the trace, each at ``start_at`` + its time; one record each."""
    import torch

    from chunkstore.disk.keys import chain_pages

    identity = store.identity
    generator = torch.Generator().manual_seed(plan.server)
    kv = [torch.randn(identity.page_shape, generator=generator).to(store.torch_dtype) for _ in range(KV_POOL_PAGES)]
    outs = [torch.empty(identity.page_shape, dtype=store.torch_dtype)
            for _ in range(plan.trace.rounds * plan.trace.pages_per_round)]
    mine = [r for r in schedule(plan.trace) if r.server == plan.server]
    records = []
    for request in mine:
        wait_s = start_at + request.at_s - time.time()
        if wait_s > 0:
            time.sleep(wait_s)
        records.append(_serve(plan, request, store, chain_pages, kv, outs, late_s=max(0.0, -wait_s)))
    return records


def _serve(plan: ServerPlan, request: Request, store, chain_pages, kv, outs, late_s: float) -> dict:
    prompt, answer = tokens(plan.trace, request)
    pages = chain_pages(store.identity, prompt + answer, namespace=request.namespace)
    asked = pages[:len(prompt) // plan.trace.page_size]
    began = time.perf_counter()
    hit = store.longest_prefix([p.key for p in asked])
    lookup_s = time.perf_counter() - began
    load_s, loaded, local_hits = None, 0, 0
    if hit:
        hits_before = _local_copy_hits(store)
        began = time.perf_counter()
        ok = store.get_into(asked[:hit], outs[:hit])
        load_s = time.perf_counter() - began
        local_hits = _local_copy_hits(store) - hits_before
        while loaded < hit and ok[loaded]:  # a page evicted since the lookup: computed again from there
            loaded += 1
    new = pages[loaded:]
    lock_before, room_before = store.evictor_lock_stats(), store.room_lock_stats()
    began = time.perf_counter()
    result = store.put(new, [kv[i % len(kv)] for i in range(len(new))])
    publish_s = time.perf_counter() - began
    lock, room = store.evictor_lock_stats(), store.room_lock_stats()
    return {"at_s": request.at_s, "late_s": late_s, "lookup_s": lookup_s, "hit_pages": hit, "load_s": load_s,
            "loaded_pages": loaded, "local_copy_hits": local_hits, "publish_s": publish_s, "put_pages": len(new),
            "stored": len(result.stored), "deduplicated": len(result.deduplicated), "failed": len(result.failed),
            # the put's passes through the fleet's evictor lock (a bounded tier's), from the store's own counts
            "lock_passes": lock.acquired - lock_before.acquired, "lock_held_s": lock.held_s - lock_before.held_s,
            "lock_waited_s": lock.waited_s - lock_before.waited_s,
            # and through its room lock (a bounded put's row commits within a capacity)
            "room_passes": room.acquired - room_before.acquired, "room_held_s": room.held_s - room_before.held_s,
            "room_waited_s": room.waited_s - room_before.waited_s}


def _local_copy_hits(store) -> int:
    """Reads the store's local copy has served so far (0 without one): no database statement."""
    copy = store.payloads.local_copy_stats()
    return 0 if copy is None else copy.hits


def open_plan_store(plan: ServerPlan):
    from chunkstore.disk.codec import Codec
    from chunkstore.disk.identity import ModelIdentity
    from chunkstore.disk.store_spec import StoreSpec, open_store

    spec = StoreSpec(Path(plan.folder), index_url=plan.index_url, object_store=plan.object_store,
                     local_copy_bytes=plan.local_copy_bytes, capacity_bytes=plan.capacity_bytes, codec=Codec.NONE)
    return open_store(spec, ModelIdentity(**plan.identity))


def main(argv: list[str]) -> int:
    plan = ServerPlan.from_json(Path(argv[1]).read_text())
    store = open_plan_store(plan)
    try:
        print("ready", flush=True)
        start_at = float(sys.stdin.readline())
        records = replay(plan, start_at, store)
        print("done", flush=True)
        sys.stdin.readline()
        shared = store.stats().shared
        copy = shared.local_copy if shared is not None else None
        result = {"server": plan.server, "requests": records,
                  "local_copy": None if copy is None else {"hits": copy.hits, "misses": copy.misses,
                                                           "fills": copy.fills}}
    finally:
        store.close()
    Path(argv[2]).write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
