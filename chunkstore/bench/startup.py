"""`chunkstore bench startup`: how long the commands take to start, against importing their libraries.

Invariants: every figure is the wall time of a fresh process (the fastest of ``runs``, the runs of
each kind interleaved so that a busy moment of a shared machine does not fall on one kind only);
``serve`` is timed from its launch to the first 200 from ``/health``, on a new data folder (first
start) and again on that folder (restart), with ``--port 0`` and the address read off its start
line; each server is stopped with SIGTERM by its PID and waited for; the baseline is
``python -c "import torch, transformers"`` in the same interpreter, and the target is a ratio to it.
"""

from __future__ import annotations

import argparse
import os
import queue
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from chunkstore.bench.common import Target, exit_on_sigterm, record_targets, table_lines, verdict, verdict_line
from chunkstore.output import add_output_arguments, check_output_path, emit_result

BASELINE_CODE = "import torch, transformers"
SERVE_TARGET_RATIO = 2.0  # serve's first answer within twice the time of importing its libraries
_START_LINE = re.compile(r"chunkstore serve: (http://\S+)")
_POLL_S = 0.02


class StartupError(RuntimeError):
    """A process under test failed or did not answer in time."""


@dataclass(frozen=True, slots=True)
class StartupBenchConfig:
    runs: int = 3
    preset: str = "tiny"
    timeout_s: float = 120.0

    def __post_init__(self) -> None:
        if self.runs < 1:
            raise ValueError(f"--runs must be at least 1, got {self.runs}")
        if self.timeout_s <= 0:
            raise ValueError(f"--timeout-s must be positive, got {self.timeout_s}")


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "chunkstore", *args]


def time_command(argv: list[str], timeout_s: float) -> float:
    """Seconds ``argv`` took to exit 0. Raises StartupError otherwise."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise StartupError(f"{' '.join(argv[2:])} exited {done.returncode}: {done.stderr.strip()[-300:]}")
    return elapsed


def _drain(stream, lines: queue.Queue) -> None:
    for line in stream:  # until the server exits and its stdout closes
        lines.put(line)
    lines.put(None)


def _wait_for_url(proc: subprocess.Popen, deadline: float) -> str:
    """The base URL from serve's start line; stdout is drained by a thread, so neither a quiet
    server nor a chatty one blocks this."""
    lines: queue.Queue = queue.Queue()
    threading.Thread(target=_drain, args=(proc.stdout, lines), daemon=True).start()
    while (left := deadline - time.perf_counter()) > 0:
        try:
            line = lines.get(timeout=left)
        except queue.Empty:
            break
        if line is None:
            raise StartupError(f"serve exited {proc.wait()} before printing its address")
        if (m := _START_LINE.search(line)) is not None:
            return m.group(1)
    raise StartupError("serve printed no address in time")


def time_serve(data_dir: Path, preset: str, timeout_s: float) -> float:
    """Seconds from launching ``chunkstore serve`` to its first 200 from /health; the server is then
    stopped with SIGTERM and waited for. Raises StartupError when it exits or times out first."""
    argv = _cli("serve", "--preset", preset, "--port", "0", "--disk-path", str(data_dir), "--log-level", "warning")
    start = time.perf_counter()
    deadline = start + timeout_s
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = _wait_for_url(proc, deadline)
        while time.perf_counter() < deadline:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
                    if response.status == 200:
                        return time.perf_counter() - start
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if proc.poll() is not None:
                raise StartupError(f"serve exited {proc.returncode} before answering /health")
            time.sleep(_POLL_S)
        raise StartupError(f"serve did not answer /health within {timeout_s:g} s")
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def run_startup_bench(cfg: StartupBenchConfig) -> dict:
    """The fastest of ``cfg.runs`` per kind, in seconds, and the ratios against the baseline."""
    times: dict[str, list[float]] = {k: [] for k in ("import", "help", "stats", "serve_first", "serve_restart")}
    with tempfile.TemporaryDirectory(prefix="chunkstore-startup-") as tmp:
        for run in range(cfg.runs):
            data_dir = Path(tmp) / f"run{run}"
            times["import"].append(time_command([sys.executable, "-c", BASELINE_CODE], cfg.timeout_s))
            times["help"].append(time_command(_cli("--help"), cfg.timeout_s))
            times["serve_first"].append(time_serve(data_dir, cfg.preset, cfg.timeout_s))
            times["serve_restart"].append(time_serve(data_dir, cfg.preset, cfg.timeout_s))
            times["stats"].append(time_command(_cli("stats", "--disk-path", str(data_dir)), cfg.timeout_s))
    best = {kind: min(values) for kind, values in times.items()}
    result: dict = {"config": {"runs": cfg.runs, "preset": cfg.preset, "baseline": BASELINE_CODE},
                    "seconds": best, "all_seconds": times,
                    "serve_first_vs_import": best["serve_first"] / best["import"],
                    "serve_restart_vs_import": best["serve_restart"] / best["import"]}
    record_targets(result, [
        Target("serve_first_vs_import", result["serve_first_vs_import"], "<=", SERVE_TARGET_RATIO),
        Target("serve_restart_vs_import", result["serve_restart_vs_import"], "<=", SERVE_TARGET_RATIO),
    ])
    return result


def format_table(r: dict) -> str:
    s = r["seconds"]
    rows = [
        (f'python -c "{BASELINE_CODE}"', f"{s['import']:.2f} s", "", ""),
        ("chunkstore --help", f"{s['help']:.2f} s", "", ""),
        ("chunkstore stats", f"{s['stats']:.2f} s", "", ""),
        (f"serve ({r['config']['preset']}), new folder: first /health", f"{s['serve_first']:.2f} s", "", ""),
        ("  / import", f"{r['serve_first_vs_import']:.2f}", *verdict(r, "serve_first_vs_import")),
        ("serve, restart on that folder: first /health", f"{s['serve_restart']:.2f} s", "", ""),
        ("  / import", f"{r['serve_restart_vs_import']:.2f}", *verdict(r, "serve_restart_vs_import")),
    ]
    head = f"start-up, fastest of {r['config']['runs']} runs each"
    return "\n".join([head, "", *table_lines(rows), "", verdict_line(r)])


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore bench startup``."""
    d = StartupBenchConfig()
    add_output_arguments(parser)
    parser.add_argument("--runs", type=int, default=d.runs, help=f"runs of each kind; the fastest counts (default {d.runs})")
    parser.add_argument("--preset", default=d.preset, metavar="NAME", help=f"the model serve starts (default {d.preset})")
    parser.add_argument("--timeout-s", type=float, default=d.timeout_s, metavar="SECONDS",
                        help=f"longest wait for one process (default {d.timeout_s:g})")
    parser.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")


def run(args: argparse.Namespace) -> int:
    """Exit code: 0 done, 1 a process failed (or a target was missed under --strict), 2 bad options."""
    try:
        cfg = StartupBenchConfig(runs=args.runs, preset=args.preset, timeout_s=args.timeout_s)
        check_output_path(args)
    except ValueError as exc:
        print(f"chunkstore bench startup: error: {exc}", file=sys.stderr)
        return 2
    try:
        with exit_on_sigterm():
            result = run_startup_bench(cfg)
    except (StartupError, subprocess.TimeoutExpired) as exc:
        print(f"chunkstore bench startup: {exc}", file=sys.stderr)
        return 1
    emit_result(args, result, format_table(result))
    return 1 if args.strict and not result["all_pass"] else 0
