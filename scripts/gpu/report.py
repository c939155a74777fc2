"""The JSON of scripts/gpu/run.sh: the machine and an import check, the tests' outcome, and a
summary of every step with the GPU run's targets computed from the benchmarks' own figures.

    report.py environment OUT/environment.json [--wheels DIR]   exit 1 when chunkstore does not import
    report.py tests OUT/tests.json JUNIT_XML...                  the XML files are removed once read
    report.py summary OUT STEPS_FILE [--check]                   --check: exit 1 when a step failed or
                                                                 its JSON lacks a figure the summary reads
Only the standard library is imported at the top, so a machine missing packages still gets a report.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import traceback
import xml.etree.ElementTree as ET
from pathlib import Path

# What run.sh imports on the way: the CLI, the server, the benchmarks, the engine and the store.
MODULES = ("chunkstore", "chunkstore.cli", "chunkstore.serve", "chunkstore.engine", "chunkstore.bench.tiers",
           "chunkstore.bench.store", "chunkstore.bench.multiturn", "chunkstore.disk.sealing", "chunkstore.api.app")

# The GPU run's targets, from each step's JSON: (step, figure path, op, threshold). A figure that a
# benchmark reports with a target of its own is read from there; the tiers' host->device target
# is stricter here (0.8, against the benchmark's 0.5 for a CPU "device").
TARGETS = {
    "host_to_device_vs_memcpy": ("tiers", ("host_to_device_vs_memcpy",), ">=", 0.8),
    "disk_to_device_vs_load": ("tiers", ("disk_to_device_vs_load",), ">=", 0.8),
    "disk_throughput_vs_device_host": ("multiturn", ("targets", "disk_throughput_vs_device_host", "value"), ">=", 1.6),
    "disk_ttft_avg_vs_device_host": ("multiturn", ("targets", "disk_ttft_avg_vs_device_host", "value"), "<=", 0.57),
    "disk_hit_rate_vs_ideal": ("multiturn", ("targets", "disk_hit_rate_vs_ideal", "value"), ">=", 0.95),
    "restart_hit_rate_vs_disk": ("multiturn", ("targets", "restart_hit_rate_vs_disk", "value"), ">=", 0.9),
}
# Figures copied into the summary beside the targets.
FIGURES = {
    "tiers": ("device", "host_to_device_gbps", "memcpy_gbps", "device_to_host_gbps", "memcpy_d2h_gbps",
              "device_to_host_vs_memcpy", "disk_to_device_gbps", "load_gbps", "match_insert_ms"),
    "store": ("device", "save_gbps", "load_gbps", "raw_write_gbps", "raw_read_gbps", "save_vs_raw", "load_vs_raw",
              "save_cpu_s_per_gb", "load_cpu_s_per_gb", "compression_ratio", "exists_128_ms"),
}
RUN_FIGURES = ("throughput_rps", "ttft_avg_s", "ttft_p90_s", "hit_rate", "ideal_hit_rate", "hit_rate_by_tier",
               "prefill_s_per_token", "duration_s")


def environment(out: Path, wheels: Path | None) -> int:
    env: dict = {"python": sys.version.split()[0], "executable": sys.executable, "platform": platform.platform(),
                 "cpu_count": os.cpu_count(), "pythonpath": os.environ.get("PYTHONPATH", "")}
    if wheels is not None and (wheels / "manifest.json").is_file():
        env["wheels"] = json.loads((wheels / "manifest.json").read_text())
        env["relied_on_unmet"] = _unmet(env["wheels"].get("relied_on", {}))
    try:
        import torch

        env["torch"] = torch.__version__
        env["cuda_available"] = torch.cuda.is_available()
        env["torch_cuda"] = torch.version.cuda
        if torch.cuda.is_available():
            props = torch.cuda.get_device_properties(0)
            env["gpu"] = {"name": props.name, "memory_gib": round(props.total_memory / 2**30, 1),
                          "capability": f"{props.major}.{props.minor}",
                          "multiprocessors": props.multi_processor_count, "count": torch.cuda.device_count()}
    except Exception as exc:  # a report, whatever is missing
        env["torch_error"] = f"{type(exc).__name__}: {exc}"
    failed = {}
    for name in MODULES:
        try:
            importlib.import_module(name)
        except Exception:
            failed[name] = traceback.format_exc(limit=-3).strip().splitlines()[-1]
    env["imports_failed"] = failed
    from importlib.metadata import PackageNotFoundError, version

    versions = {}
    for dist in ("transformers", "numpy", "zstandard", "sqlalchemy", "pydantic", "fastapi", "cryptography", "xxhash"):
        try:
            versions[dist] = version(dist)
        except PackageNotFoundError:
            versions[dist] = None
    env["packages"] = versions
    out.write_text(json.dumps(env, indent=2) + "\n")
    for name, error in failed.items():
        print(f"report: import {name} failed: {error}", file=sys.stderr)
    return 1 if failed else 0


def _unmet(relied_on: dict[str, str]) -> dict[str, dict]:
    """The machine's packages that the carried wheels rely on, where missing or of a version outside
    the requirement (the import check says whether it matters)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.specifiers import SpecifierSet

    out = {}
    for name, spec in relied_on.items():
        try:
            installed = version(name)
        except PackageNotFoundError:
            installed = None
        if installed is None or not SpecifierSet(spec).contains(installed, prereleases=True):
            out[name] = {"installed": installed, "required": spec}
    return out


def tests(out: Path, junits: list[Path]) -> int:
    """pytest's JUnit XML files (one per pytest run) as one JSON: counts, seconds, each failed,
    errored or skipped test with its message, and the runs that wrote no file (killed before the
    end of their session)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    cases, seconds, missing = [], 0.0, []
    for junit in junits:
        if not junit.is_file():
            missing.append(junit.name)
            continue
        root = ET.parse(junit).getroot()
        for case in root.iter("testcase"):
            outcome, message = "passed", ""
            for tag, name in (("failure", "failed"), ("error", "errors"), ("skipped", "skipped")):
                found = case.find(tag)
                if found is not None:
                    outcome, message = name, (found.get("message") or "")[:500]
                    break
            counts[outcome] += 1
            if outcome != "passed":
                cases.append({"test": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                              "message": message})
        for suite in root.iter("testsuite"):
            seconds += float(suite.get("time", 0))
        junit.unlink()
    result = {**counts, "seconds": round(seconds, 1), "runs_without_report": missing, "not_passed": cases}
    out.write_text(json.dumps(result, indent=2) + "\n")
    return 1 if missing else 0


def _dig(data: dict, path: tuple[str, ...]):
    for key in path:
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def _load(out: Path, step: str) -> dict | None:
    path = out / f"{step}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def summary(out: Path, steps_file: Path, check: bool) -> int:
    steps = {}
    if steps_file.is_file():
        for line in steps_file.read_text().splitlines():
            name, rc, seconds, budget = line.split()
            steps[name] = {"rc": int(rc), "seconds": int(seconds), "budget_s": int(budget),
                           "timed_out": int(rc) in (124, 137)}
    data = {step: _load(out, step) for step in ("environment", "tests", "tiers", "store", "multiturn")}
    problems = [f"{name} exited {s['rc']}" + (" (out of time)" if s["timed_out"] else "")
                for name, s in steps.items() if s["rc"] != 0]
    targets = {}
    for name, (step, path, op, threshold) in TARGETS.items():
        value = _dig(data[step], path) if data[step] is not None else None
        passed = None if value is None else (value >= threshold if op == ">=" else value <= threshold)
        targets[name] = {"value": value, "target": f"{op} {threshold:g}", "pass": passed}
        if value is None and step in steps:
            problems.append(f"{step}.json has no {'.'.join(path)}")
    t = data["tests"]
    if t is not None and "failed" in t:
        bad = t["failed"] + t["errors"]
        targets["cuda_tests_pass"] = {"value": bad, "target": "== 0 failed", "pass": bad == 0}
        problems += [f"pytest wrote no {name} (killed before its session ended)" for name in t["runs_without_report"]]
    figures = {step: {k: data[step].get(k) for k in keys} for step, keys in FIGURES.items() if data[step] is not None}
    if data["multiturn"] is not None:
        figures["multiturn"] = {r["name"]: {k: r.get(k) for k in RUN_FIGURES} for r in data["multiturn"].get("runs", [])}
        figures["multiturn_model"] = data["multiturn"].get("model")
    env = data["environment"] or {}
    problems += [f"the machine's {name} is {v['installed']}, the wheels want {v['required']}"
                 for name, v in env.get("relied_on_unmet", {}).items()]
    result = {
        "device": (env.get("gpu") or {}).get("name") or "cpu",
        "torch": env.get("torch"),
        "steps": steps,
        "tests": {k: t.get(k) for k in ("passed", "failed", "errors", "skipped")} if t else None,
        "targets": targets,
        "all_targets_pass": all(v["pass"] for v in targets.values()) if targets else False,
        "figures": figures,
        "problems": problems,
    }
    (out / "summary.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    if check:
        for problem in problems:
            print(f"report: {problem}", file=sys.stderr)
        return 1 if problems else 0
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/gpu/report.py")
    sub = parser.add_subparsers(dest="what", required=True)
    p = sub.add_parser("environment")
    p.add_argument("out", type=Path)
    p.add_argument("--wheels", type=Path, default=None)
    p = sub.add_parser("tests")
    p.add_argument("out", type=Path)
    p.add_argument("junits", type=Path, nargs="+")
    p = sub.add_parser("summary")
    p.add_argument("out", type=Path)
    p.add_argument("steps", type=Path)
    p.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    if args.what == "environment":
        return environment(args.out, args.wheels)
    if args.what == "tests":
        return tests(args.out, args.junits)
    return summary(args.out, args.steps, args.check)


if __name__ == "__main__":
    sys.exit(main())
