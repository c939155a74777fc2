"""One run of ``chunkstore bench vllm`` in a process of its own: a vLLM engine (with the KV
connector the plan names, or none) driven step by step by one thread while the multi-turn
workload's clients submit to it; writes the requests' records as JSON, or the error that stopped it.

Invariants: only the engine thread touches the engine (clients hand it requests through a queue);
a request's TTFT runs from its client's submit to the step that returned its first token, and its
latency to the step that finished it (both ``time.perf_counter`` in this process); the replies are
greedy, ``output_length`` tokens, EOS ignored; a plan's ``history`` (a restart that continues)
precedes each client's conversation, token for token; with the chunkstore connector's first run,
the run ends only when the store holds every whole prompt block of the workload (or the wait times
out, reported). vLLM is imported inside ``main`` only.
``python -m chunkstore.bench.vllm_child PLAN.json RESULT.json PROGRESS_FD``.
"""

from __future__ import annotations

import faulthandler
import hashlib
import json
import os
import queue
import resource
import signal
import sys
import threading
import time
from dataclasses import dataclass, field

from chunkstore.bench.workload import Conversation, Reply, Workload, drive

IDLE_STEP_SLEEP_S = 0.001  # vLLM's own, in EngineCoreProc._process_engine_step
WARM_UP_SALT = "chunkstore-bench-warm-up"
# Each output token's best candidates are kept, so that a near tie of three or more (seen here:
# two tokens at the same logprob in one run, a third 0.016 nats below in another) is told apart.
BEST_K = 5  # its own namespace: the wait for the workload's blocks skips it


@dataclass(slots=True)
class _Pending:
    """One request between its client's submit and its last token (written by the engine thread)."""

    token_ids: list[int]
    salt: str | None
    submitted_s: float
    done: threading.Event = field(default_factory=threading.Event)
    output_ids: list[int] = field(default_factory=list)
    best: list[list[tuple[int, float]]] = field(default_factory=list)  # per output token: BEST_K (id, logprob)
    first_token_s: float | None = None
    finished_s: float | None = None
    cached_tokens: int = 0
    engine_ttft_s: float | None = None  # vLLM's own: arrival in add_request -> first token processed
    error: BaseException | None = None


class EngineLoop:
    """Runs ``engine.step()`` on one thread while requests are unfinished; ``generate`` blocks a
    client thread until its request ends. ``close`` stops the thread (requests in flight fail)."""

    def __init__(self, engine, params):
        self.engine, self.params = engine, params
        self._inbox: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._running: dict[str, _Pending] = {}
        self._next_id = 0
        self._thread = threading.Thread(target=self._run, name="bench-vllm-engine", daemon=True)
        self._thread.start()

    def generate(self, token_ids: list[int], salt: str | None = None) -> _Pending:
        """Submit and wait; raises RuntimeError when the engine failed the request."""
        pending = _Pending(list(token_ids), salt, time.perf_counter())
        self._inbox.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise RuntimeError(f"vLLM failed the request: {pending.error}") from pending.error
        return pending

    def close(self) -> None:
        self._inbox.put(None)
        self._thread.join()

    def _admit(self, pending: _Pending) -> None:
        prompt = {"prompt_token_ids": pending.token_ids}
        if pending.salt is not None:
            prompt["cache_salt"] = pending.salt
        request_id = f"bench-{self._next_id}"
        self._next_id += 1
        self.engine.add_request(request_id, prompt, self.params)
        self._running[request_id] = pending

    def _run(self) -> None:
        stopping = False
        while not stopping or self._running:
            try:
                block = not self._running and not stopping
                while True:  # admit everything submitted so far; wait only when idle
                    item = self._inbox.get(block=block)
                    block = False
                    if item is None:
                        stopping = True
                        continue
                    try:
                        self._admit(item)
                    except Exception as exc:  # noqa: BLE001  (refused, e.g. too long: that client fails)
                        item.error = exc
                        item.done.set()
            except queue.Empty:
                pass
            if not self._running:
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # noqa: BLE001  (the engine is unusable: fail every request in flight)
                for pending in self._running.values():
                    pending.error = exc
                    pending.done.set()
                self._running.clear()
                return
            now = time.perf_counter()
            if not outputs:
                # As vLLM's own engine loop (EngineCoreProc._process_engine_step) does when a step ran no
                # forward while requests wait (e.g. for a connector's background load): yield the GIL to
                # the transfer threads. Without it this loop starved the connector's loader (restart TTFT
                # 8x longer). An empty step is the sign here: LLMEngine.step does not say if it ran one.
                time.sleep(IDLE_STEP_SLEEP_S)
            for out in outputs:
                pending = self._running.get(out.request_id)
                if pending is None:
                    continue
                if pending.first_token_s is None and out.outputs[0].token_ids:
                    pending.first_token_s = now
                    metrics = getattr(out, "metrics", None)
                    pending.engine_ttft_s = getattr(metrics, "first_token_latency", None) or None
                pending.output_ids.extend(out.outputs[0].token_ids)  # DELTA: the new tokens only
                for position in out.outputs[0].logprobs or ():
                    best = sorted(position.items(), key=lambda kv: -kv[1].logprob)[:BEST_K]
                    pending.best.append([(token, float(lp.logprob)) for token, lp in best])
                pending.cached_tokens = out.num_cached_tokens or 0
                if out.finished:
                    pending.finished_s = now
                    del self._running[out.request_id]
                    pending.done.set()


def _prompt_sources_logger(totals: dict[str, int]):
    """A vLLM stat logger class that adds up where prompt tokens came from (vLLM's own
    PromptTokenStats: its prefix cache, an external KV transfer, or computed)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class PromptSources(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0):
            pass

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            stats = getattr(iteration_stats, "prompt_token_stats", None)
            if stats is not None:
                totals["computed"] += stats.computed
                totals["local_cache_hit"] += stats.local_cache_hit
                totals["external_kv_transfer"] += stats.external_kv_transfer

        def log_engine_initialized(self):
            pass

    return PromptSources


def _build_engine(plan: dict, totals: dict[str, int]):
    from vllm.config import KVTransferConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    transfer = KVTransferConfig(**plan["transfer"]) if plan["transfer"] is not None else None
    args = EngineArgs(model=plan["model"], enforce_eager=True, block_size=plan["block_size"],
                      enable_prefix_caching=plan["prefix_caching"], skip_tokenizer_init=True,
                      num_gpu_blocks_override=plan["kv_blocks"], max_model_len=plan["max_model_len"],
                      seed=plan["seed"], disable_log_stats=False, kv_transfer_config=transfer)
    return LLMEngine.from_engine_args(args, stat_loggers=[_prompt_sources_logger(totals)])


def _disable_amx() -> None:
    """vLLM's CPU attention picks its AMX kernel for bf16 in blocks of 32 wherever the CPU lists
    AMX; on this project's machines (VMs listing amx_tile and amx_bf16) that kernel dies with
    SIGILL on the first prefill with a cached prefix, connector or not (vLLM 0.32.0's CPU build).
    Every system here runs the AVX-512 kernel instead, alike; a GPU's attention never asks."""
    import torch

    if hasattr(torch, "cpu") and hasattr(torch.cpu, "_is_amx_tile_supported"):
        torch.cpu._is_amx_tile_supported = lambda: False


def _digest(token_ids: list[int]) -> str:
    """A short name of a prompt's tokens: two runs sent the same prompt when their digests match."""
    return hashlib.blake2b(json.dumps(token_ids).encode(), digest_size=8).hexdigest()


def _stored_chunks(data: str) -> int:
    """Chunks of the workload's namespace (the warm-up's salt has its own) in the store at ``data``."""
    from chunkstore.disk import ChunkStore, read_identity
    from chunkstore.disk.keys import DEFAULT_NAMESPACE

    identity = read_identity(data)
    if identity is None:
        return 0
    with ChunkStore(data, identity, read_only=True) as store:
        return sum(u.num_chunks for u in store.namespace_usage() if u.namespace == DEFAULT_NAMESPACE)


def _wait_for_chunks(data: str, expected: int, timeout_s: float) -> tuple[int, float]:
    """Until the store holds ``expected`` chunks of the workload: (chunks, seconds waited)."""
    t0 = time.perf_counter()
    while True:
        count = _stored_chunks(data)
        if count >= expected or time.perf_counter() - t0 > timeout_s:
            return count, time.perf_counter() - t0
        time.sleep(0.1)


def _run(plan: dict, progress) -> dict:
    started = time.perf_counter()
    _disable_amx()
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    totals = {"computed": 0, "local_cache_hit": 0, "external_kv_transfer": 0}
    engine = _build_engine(plan, totals)
    workload = Workload(**plan["workload"])
    history: dict[int, list[int]] = {int(c): ids for c, ids in (plan.get("history") or {}).items()}
    round_offset = plan.get("round_offset", 0)
    params = SamplingParams(max_tokens=workload.output_length, temperature=0.0, ignore_eos=True, logprobs=BEST_K,
                            output_kind=RequestOutputKind.DELTA)  # the best: near ties are told apart
    loop = EngineLoop(engine, params)
    startup_s = time.perf_counter() - started
    try:
        t0 = time.perf_counter()
        for _ in range(2):  # the first pays first-run costs; the second hits (vLLM's cache or the store)
            loop.generate(plan["warm_up_tokens"], salt=WARM_UP_SALT)
        warm_up_s = time.perf_counter() - t0
        totals.update(dict.fromkeys(totals, 0))
        progress.write("ready\n")

        sent: dict[tuple[int, int], dict] = {}

        def send(client: int, round_index: int, conversation: Conversation) -> Reply:
            ids: list[int] = list(history.get(client, ()))
            for i, question in enumerate(conversation.questions):
                ids += question.encode()  # ASCII bytes: token ids below 256, within the model's vocabulary
                if i < len(conversation.replies):
                    ids += conversation.replies[i].output_ids
            p = loop.generate(ids)
            sent[client, round_index] = {"engine_ttft_s": p.engine_ttft_s, "best": p.best,
                                         "prompt_digest": _digest(ids), "history": ids + p.output_ids}
            return Reply(text="", output_ids=tuple(p.output_ids), prompt_tokens=len(ids),
                         completion_tokens=len(p.output_ids), cached_tokens=p.cached_tokens, tier_tokens=None,
                         ttft_s=p.first_token_s - p.submitted_s, latency_s=p.finished_s - p.submitted_s)

        result = drive(workload, send, on_reply=lambda _: progress.write("reply\n"))
    finally:
        loop.close()
    sources = dict(totals)
    chunks = wait_s = None
    if plan.get("expected_chunks") is not None:
        chunks, wait_s = _wait_for_chunks(plan["chunkstore_data"], plan["expected_chunks"], plan["flush_timeout_s"])
    records, final_history = [], {}
    for r in result.records:
        extra = sent[r.client, r.round_index]
        records.append({"client": r.client, "round": r.round_index + round_offset, "sent_at_s": r.sent_at_s,
                        "output_ids": list(r.reply.output_ids), "prompt_tokens": r.reply.prompt_tokens,
                        "completion_tokens": r.reply.completion_tokens, "cached_tokens": r.reply.cached_tokens,
                        "ttft_s": r.reply.ttft_s, "latency_s": r.reply.latency_s,
                        "engine_ttft_s": extra["engine_ttft_s"], "best": extra["best"],
                        "prompt_digest": extra["prompt_digest"]})
        if r.round_index == workload.num_rounds - 1:
            final_history[r.client] = extra["history"]
    import vllm

    return {"vllm_version": vllm.__version__, "startup_s": startup_s, "warm_up_s": warm_up_s,
            "duration_s": result.duration_s, "records": records, "prompt_sources": sources,
            "chunks_stored": chunks, "chunk_wait_s": wait_s, "history": final_history,
            "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}  # Linux: KiB


def describe_error(exc: BaseException) -> str:
    """The reason a run stopped, as one line: the innermost exception of the chain (vLLM wraps a
    connector's error in its own), with the outermost's type when it differs."""
    root, seen = exc, {id(exc)}
    while (nxt := root.__cause__ or root.__context__) is not None and id(nxt) not in seen:
        seen.add(id(nxt))
        root = nxt
    text = f"{type(root).__name__}: {str(root).strip()}".splitlines()[0] if str(root).strip() else type(root).__name__
    return text if root is exc else f"{text} (raised as {type(exc).__name__})"


def _write_json(path: str, doc: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, path)


def main(plan_path: str, result_path: str, progress_fd: int) -> int:
    """Exit code 0 with the records in RESULT.json, or 1 with ``{"error": reason}`` there."""
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the parent asks for the stacks of a hung run
    with open(plan_path) as f:
        plan = json.load(f)
    progress = os.fdopen(progress_fd, "w", buffering=1)
    try:
        out = _run(plan, progress)
    except Exception as exc:  # noqa: BLE001  (the parent reports the system as failed, with this reason)
        import traceback

        traceback.print_exc()  # the whole story goes to the log
        _write_json(result_path, {"error": describe_error(exc)})
        progress.close()
        return 1
    _write_json(result_path, out)
    progress.write("done\n")
    progress.close()
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit("usage: python -m chunkstore.bench.vllm_child PLAN.json RESULT.json PROGRESS_FD")
    sys.exit(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
