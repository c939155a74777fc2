"""``chunkstore bench vllm``: the multi-turn chat workload on vLLM's own engine with each KV caching
system a vLLM user would pick (vllm_systems.py), side by side: each system's first run over a new
data folder, then a restart (a new process over that folder, its files made cold) that continues
the conversations with new questions (or replays them), over one or more repetitions.

Invariants: every run is a process of its own (vLLM keeps process-wide state; vllm_child.py) with
the same model, workload, block size, KV block budget (``num_gpu_blocks_override``, smaller than
the histories, so vLLM's own cache evicts), host-memory tier, forward threads and prefix caching
(on by default: the baseline a vLLM user has); the systems run in the listed order in even
repetitions and reversed in odd ones; a system that cannot run here is a row with its reason,
never a crash of the benchmark; TTFT is measured per request in the child, never derived; greedy
outputs are compared with vLLM alone's and a difference other than a near tie fails the run (exit
1, after the table); targets are reported, never asserted. vLLM and torch are imported only when
the benchmark runs, so ``--help`` works without them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from chunkstore.bench.common import files_under, make_cold, record_targets, run_bench
from chunkstore.bench.vllm_outputs import DIFFER, compare_outputs
from chunkstore.bench.vllm_report import (
    FAILED,
    MISSING,
    RAN,
    SKIPPED,
    add_ratios,
    format_table,
    summarize_run,
    summarize_systems,
    targets,
)
from chunkstore.bench.vllm_runner import Phase, RunFailed, run_child
from chunkstore.bench.vllm_systems import Budget, System, SystemSetup, setup_for
from chunkstore.bench.workload import Workload
from chunkstore.output import add_output_arguments

PROG = "chunkstore bench vllm"
PRIORITIES = ("normal", "low", "idle")  # chunkstore.priority.ThreadPriority
ENV_HINT = ("run scripts/vllm_env.sh and use that environment's interpreter: .venv-vllm/bin/chunkstore bench vllm "
            "(or .venv-vllm/bin/python -m chunkstore bench vllm)")
CPU_BLOCK_MULTIPLE = 32  # vLLM's CPU attention takes blocks of a multiple of 32 tokens
KV_SHARE = 0.25  # vLLM's KV blocks / all clients' histories after the first run, by default
HOST_MAX_LEN_MULTIPLE = 4  # the host tier: this many of the longest prompts (the chunkstore connector's default)
WARM_UP_TOKEN_BASE = 256  # warm-up ids sit above the questions' bytes, so they share no block
CONTINUE_SEED_OFFSET = 1000  # the questions after a restart: another seed, so none repeats the first run's
# The multi-turn benchmark's workload (16 clients x 5 rounds), its requests sent as soon as a client
# may: throughput is then what each system can serve, not the arrival rate. Measured here with
# 16 req/s Poisson, vLLM with an unbounded KV cache reached 14.8 req/s, the arrivals' own limit.
DEFAULT_WORKLOAD = dataclasses.replace(Workload(), request_rate=math.inf)


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


def kv_bytes_per_token(model: Path) -> int:
    """KV bytes a token takes in vLLM's cache for the Hugging Face model folder ``model`` (K and
    V, every layer; 16-bit unless its config says float32); ValueError when config.json lacks a field."""
    config = json.loads((Path(model) / "config.json").read_text())
    config = config.get("text_config", config)
    try:
        layers, heads = config["num_hidden_layers"], config["num_attention_heads"]
        kv_heads = config.get("num_key_value_heads") or heads
        head_dim = config.get("head_dim") or config["hidden_size"] // heads
    except KeyError as exc:
        raise ValueError(f"--model {model}: config.json has no {exc.args[0]}") from None
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    return 2 * layers * kv_heads * head_dim * (4 if dtype == "float32" else 2)


class BenchFailure(RuntimeError):
    """vLLM alone did not run, or a system's greedy outputs differ from vLLM alone's."""


@dataclass(slots=True)
class VLLMBenchConfig:
    """What to run; ValueError names a bad field."""

    workload: Workload = field(default_factory=lambda: DEFAULT_WORKLOAD)
    systems: list[System] = field(default_factory=lambda: list(System))
    restarts: list[Phase] = field(default_factory=lambda: [Phase.CONTINUE])
    continue_rounds: int = 2  # rounds each conversation goes on for after a restart that continues
    reps: int = 2
    model_path: Path | None = None  # a local Hugging Face model folder; None: ModelShape() made here
    block_size: int = 32
    kv_blocks: int | None = None  # vLLM's KV cache in blocks; None: derived (see derive_kv_blocks)
    prefix_caching: bool = True
    background_priority: str | None = None  # the chunkstore connector's writer; None: its default
    forward_threads: int | None = None  # OpenMP threads of the forward; None: all cores but one
    work_dir: Path | None = None  # parent of the temporary folder
    timeout_s: float = 600.0  # longest run of one process (a default one takes ~20 s here; LMCache degraded, minutes)
    flush_timeout_s: float = 120.0  # longest wait for the chunkstore connector's saves after its first run
    show_progress: bool = True

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.block_size % 16:
            raise ValueError(f"--block-size must be a positive multiple of 16, got {self.block_size}")
        if self.continue_rounds < 1:
            raise ValueError(f"--continue-rounds must be >= 1, got {self.continue_rounds}")
        if self.reps < 1:
            raise ValueError(f"--reps must be >= 1, got {self.reps}")
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
    def phases(self) -> list[Phase]:
        return [Phase.FIRST, *self.restarts]

    @property
    def threads(self) -> int:
        # All cores but one, as vLLM's own CPU launcher reserves one for what is not the forward: its
        # OpenMP threads spin on their cores, so any other thread there (a connector's loads and
        # writes, vLLM's scheduler) stalls every parallel region, where a GPU server's forward has a
        # device of its own. Measured on 2 cores, 16 clients x 5 rounds: with both cores to the
        # forward, the chunkstore connector's TTFT was 1.05x vLLM alone's and its restart's 0.41x;
        # with one, 0.60x and 0.22x (vLLM alone's own TTFT 1.5x its two-core figure).
        return self.forward_threads if self.forward_threads is not None else max(1, (os.cpu_count() or 2) - 1)

    @property
    def continue_workload(self) -> Workload | None:
        """The rounds after a restart that continues: new questions (another seed), the same shape."""
        if Phase.CONTINUE not in self.restarts:
            return None
        w = self.workload
        return Workload(num_clients=w.num_clients, num_rounds=self.continue_rounds, request_length=w.request_length,
                        output_length=w.output_length, max_parallel=w.max_parallel, request_rate=w.request_rate,
                        seed=w.seed + CONTINUE_SEED_OFFSET)

    def _blocks(self, tokens: int) -> int:
        return math.ceil(tokens / self.block_size)

    @property
    def first_history_blocks(self) -> int:
        """One client's history after the first run, in whole blocks."""
        return self._blocks(self.workload.final_history_tokens)

    @property
    def max_model_len(self) -> int:
        """A client's whole history, continued rounds included, in whole blocks."""
        rounds = self.workload.num_rounds + (self.continue_rounds if Phase.CONTINUE in self.restarts else 0)
        w = self.workload
        return self._blocks(rounds * (w.request_length + w.output_length)) * self.block_size

    @property
    def min_kv_blocks(self) -> int:
        return self.max_model_len // self.block_size + 1  # vLLM keeps block 0 as its null block

    @property
    def history_blocks(self) -> int:
        return self.workload.num_clients * self.first_history_blocks

    def derive_kv_blocks(self) -> int:
        """A quarter of all clients' histories after the first run, but room for the first run's
        requests in flight (each up to a whole history: vLLM must not preempt there, only evict)
        and for one longest request. After a restart that continues, the longer histories may
        make vLLM hold a request back until blocks free, alike for every system."""
        w = self.workload
        in_flight = min(w.max_parallel, w.num_clients) * self.first_history_blocks + 1
        return max(round(self.history_blocks * KV_SHARE), in_flight, self.min_kv_blocks)

    def expected_chunks(self) -> int:
        """Whole prompt blocks of the first run (each round's prompt extends the previous one)."""
        w = self.workload
        return w.num_clients * (w.prompt_tokens(w.num_rounds - 1) // self.block_size)

    def warm_up_tokens(self) -> list[int]:
        rng = np.random.default_rng(self.workload.seed + 1)
        n = self.workload.prompt_tokens(self.workload.num_rounds - 1)
        return [int(x) for x in rng.integers(WARM_UP_TOKEN_BASE, 2 * WARM_UP_TOKEN_BASE, n)]


# ---- the runs --------------------------------------------------------------------------------------

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


def _disk_usage(folder: Path | None) -> tuple[int | None, int | None]:
    """Bytes (as the files' sizes say) and files under a system's data folder; None without one."""
    if folder is None:
        return None, None
    files = files_under(folder)
    return sum(p.stat().st_size for p in files), len(files)


@dataclass(slots=True)
class _Bench:
    """One invocation's shared state: the config, the base plan, the work folder, the budget."""

    cfg: VLLMBenchConfig
    base_plan: dict
    work: Path
    budget: Budget
    cold_methods: set[str] = field(default_factory=set)

    def run_system(self, system: System, rep: int) -> tuple[list[dict], dict[str, dict]]:
        """``system``'s first run and restarts in repetition ``rep``: a row per phase, and by
        phase the records of each run that finished (for the outputs' check)."""
        cfg = self.cfg
        folder = self.work / f"rep{rep + 1}" / system.value
        folder.mkdir(parents=True)
        setup = setup_for(system, folder / "kv", self.budget)
        env = {**_child_env(cfg), **setup.env}
        rows: list[dict] = []
        records: dict[str, dict] = {}

        def row(phase: Phase, status: str, reason: str | None = None) -> dict:
            return {"system": system.value, "rep": rep, "phase": phase.value, "status": status, "reason": reason}

        missing = system.missing_package()
        if missing is not None:
            return [row(p, MISSING, missing) for p in cfg.phases], records
        first: dict | None = None
        for phase in cfg.phases:
            if phase is not Phase.FIRST and first is None:
                rows.append(row(phase, SKIPPED, "its first run did not finish"))
                continue
            if phase is not Phase.FIRST:
                self.cold_methods.add(make_cold(files_under(setup.data) if setup.data is not None else []))
            plan, prior = self._plan(system, setup, phase, first)
            load_average = os.getloadavg()[0]  # what else ran on the host as this run started
            name = f"rep{rep + 1}-{system.value}-{phase.value}"
            try:
                got = run_child(plan, env, folder, name, timeout_s=cfg.timeout_s,
                                num_requests=Workload(**plan["workload"]).num_requests,
                                show_progress=cfg.show_progress)
            except RunFailed as exc:
                rows.append(row(phase, FAILED, str(exc)))
                continue
            first = got if phase is Phase.FIRST else first
            records[phase.value] = got
            figures = summarize_run(got, page_size=cfg.block_size, prior=prior, replayed=phase is Phase.REPLAY)
            disk_bytes, disk_files = _disk_usage(setup.data)
            rows.append({**row(phase, RAN), **figures, "disk_bytes": disk_bytes, "disk_files": disk_files,
                         "notes": got["notes"], "load_average_1m": load_average})
        return rows, records

    def _plan(self, system: System, setup: SystemSetup, phase: Phase,
              first: dict | None) -> tuple[dict, dict[int, tuple[int, int]] | None]:
        """The child's plan for one run, and for a restart that continues each client's last
        request of the first run (``(prompt_tokens, completion_tokens)``, for the ideal hit rate)."""
        cfg = self.cfg
        plan = dict(self.base_plan, transfer=setup.transfer, workload=asdict(cfg.workload), history=None,
                    round_offset=0, expected_chunks=None, chunkstore_data=None)
        if phase is Phase.FIRST and system is System.CHUNKSTORE:
            plan.update(expected_chunks=cfg.expected_chunks(), chunkstore_data=str(setup.data))
        if phase is not Phase.CONTINUE:
            return plan, None
        plan.update(workload=asdict(cfg.continue_workload), history=first["history"],
                    round_offset=cfg.workload.num_rounds)
        last = cfg.workload.num_rounds - 1
        return plan, {r["client"]: (r["prompt_tokens"], r["completion_tokens"])
                      for r in first["records"] if r["round"] == last}


def _compare(rows: list[dict], records: dict[tuple[str, str, int], dict]) -> None:
    """Ratios and the outputs' check of every run that ran, against vLLM alone's same repetition and phase."""
    for row in rows:
        if row["status"] != RAN:
            continue
        base_row = next((r for r in rows if (r["system"], r["rep"], r["phase"], r["status"])
                         == (System.VLLM.value, row["rep"], row["phase"], RAN)), None)
        add_ratios(row, base_row)
        if row["system"] != System.VLLM.value and base_row is not None:
            base = records[System.VLLM.value, row["phase"], row["rep"]]["records"]
            row["outputs"] = compare_outputs(base, records[row["system"], row["phase"], row["rep"]]["records"])
        else:
            row["outputs"] = None


def _model_description(cfg: VLLMBenchConfig, shape: ModelShape | None) -> dict:
    if shape is None:
        return {"path": str(cfg.model_path), "description": str(cfg.model_path), "shape": None}
    return {"path": None, "shape": asdict(shape),
            "description": f"random-weight Llama made here, {shape.num_layers} layers, hidden {shape.hidden_size}, "
                           f"{shape.num_kv_heads} KV heads of {shape.head_dim}, bf16"}


def run_vllm_bench(cfg: VLLMBenchConfig) -> dict:
    """Every system's first run and restarts, ``cfg.reps`` times; returns the dict the table, the
    JSON and the plot show. Everything is written under a temporary folder (in ``cfg.work_dir``
    when given), removed after. Raises BenchFailure when vLLM alone never ran, ImportError when
    vLLM cannot be imported."""
    with contextlib.redirect_stdout(sys.stderr):  # before any work; vLLM's logger binds the stream it finds
        import vllm
        from vllm.platforms import current_platform

    started = time.perf_counter()
    load_average = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="chunkstore-bench-vllm-", dir=cfg.work_dir))
    kv_blocks = cfg.kv_blocks if cfg.kv_blocks is not None else cfg.derive_kv_blocks()
    shape = None if cfg.model_path is not None else ModelShape()
    rows: list[dict] = []
    records: dict[tuple[str, str, int], dict] = {}
    orders: list[list[str]] = []
    try:
        model = Path(cfg.model_path) if cfg.model_path is not None else work / "model"
        if shape is not None:
            shape.save(model)
        host_bytes = HOST_MAX_LEN_MULTIPLE * cfg.max_model_len * kv_bytes_per_token(model)
        base_plan = {"model": str(model), "block_size": cfg.block_size, "kv_blocks": kv_blocks,
                     "max_model_len": cfg.max_model_len, "prefix_caching": cfg.prefix_caching,
                     "seed": cfg.workload.seed, "warm_up_tokens": cfg.warm_up_tokens(),
                     "flush_timeout_s": cfg.flush_timeout_s}
        budget = Budget(cfg.block_size, host_bytes, current_platform.is_cpu(), cfg.background_priority)
        bench = _Bench(cfg, base_plan, work, budget)
        for rep in range(cfg.reps):
            order = cfg.systems if rep % 2 == 0 else cfg.systems[::-1]
            orders.append([s.value for s in order])
            for system in order:
                got_rows, got_records = bench.run_system(system, rep)
                rows += got_rows
                records.update({(system.value, phase, rep): got for phase, got in got_records.items()})
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not any(r["system"] == System.VLLM.value and r["status"] == RAN for r in rows):
        reasons = sorted({r["reason"] for r in rows if r["system"] == System.VLLM.value})
        raise BenchFailure(f"vLLM alone did not run, so nothing can be compared: {'; '.join(reasons)}")
    _compare(rows, records)
    phases = [p.value for p in cfg.phases]
    systems = [s.value for s in cfg.systems]
    continue_workload = cfg.continue_workload
    result = {
        "model": _model_description(cfg, shape),
        "vllm_version": vllm.__version__,
        "systems": [{"name": s.value, "description": s.description} for s in cfg.systems],
        "phases": phases,
        "reps": cfg.reps,
        "orders": orders,
        "workload": asdict(cfg.workload),
        "continue_workload": asdict(continue_workload) if continue_workload is not None else None,
        "block_size": cfg.block_size,
        "kv_blocks": kv_blocks,
        "kv_blocks_derived": cfg.kv_blocks is None,
        "history_blocks": cfg.history_blocks,
        "kv_share": (kv_blocks - 1) / cfg.history_blocks,
        "max_model_len": cfg.max_model_len,
        "host_bytes": host_bytes,
        "platform": current_platform.device_type,  # vLLM's: cpu, cuda, ...
        "prefix_caching": cfg.prefix_caching,
        "background_priority": cfg.background_priority,
        "forward_threads": cfg.threads,
        "cpu_count": os.cpu_count(),
        "chunks_expected": cfg.expected_chunks(),
        "cold_method": ", ".join(sorted(bench.cold_methods)) or None,
        "runs": rows,
        "summary": summarize_systems(rows, systems, phases),
        "outputs_identical": all(r["outputs"]["verdict"] != DIFFER for r in rows if r.get("outputs")),
        "load_average_1m": load_average,
        "total_s": time.perf_counter() - started,
    }
    record_targets(result, targets(rows, cfg.reps, phases))
    return result


# ---- command line ----------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench vllm``."""
    d, c = DEFAULT_WORKLOAD, VLLMBenchConfig()
    add_output_arguments(parser)
    parser.add_argument("--systems", default=",".join(s.value for s in System), metavar="LIST",
                        help=f"the systems to run, comma-separated, any of {', '.join(s.value for s in System)} "
                             "(default: all; vllm, the baseline, always runs)")
    parser.add_argument("--restart", default=Phase.CONTINUE.value, metavar="KIND",
                        help="what the new process after each first run does: continue (every conversation goes on "
                             "with new questions), replay (the same conversations again), or continue,replay "
                             "(default continue)")
    parser.add_argument("--continue-rounds", type=int, default=c.continue_rounds,
                        help=f"rounds each conversation goes on for after a restart that continues "
                             f"(default {c.continue_rounds})")
    parser.add_argument("--reps", type=int, default=c.reps,
                        help=f"repetitions; the systems' order is reversed in every other one (default {c.reps})")
    parser.add_argument("--num-clients", type=int, default=d.num_clients,
                        help=f"conversations, each a client (default {d.num_clients})")
    parser.add_argument("--num-rounds", type=int, default=d.num_rounds,
                        help=f"requests per client in the first run (default {d.num_rounds})")
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
                        help="vLLM's KV cache in blocks, the same for every system (default: a quarter of the "
                             "first run's final histories, at least the requests in flight)")
    parser.add_argument("--no-prefix-caching", action="store_true",
                        help="turn vLLM's own prefix caching off for every system")
    parser.add_argument("--background-priority", choices=PRIORITIES, default=None,
                        help="the chunkstore connector's writer thread priority (default: the connector's)")
    parser.add_argument("--forward-threads", type=int, default=None, metavar="N",
                        help="OpenMP threads of vLLM's forward, the same for every system (default: all cores but "
                             "one, left to the connectors and vLLM's scheduler)")
    parser.add_argument("--work-dir", metavar="DIR", type=Path, default=None,
                        help="make the temporary folder (model, data folders, logs) in DIR (default: the system's)")
    parser.add_argument("--timeout-s", type=float, default=c.timeout_s,
                        help=f"longest run of one process (default {c.timeout_s:g})")
    parser.add_argument("--plot", metavar="PATH", type=Path, default=None,
                        help="also write a PNG of the systems side by side (needs matplotlib)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def config_from_args(args: argparse.Namespace) -> VLLMBenchConfig:
    """Raises ValueError for a bad option."""
    workload = Workload(num_clients=args.num_clients, num_rounds=args.num_rounds, request_length=args.request_length,
                        output_length=args.output_length, max_parallel=args.max_parallel,
                        request_rate=args.request_rate, seed=args.seed)
    return VLLMBenchConfig(workload=workload, systems=System.parse_list(args.systems),
                           restarts=Phase.parse_restarts(args.restart), continue_rounds=args.continue_rounds,
                           reps=args.reps, model_path=args.model, block_size=args.block_size,
                           kv_blocks=args.kv_blocks, prefix_caching=not args.no_prefix_caching,
                           background_priority=args.background_priority, forward_threads=args.forward_threads,
                           work_dir=args.work_dir, timeout_s=args.timeout_s, show_progress=not args.no_progress)


def _configure(args: argparse.Namespace) -> VLLMBenchConfig:
    """The config, checked against this interpreter's vLLM; ValueError for a bad option or no vLLM."""
    from chunkstore.bench.vllm_plot import check_matplotlib

    cfg = config_from_args(args)  # (--output is checked by run_bench)
    if args.plot is not None:
        if not args.plot.parent.is_dir():
            raise ValueError(f"--plot {args.plot}: folder {args.plot.parent} does not exist")
        check_matplotlib()
    try:
        # vLLM's logger binds the stream it finds when imported; stdout is for the JSON alone.
        with contextlib.redirect_stdout(sys.stderr):
            from vllm.platforms import current_platform
    except ImportError as exc:
        raise ValueError(f"vLLM is not importable in {sys.executable} ({exc}); {ENV_HINT}") from None
    if current_platform.is_cpu() and cfg.block_size % CPU_BLOCK_MULTIPLE:
        raise ValueError(f"--block-size {cfg.block_size}: vLLM's CPU backend takes a multiple of {CPU_BLOCK_MULTIPLE}")
    return cfg


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 done; 1 vLLM alone did not run, a system's outputs differ from vLLM alone's
    (after the table), or a target was missed under --strict; 2 bad options or no vLLM."""
    from chunkstore.bench.vllm_plot import write_plot

    def finish(result: dict) -> int:
        if args.plot is not None:
            write_plot(result, args.plot)
        if not result["outputs_identical"]:
            print(f"{PROG}: a system's greedy outputs differ from vLLM alone's beyond near ties (see 'outputs')",
                  file=sys.stderr)
            return 1
        return 0

    return run_bench(args, PROG, lambda: _configure(args), run_vllm_bench, format_table, failures=(BenchFailure,),
                     failed="the benchmark failed", finish=finish)
