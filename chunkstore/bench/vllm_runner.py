"""One run of ``chunkstore bench vllm``: one system's engine in a process of its own
(vllm_child.py) for one phase (its first run, or a restart that continues or replays the
conversations), watched for progress and time.

Invariants: a run returns the child's records or raises ``RunFailed`` with a one-line reason (the
child's own error, the signal that killed it, or the timeout), never leaving its process behind;
the child's whole log stays in the work folder until the benchmark removes it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

# vLLM's own warnings when a connector's load fails: its tokens are recomputed (kv_load_failure_policy
# "recompute") or the requests fail; num_cached_tokens still counts them, so the run reports them.
_RECOVERED = re.compile(r"Recovered from KV load failure: (\d+) request\(s\) rescheduled \((\d+) tokens affected\)")
_FAILED = re.compile(r"Failing (\d+) request\(s\) due to KV load failure \(failure_policy=\w+, (\d+) tokens affected\)")
REASON_CHARS = 300  # a reason longer than this is cut: the log holds the rest
# A connector that starts but cannot do its work says so in the log (LMCache on a host it has no
# device connector for: "... System will operate in degraded mode (recompute)"), after its error.
_DEGRADED = "degraded mode"
_ERROR_LINE = re.compile(r"^\s*(\w*(?:Error|Exception): .+?)\s*$")
_LMCACHE_LOOKUP_TIMEOUT = "Timeout occurred for rank"


class Phase(str, enum.Enum):
    """What a process runs: the workload over a new data folder, or, in a new process over the
    folder the first run left, the conversations' next rounds (``continue``) or the same ones
    again (``replay``)."""

    FIRST = "first"
    CONTINUE = "continue"
    REPLAY = "replay"

    @classmethod
    def parse_restarts(cls, text: str) -> list["Phase"]:
        """``continue``, ``replay`` or both, comma-separated; ValueError names the valid ones."""
        names = [t.strip() for t in text.split(",") if t.strip()]
        valid = f"{cls.CONTINUE.value}, {cls.REPLAY.value}"
        phases: list[Phase] = []
        for name in names:
            if name not in (cls.CONTINUE.value, cls.REPLAY.value):
                raise ValueError(f"--restart: unknown kind {name!r}; valid: {valid}")
            if cls(name) not in phases:
                phases.append(cls(name))
        if not phases:
            raise ValueError(f"--restart is empty; valid: {valid}")
        return phases


class RunFailed(RuntimeError):
    """A run's process did not finish its workload; the message is the reason, one line."""


def run_child(plan: dict, env: dict[str, str], work: Path, name: str, *, timeout_s: float, num_requests: int,
              show_progress: bool) -> dict:
    """Run one plan's process to its end; returns what it wrote, with ``wall_s`` and the KV load
    failures vLLM logged. Raises RunFailed when it fails, dies or outlives ``timeout_s``."""
    plan_path, result_path, log_path = (work / f"{name}.{ext}" for ext in ("plan.json", "result.json", "log"))
    plan_path.write_text(json.dumps(plan))
    read_fd, write_fd = os.pipe()
    started = time.perf_counter()
    bar = tqdm(total=num_requests, desc=f"{name}: starting vLLM", unit="req", file=sys.stderr, leave=False,
               dynamic_ncols=True, disable=not show_progress or not sys.stderr.isatty())
    with open(log_path, "wb") as log, bar:
        proc = subprocess.Popen([sys.executable, "-m", "chunkstore.bench.vllm_child", str(plan_path),
                                 str(result_path), str(write_fd)], stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, pass_fds=(write_fd,), env=env)
        os.close(write_fd)
        buffered = b""
        try:
            while True:  # the child writes one line per event; EOF when it exits
                left = timeout_s - (time.perf_counter() - started)
                if left <= 0 or not select.select([read_fd], [], [], left)[0]:
                    _stop_hung(proc)
                    raise RunFailed(f"ran past --timeout-s {timeout_s:g} (the stacks of its threads end its log)")
                chunk = os.read(read_fd, 4096)
                if not chunk:
                    break
                buffered += chunk
                *lines, buffered = buffered.split(b"\n")
                for line in lines:
                    if line == b"ready":
                        bar.set_description(name)
                    elif line == b"reply":
                        bar.update()
            code = proc.wait(timeout=max(1.0, timeout_s - (time.perf_counter() - started)))
        except subprocess.TimeoutExpired:
            _stop_hung(proc)
            raise RunFailed(f"did not exit within --timeout-s {timeout_s:g}") from None
        finally:
            os.close(read_fd)
    out = json.loads(result_path.read_text()) if result_path.exists() else None
    if code != 0 or out is None or "error" in out:
        raise RunFailed(_reason(code, out, log_path))
    log = log_path.read_text(errors="replace")
    out["wall_s"] = time.perf_counter() - started
    out["load_failures"] = load_failures(log)
    out["notes"] = log_notes(log)
    return out


def _reason(code: int, out: dict | None, log_path: Path) -> str:
    if out is not None and out.get("error"):
        reason = out["error"]
    elif code < 0:
        reason = f"killed by {signal.Signals(-code).name}; its log ends: {_last_line(log_path)}"
    else:
        reason = f"exited with {code}; its log ends: {_last_line(log_path)}"
    return reason if len(reason) <= REASON_CHARS else reason[:REASON_CHARS - 3] + "..."


def _last_line(path: Path) -> str:
    lines = [x for x in path.read_text(errors="replace").splitlines() if x.strip()] if path.exists() else []
    return lines[-1].strip() if lines else "(empty)"


def load_failures(log: str) -> dict[str, int]:
    """The KV load failures vLLM logged in a child's log: requests and tokens affected."""
    requests = tokens = 0
    for pattern in (_RECOVERED, _FAILED):
        for match in pattern.finditer(log):
            requests += int(match.group(1))
            tokens += int(match.group(2))
    return {"requests": requests, "tokens": tokens}


def log_notes(log: str) -> list[str]:
    """What a run's log says about a connector that ran without doing its work: the error behind
    a degraded mode, and how often LMCache's scheduler timed out waiting for its lookup server."""
    notes = []
    lines = log.splitlines()
    at = next((i for i, line in enumerate(lines) if _DEGRADED in line), None)
    if at is not None:
        errors = [m.group(1) for line in lines[:at + 1] if (m := _ERROR_LINE.match(line))]
        notes.append(f"ran degraded ({errors[-1] if errors else 'see its log'}): nothing stored or loaded")
    timeouts = log.count(_LMCACHE_LOOKUP_TIMEOUT)
    if timeouts:
        notes.append(f"lookups that timed out: {timeouts}")
    return notes


def _stop_hung(proc: subprocess.Popen) -> None:
    """Have a hung child write its threads' stacks to its log (faulthandler, SIGUSR1), then kill it."""
    with contextlib.suppress(ProcessLookupError):
        proc.send_signal(signal.SIGUSR1)
        time.sleep(1.0)
    proc.kill()
    proc.wait()
