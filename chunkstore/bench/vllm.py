"""``chunkstore bench vllm``: the multi-turn chat workload on vLLM's own engine without the chunkstore
connector, with it over a fresh data folder, and after a restart over that folder (files made cold).

Invariants: each configuration runs in a new process (vLLM keeps process-wide state; vllm_child.py)
with the same model, workload, block size, KV block budget (``num_gpu_blocks_override``, smaller
than the histories, so vLLM's own cache evicts), forward threads and prefix caching (on by default:
the CPU build supports it, and it is the baseline a vLLM user has); TTFT is measured per request,
from the client's submit to the engine step that returned its first token (the child drives
``LLMEngine.step``, outputs streamed as deltas), never derived; greedy outputs must be the same in
all three, request by request, but for near ties (NEAR_TIE_NATS), or the run fails; targets are
reported, never asserted. vLLM and
torch are imported only when the benchmark runs, so ``--help`` works without them.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import math
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from tqdm import tqdm

from chunkstore.bench.common import (
    Target,
    files_under,
    make_cold,
    record_targets,
    run_bench,
    verdict_line,
)
from chunkstore.bench.workload import DriveResult, Reply, RequestRecord, Workload
from chunkstore.output import add_output_arguments

PROG = "chunkstore bench vllm"
CONNECTOR_MODULE = "chunkstore.integrations.vllm"  # reached through vLLM's KVTransferConfig only
PRIORITIES = ("normal", "low", "idle")  # chunkstore.priority.ThreadPriority
ENV_HINT = ("run scripts/vllm_env.sh and use that environment's interpreter: .venv-vllm/bin/chunkstore bench vllm "
            "(or .venv-vllm/bin/python -m chunkstore bench vllm)")
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention takes blocks of a multiple of 32 tokens
# vLLM's own warnings when a connector's load fails: its tokens are recomputed (kv_load_failure_policy
# "recompute") or the requests fail; num_cached_tokens still counts them, so the run reports them.
_RECOVERED = re.compile(r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens affected\)")
_FAILED = re.compile(r"Failing (\d+) request\(s\) due to KV load failure \(failure_policy=\w+, (\d+) tokens affected\)")
# Two greedy runs may part where two tokens are nearly tied: bf16 KV computed in another batch or
# chunk differs in its last bits (vLLM's own prefix cache does the same). A divergence counts as a
# near tie only when each run's pick was the other's second choice, within this many nats; any
# other difference fails the run, as wrong KV would.
NEAR_TIE_NATS = 0.1
KV_SHARE = 0.25  # vLLM's KV blocks / all clients' final histories, by default
WARM_UP_TOKEN_BASE = 256  # warm-up ids sit above the questions' bytes, so they share no block


@dataclass(frozen=True, slots=True)
class ModelShape:
    """The random-weight Llama made when no --model is given (bf16; head size 64, the CPU
    attention's): a prompt token takes ~0.25 ms of prefill on 2 cores here, its KV is 4 KiB."""

    num_layers: int = 8
    hidden_size: int = 1024
    intermediate_size: int = 2048
    num_heads: int = 16
    num_kv_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 512  # the questions are ASCII bytes; replies are any id of the vocabulary

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2  # K and V, bf16

    def save(self, folder: Path) -> None:
        """Write the model (weights drawn from seed 0, nothing downloaded) to ``folder``."""
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # a bar for one small shard says nothing

        config = LlamaConfig(vocab_size=self.vocab_size, hidden_size=self.hidden_size,
                             intermediate_size=self.intermediate_size, num_hidden_layers=self.num_layers,
                             num_attention_heads=self.num_heads, num_key_value_heads=self.num_kv_heads,
                             head_dim=self.head_dim, max_position_embeddings=4096)
        torch.manual_seed(0)
        LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


class Setup(str, enum.Enum):
    """The configurations, in the order they run (restart needs vllm+chunkstore's folder)."""

    VLLM = "vllm"
    CONNECTOR = "vllm+chunkstore"
    RESTART = "restart"

    @property
    def description(self) -> str:
        return _DESCRIPTIONS[self]


_DESCRIPTIONS = {
    Setup.VLLM: "vLLM alone (its own prefix cache when on)",
    Setup.CONNECTOR: "vLLM with the chunkstore connector over a fresh data folder",
    Setup.RESTART: "a new vLLM process with the connector over the folder vllm+chunkstore left, files made cold",
}


class BenchFailure(RuntimeError):
    """A configuration's engine failed, or the configurations' greedy outputs differ."""


@dataclass(slots=True)
class VLLMBenchConfig:
    """What to run; ValueError names a bad field."""

    workload: Workload = field(default_factory=Workload)
    model_path: Path | None = None  # a local Hugging Face model folder; None: ModelShape() made here
    block_size: int = 32
    kv_blocks: int | None = None  # vLLM's KV cache in blocks; None: derived (see derive_kv_blocks)
    prefix_caching: bool = True
    background_priority: str | None = None  # the connector's writer; None: its default
    forward_threads: int | None = None  # OpenMP threads of the forward; None: all cores but one
    work_dir: Path | None = None  # parent of the temporary folder
    timeout_s: float = 300.0  # longest run of one configuration's process (a default one takes ~30 s)
    flush_timeout_s: float = 120.0  # longest wait for the connector's saves after a run
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size % 16:
            raise ValueError(f"--block-size must be a positive multiple of 16, got {self.block_size}")
        if self.kv_blocks is not None and self.kv_blocks < self.min_kv_blocks:
            raise ValueError(f"--kv-blocks {self.kv_blocks} cannot hold one client's last request "
                             f"({self.max_model_len} tokens): at least {self.min_kv_blocks}")
        if self.forward_threads is not None and self.forward_threads < 1:
            raise ValueError(f"--forward-threads must be >= 1, got {self.forward_threads}")
        if not self.timeout_s > 0 or not self.flush_timeout_s > 0:
            raise ValueError("--timeout-s must be > 0")
        if self.background_priority is not None and self.background_priority not in PRIORITIES:
            raise ValueError(f"unknown priority {self.background_priority!r}; valid: {', '.join(PRIORITIES)}")
        if self.model_path is not None and not (Path(self.model_path) / "config.json").is_file():
            raise ValueError(f"--model {self.model_path}: not a model folder (no config.json)")
        if self.work_dir is not None and not Path(self.work_dir).is_dir():
            raise ValueError(f"--work-dir {self.work_dir} is not an existing folder")

    @property
    def threads(self) -> int:
        # All cores but one, as vLLM's own CPU launcher reserves one for what is not the forward: its
        # OpenMP threads spin on their cores, so any other thread there (the connector's loads and
        # writes, vLLM's scheduler) stalls every parallel region, where a GPU server's forward has a
        # device of its own. Measured on 2 cores, default workload: with both cores to the forward,
        # vllm+chunkstore's TTFT was 1.05x vLLM alone's and restart's 0.41x; with one, 0.60x and
        # 0.22x (vLLM alone's own TTFT 1.5x its two-core figure).
        return self.forward_threads if self.forward_threads is not None else max(1, (os.cpu_count() or 2) - 1)

    @property
    def max_model_len(self) -> int:
        """A client's whole history, in whole blocks."""
        return math.ceil(self.workload.final_history_tokens / self.block_size) * self.block_size

    @property
    def min_kv_blocks(self) -> int:
        return self.max_model_len // self.block_size + 1  # vLLM keeps block 0 as its null block

    @property
    def history_blocks(self) -> int:
        return self.workload.num_clients * (self.max_model_len // self.block_size)

    def derive_kv_blocks(self) -> int:
        """A quarter of all clients' final histories, but room for the requests in flight (each up
        to a whole history) and vLLM's null block: vLLM must not preempt, only evict."""
        w = self.workload
        per_client = self.max_model_len // self.block_size
        return max(round(self.history_blocks * KV_SHARE), min(w.max_parallel, w.num_clients) * per_client + 1)

    def expected_chunks(self) -> int:
        """Whole prompt blocks of the workload (each round's prompt extends the previous one)."""
        w = self.workload
        return w.num_clients * (w.prompt_tokens(w.num_rounds - 1) // self.block_size)

    def warm_up_tokens(self) -> list[int]:
        rng = np.random.default_rng(self.workload.seed + 1)
        n = self.workload.prompt_tokens(self.workload.num_rounds - 1)
        return [int(x) for x in rng.integers(WARM_UP_TOKEN_BASE, 2 * WARM_UP_TOKEN_BASE, n)]


# ---- one configuration -----------------------------------------------------------------------------

def _progress(cfg: VLLMBenchConfig, desc: str) -> tqdm:
    return tqdm(total=cfg.workload.num_requests, desc=desc, unit="req", file=sys.stderr, leave=False,
                dynamic_ncols=True, disable=not cfg.show_progress or not sys.stderr.isatty())


def _child_env(cfg: VLLMBenchConfig) -> dict[str, str]:
    import chunkstore

    env = dict(os.environ)
    env["OMP_NUM_THREADS"] = str(cfg.threads)
    env.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in the child itself
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # a bound for the CPU worker's check; the blocks are fixed
    env.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    root = str(Path(chunkstore.__file__).resolve().parent.parent)  # the child imports this chunkstore
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def run_configuration(cfg: VLLMBenchConfig, setup: Setup, plan: dict, work: Path) -> dict:
    """Run one configuration's process to its end; returns what it wrote. Raises BenchFailure
    (with the end of its log) when it fails or outlives ``cfg.timeout_s``."""
    import json

    plan_path, result_path, log_path = (work / f"{setup.name.lower()}.{ext}" for ext in ("plan.json", "result.json",
                                                                                           "log"))
    plan_path.write_text(json.dumps(plan))
    read_fd, write_fd = os.pipe()
    started = time.perf_counter()
    with open(log_path, "wb") as log, _progress(cfg, f"{setup.value}: starting vLLM") as bar:
        proc = subprocess.Popen([sys.executable, "-m", "chunkstore.bench.vllm_child", str(plan_path),
                                 str(result_path), str(write_fd)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, pass_fds=(write_fd,), env=_child_env(cfg))
        os.close(write_fd)
        buffered = b""
        try:
            while True:  # the child writes one line per event; EOF when it exits
                left = cfg.timeout_s - (time.perf_counter() - started)
                if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                    _stop_hung(proc)
                    raise BenchFailure(f"{setup.value} ran past --timeout-s {cfg.timeout_s:g} (the stacks of its "
                                       f"threads end its log){_log_tail(log_path, 80)}")
                chunk = os.read(read_fd, 4096)
                if not chunk:
                    break
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line == b"ready":
                        bar.set_description(setup.value)
                    elif line == b"reply":
                        bar.update()
            code = proc.wait(timeout=max(1.0, cfg.timeout_s - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            _stop_hung(proc)
            raise BenchFailure(f"{setup.value} did not exit within --timeout-s {cfg.timeout_s:g}") from None
        finally:
            os.close(read_fd)
    if code != 0 or not result_path.exists():
        raise BenchFailure(f"{setup.value}: vLLM's process exited with {code}{_log_tail(log_path)}")
    out = json.loads(result_path.read_text())
    out["wall_s"] = time.perf_counter() - started
    out["load_failures"] = load_failures(log_path.read_text(errors="replace"))
    return out


def load_failures(log: str) -> dict[str, int]:
    """The KV load failures vLLM logged in a child's log: requests and tokens affected."""
    requests = tokens = 0
    for pattern in (_RECOVERED, _FAILED):
        for match in pattern.finditer(log):
            requests += int(match.group(1))
            tokens += int(match.group(2))
    return {"requests": requests, "tokens": tokens}


def _stop_hung(proc: subprocess.Popen) -> None:
    """Have a hung child write its threads' stacks to its log (faulthandler, SIGUSR1), then kill it."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    proc.kill()
    proc.wait()


def _log_tail(path: Path, lines: int = 25) -> str:
    text = path.read_text(errors="replace").strip().splitlines() if path.exists() else []
    return ("; the end of its log:\n" + "\n".join(text[-lines:])) if text else ""


# ---- figures ---------------------------------------------------------------------------------------

def summarize(setup: Setup, cfg: VLLMBenchConfig, got: dict) -> dict:
    """One configuration's figures: summarize_run's (the multi-turn benchmark's definitions) that a
    vLLM run measures, and what only vLLM reports (imported here: the report imports torch, --help must not)."""
    from chunkstore.bench.multiturn_report import summarize_run

    records = [RequestRecord(r["client"], r["round"], r["sent_at_s"],
                             Reply(text="", output_ids=tuple(r["output_ids"]), prompt_tokens=r["prompt_tokens"],
                                   completion_tokens=r["completion_tokens"], cached_tokens=r["cached_tokens"],
                                   tier_tokens=None, ttft_s=r["ttft_s"], latency_s=r["latency_s"]))
               for r in got["records"]]
    full = summarize_run(setup.value, setup.description, DriveResult(records, got["duration_s"]), None,
                         page_size=cfg.block_size, bytes_per_token=None)
    keep = ("name", "description", "num_requests", "prompt_tokens", "cached_tokens", "completion_tokens", "hit_rate",
            "ideal_hit_rate", "ttft_avg_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "latency_avg_s",
            "latency_p90_s", "duration_s", "throughput_rps", "input_tokens_per_s", "output_tokens_per_s")
    run = {k: full[k] for k in keep}
    sources = got["prompt_sources"]
    total = sum(sources.values())
    run["hit_rate_by_source"] = {"vllm": sources["local_cache_hit"] / total if total else None,
                                 "chunkstore": sources["external_kv_transfer"] / total if total else None}
    engine = [r["engine_ttft_s"] for r in got["records"] if r["engine_ttft_s"] is not None]
    run["ttft_vllm_avg_s"] = float(np.mean(engine)) if len(engine) == len(records) else None
    run.update({"startup_s": got["startup_s"], "warm_up_s": got["warm_up_s"], "wall_s": got["wall_s"],
                "chunks_stored": got["chunks_stored"], "chunk_wait_s": got["chunk_wait_s"],
                "load_failures": got["load_failures"]})
    return run


def _is_near_tie(top2: list, other_token: int) -> bool:
    """Whether ``other_token`` was this run's second choice, within NEAR_TIE_NATS of its first."""
    return len(top2) == 2 and top2[1][0] == other_token and top2[0][1] - top2[1][1] <= NEAR_TIE_NATS


def compare_outputs(got: dict[Setup, dict]) -> dict:
    """Each configuration's greedy tokens against vllm's, client by client, round by round, up to a
    client's first difference (its later prompts hold its own replies, so they differ). Raises
    BenchFailure naming the request when a difference is not a near tie; returns the comparison."""
    def by_request(setup: Setup) -> dict[tuple[int, int], dict]:
        return {(r["client"], r["round"]): r for r in got[setup]["records"]}

    base = by_request(Setup.VLLM)
    compared, near_ties = 0, []
    for setup in (Setup.CONNECTOR, Setup.RESTART):
        other = by_request(setup)
        for client in sorted({c for c, _ in base}):
            for round_index in sorted(r for c, r in base if c == client):
                b, o = base[client, round_index], other.get((client, round_index))
                if o is None:
                    raise BenchFailure(f"{setup.value} lacks client {client} round {round_index}")
                compared += 1
                if o["output_ids"] == b["output_ids"]:
                    continue
                i = next((k for k, (x, y) in enumerate(zip(b["output_ids"], o["output_ids"])) if x != y), None)
                if i is not None and _is_near_tie(b["top2"][i], o["output_ids"][i]) \
                        and _is_near_tie(o["top2"][i], b["output_ids"][i]):
                    near_ties.append({"configuration": setup.value, "client": client, "round": round_index,
                                      "token_index": i, "gap_nats": [b["top2"][i][0][1] - b["top2"][i][1][1],
                                                                     o["top2"][i][0][1] - o["top2"][i][1][1]]})
                    break  # this client's later prompts hold another reply
                raise BenchFailure(f"{setup.value} generated other tokens than vllm for client {client} round "
                                   f"{round_index}: {o['output_ids']} vs {b['output_ids']} (not a near tie: "
                                   f"best two {o['top2'][i] if i is not None else '-'} vs "
                                   f"{b['top2'][i] if i is not None else '-'})")
    return {"identical": not near_ties, "compared_requests": compared, "near_tie_nats": NEAR_TIE_NATS,
            "near_tie_divergences": near_ties}


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def run_vllm_bench(cfg: VLLMBenchConfig) -> dict:
    """All three configurations, then the ratios and the targets; returns the dict the table and
    the JSON show. Everything is written under a temporary folder (in ``cfg.work_dir`` when
    given), removed after. Raises BenchFailure when a configuration fails or outputs differ,
    ImportError when vLLM cannot be imported."""
    with contextlib.redirect_stdout(sys.stderr):  # before any work; vLLM's logger binds the stream it finds
        import vllm  # noqa: F401

    started = time.perf_counter()
    load_average = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chunkstore-bench-vllm-", dir=cfg.work_dir))
    kv_blocks = cfg.kv_blocks if cfg.kv_blocks is not None else cfg.derive_kv_blocks()
    shape = None if cfg.model_path is not None else ModelShape()
    data = work / "kv"
    try:
        model = str(cfg.model_path) if cfg.model_path is not None else str(work / "model")
        if shape is not None:
            shape.save(Path(model))
        base = {"model": model, "block_size": cfg.block_size, "kv_blocks": kv_blocks,
                "max_model_len": cfg.max_model_len, "prefix_caching": cfg.prefix_caching, "seed": cfg.workload.seed,
                "workload": asdict(cfg.workload), "warm_up_tokens": cfg.warm_up_tokens(),
                "connector_module": CONNECTOR_MODULE, "background_priority": cfg.background_priority,
                "flush_timeout_s": cfg.flush_timeout_s}
        got: dict[Setup, dict] = {}
        cold_method = None
        for setup in Setup:
            plan = dict(base, data=None if setup is Setup.VLLM else str(data),
                        expected_chunks=cfg.expected_chunks() if setup is Setup.CONNECTOR else None)
            if setup is Setup.RESTART:
                cold_method = make_cold(files_under(data))
            got[setup] = run_configuration(cfg, setup, plan, work)
        store_bytes = sum(p.stat().st_size for p in files_under(data))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    outputs = compare_outputs(got)

    runs = [summarize(s, cfg, got[s]) for s in Setup]
    plain, connector, restart = runs
    result = {
        "model": {"name": cfg.model_path.name if cfg.model_path is not None else "random-weight Llama (made here)",
                  "path": str(cfg.model_path) if cfg.model_path is not None else None,
                  "shape": asdict(shape) if shape is not None else None, "dtype": "bfloat16" if shape else None,
                  "kv_bytes_per_token": shape.kv_bytes_per_token if shape else None},
        "vllm_version": got[Setup.VLLM]["vllm_version"],
        "block_size": cfg.block_size,
        "kv_blocks": kv_blocks,
        "kv_blocks_derived": cfg.kv_blocks is None,
        "history_blocks": cfg.history_blocks,
        "kv_share": (kv_blocks - 1) / cfg.history_blocks,
        "max_model_len": cfg.max_model_len,
        "prefix_caching": cfg.prefix_caching,
        "background_priority": cfg.background_priority,
        "forward_threads": cfg.threads,
        "cpu_count": os.cpu_count(),
        "workload": asdict(cfg.workload),
        "runs": runs,
        "chunks_expected": cfg.expected_chunks(),
        "store_bytes": store_bytes,
        "cold_method": cold_method,
        "outputs_identical": outputs["identical"],
        "outputs": outputs,
        "restart_ttft_avg_vs_vllm": _ratio(restart["ttft_avg_s"], plain["ttft_avg_s"]),
        "restart_ttft_p50_vs_vllm": _ratio(restart["ttft_p50_s"], plain["ttft_p50_s"]),
        "restart_ttft_p90_vs_vllm": _ratio(restart["ttft_p90_s"], plain["ttft_p90_s"]),
        "restart_throughput_vs_vllm": _ratio(restart["throughput_rps"], plain["throughput_rps"]),
        "restart_hit_rate_vs_chunkstore": _ratio(restart["hit_rate"], connector["hit_rate"]),
        "chunkstore_ttft_avg_vs_vllm": _ratio(connector["ttft_avg_s"], plain["ttft_avg_s"]),
        "chunkstore_throughput_vs_vllm": _ratio(connector["throughput_rps"], plain["throughput_rps"]),
        "load_average_1m": load_average,
        "total_s": time.perf_counter() - started,
    }
    ratio = result["restart_hit_rate_vs_chunkstore"]
    record_targets(result, [Target("restart_hit_rate_vs_chunkstore", ratio if ratio is not None else 0.0, ">=", 0.95)])
    return result


# ---- presentation ----------------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def format_table(r: dict) -> str:
    """The terminal table: one column per configuration, then the ratios (built from the JSON's dict)."""
    runs = r["runs"]

    def source(run: dict, name: str) -> str:
        return _fmt(run["hit_rate_by_source"][name], ".3f")

    rows: list[tuple[str, list[str]]] = [
        ("hit rate (cached / prompt tokens)", [_fmt(x["hit_rate"], ".3f") for x in runs]),
        ("  from vLLM's prefix cache", [source(x, "vllm") for x in runs]),
        ("  from chunkstore", [source(x, "chunkstore") for x in runs]),
        ("ideal hit rate (infinite cache)", [_fmt(x["ideal_hit_rate"], ".3f") for x in runs]),
        ("TTFT avg (s)", [_fmt(x["ttft_avg_s"], ".3f") for x in runs]),
        ("TTFT P50 (s)", [_fmt(x["ttft_p50_s"], ".3f") for x in runs]),
        ("TTFT P90 (s)", [_fmt(x["ttft_p90_s"], ".3f") for x in runs]),
        ("TTFT avg, vLLM's own metric (s)", [_fmt(x["ttft_vllm_avg_s"], ".3f") for x in runs]),
        ("latency avg (s)", [_fmt(x["latency_avg_s"], ".3f") for x in runs]),
        ("throughput (req/s)", [_fmt(x["throughput_rps"], ".2f") for x in runs]),
        ("output tokens/s", [_fmt(x["output_tokens_per_s"], ".1f") for x in runs]),
        ("input tokens/s", [_fmt(x["input_tokens_per_s"], ".0f") for x in runs]),
        ("workload duration (s)", [_fmt(x["duration_s"], ".1f") for x in runs]),
        ("process wall time (s)", [_fmt(x["wall_s"], ".1f") for x in runs]),
        ("KV load failures: requests / tokens", [f"{x['load_failures']['requests']} / {x['load_failures']['tokens']}"
                                                  for x in runs]),
    ]
    names = [x["name"] for x in runs]
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(n), *(len(cells[i]) for _, cells in rows)) for i, n in enumerate(names)]
    w = r["workload"]
    rate = "no gaps" if math.isinf(w["request_rate"]) else f"{w['request_rate']:g} req/s Poisson"
    shape = r["model"]["shape"]
    model = r["model"]["path"] or (f"{r['model']['name']}, {shape['num_layers']} layers, "
                                   f"hidden {shape['hidden_size']}, bf16")
    head = (f"{PROG}: {w['num_clients']} clients x {w['num_rounds']} rounds, {w['request_length']} + "
            f"{w['output_length']} tokens a round, at most {w['max_parallel']} in flight, {rate}, seed {w['seed']}")
    setting = (f"vLLM {r['vllm_version']}, model {model}; block {r['block_size']} tokens, KV cache {r['kv_blocks']} "
               f"blocks ({r['kv_share']:.2f} of the final histories' {r['history_blocks']}), prefix caching "
               f"{'on' if r['prefix_caching'] else 'off'}; forward on {r['forward_threads']} of {r['cpu_count']} "
               f"cores; restart's files made cold by {r['cold_method']}; load average {r['load_average_1m']:.1f}")
    lines = [head, setting, ""]
    lines.append(" " * label_width + "  " + "  ".join(n.rjust(wd) for n, wd in zip(names, widths)))
    lines += [label.ljust(label_width) + "  " + "  ".join(c.rjust(wd) for c, wd in zip(cells, widths))
              for label, cells in rows]
    o = r["outputs"]
    same = ("greedy outputs identical in all three" if o["identical"] else
            f"greedy outputs identical but for {len(o['near_tie_divergences'])} near ties (the best two within "
            f"{o['near_tie_nats']:g} nats in both runs; that client's later rounds not compared)")
    stored = f"chunks stored {runs[1]['chunks_stored']} of {r['chunks_expected']} ({r['store_bytes'] / 1e6:.1f} MB)"
    lines += ["", f"{stored}; {same}", ""]
    for key, label in (("restart_ttft_avg_vs_vllm", "restart / vllm, TTFT avg"),
                       ("restart_ttft_p50_vs_vllm", "restart / vllm, TTFT P50"),
                       ("restart_throughput_vs_vllm", "restart / vllm, throughput"),
                       ("chunkstore_ttft_avg_vs_vllm", "vllm+chunkstore / vllm, TTFT avg"),
                       ("chunkstore_throughput_vs_vllm", "vllm+chunkstore / vllm, throughput")):
        lines.append(f"{label:<40} {_fmt(r[key], '8.3f')}")
    t = r["targets"]["restart_hit_rate_vs_chunkstore"]
    lines.append(f"{'restart / vllm+chunkstore, hit rate':<40} {t['value']:8.3f}  {t['target']:<7} "
                 f"{'pass' if t['pass'] else 'FAIL'}")
    lines += ["", verdict_line(r, "timings swing on a shared machine"), f"total {r['total_s']:.0f} s"]
    return "\n".join(lines)


# ---- command line ----------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench vllm``."""
    d, c = Workload(), VLLMBenchConfig()
    add_output_arguments(parser)
    parser.add_argument("--num-clients", type=int, default=d.num_clients,
                        help=f"conversations, each a client (default {d.num_clients})")
    parser.add_argument("--num-rounds", type=int, default=d.num_rounds,
                        help=f"requests per client (default {d.num_rounds})")
    parser.add_argument("--request-length", type=int, default=d.request_length,
                        help=f"tokens of each new question (default {d.request_length})")
    parser.add_argument("--output-length", type=int, default=d.output_length,
                        help=f"greedy tokens of each reply (default {d.output_length})")
    parser.add_argument("--max-parallel", type=int, default=d.max_parallel,
                        help=f"requests in flight at most (default {d.max_parallel})")
    parser.add_argument("--request-rate", type=float, default=d.request_rate,
                        help=f"requests per second, Poisson; inf for no gaps (default {d.request_rate:g})")
    parser.add_argument("--seed", type=int, default=d.seed, help=f"seed of the questions and gaps (default {d.seed})")
    parser.add_argument("--model", type=Path, default=None, metavar="PATH",
                        help="a local Hugging Face model folder (default: a random-weight Llama made here)")
    parser.add_argument("--block-size", type=int, default=c.block_size,
                        help=f"vLLM's tokens per block, a multiple of {CPU_BLOCK_MULTIPLE} on the CPU "
                             f"(default {c.block_size})")
    parser.add_argument("--kv-blocks", type=int, default=None, metavar="N",
                        help="vLLM's KV cache in blocks, the same in every configuration (default: a quarter of "
                             "the final histories, at least the requests in flight)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="turn vLLM's own prefix caching off in every configuration")
    parser.add_argument("--background-priority", choices=PRIORITIES, default=None,
                        help="the connector's writer thread priority (default: the connector's)")
    parser.add_argument("--forward-threads", type=int, default=None, metavar="N",
                        help="OpenMP threads of vLLM's forward, the same in every configuration (default: all "
                             "cores but one, left to the connector and vLLM's scheduler)")
    parser.add_argument("--work-dir", metavar="DIR", type=Path, default=None,
                        help="make the temporary folder (model, data folder) in DIR (default: the system's)")
    parser.add_argument("--timeout-s", type=float, default=c.timeout_s,
                        help=f"longest run of one configuration's process (default {c.timeout_s:g})")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def config_from_args(args: argparse.Namespace) -> VLLMBenchConfig:
    """Raises ValueError for a bad option."""
    workload = Workload(num_clients=args.num_clients, num_rounds=args.num_rounds, request_length=args.request_length,
                        output_length=args.output_length, max_parallel=args.max_parallel,
                        request_rate=args.request_rate, seed=args.seed)
    return VLLMBenchConfig(workload=workload, model_path=args.model, block_size=args.block_size,
                           kv_blocks=args.kv_blocks, prefix_caching=not args.no_prefix_caching,
                           background_priority=args.background_priority, forward_threads=args.forward_threads,
                           work_dir=args.work_dir,
                           timeout_s=args.timeout_s, show_progress=not args.no_progress)


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 done, 1 a configuration failed or outputs differ (or a target was missed under
    --strict), 2 bad options or no vLLM."""
    def configure() -> VLLMBenchConfig:
        cfg = config_from_args(args)
        try:
            # vLLM's logger binds the stream it finds when imported; stdout is for the JSON alone.
            with contextlib.redirect_stdout(sys.stderr):
                from vllm.platforms import current_platform
        except ImportError as exc:
            raise ValueError(f"vLLM is not importable in {sys.executable} ({exc}); {ENV_HINT}") from None
        if current_platform.is_cpu() and cfg.block_size % CPU_BLOCK_MULTIPLE:
            raise ValueError(f"--block-size {cfg.block_size}: vLLM's CPU backend takes a multiple of "
                             f"{CPU_BLOCK_MULTIPLE}")
        return cfg

    return run_bench(args, PROG, configure, run_vllm_bench, format_table, failures=(BenchFailure,),
                     failed="the benchmark failed")
