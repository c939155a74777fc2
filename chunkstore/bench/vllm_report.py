"""``chunkstore bench vllm``'s figures: one run's summary, its ratios to vLLM alone, the spread
over repetitions, the targets and the table.

Invariants: one function builds each figure (``summarize_run``, with the multi-turn benchmark's
definitions) and the table, the JSON and the plot only show the dicts built here, so they never
disagree; a ratio is against vLLM alone (or ExampleConnector) in the same repetition and phase,
never across repetitions; a figure that was not measured (a system that did not run, a memory-only
system's disk) is None, never 0; a target passes only when every repetition meets it.
"""

from __future__ import annotations

import math
from statistics import median

from chunkstore.bench.common import Target
from chunkstore.bench.workload import DriveResult, Reply, RequestRecord, ideal_cached_tokens

# The figures the summary (and the table) spreads over repetitions.
SPREAD = ("throughput_rps", "throughput_vs_vllm", "ttft_avg_s", "ttft_avg_vs_vllm", "ttft_p90_s", "ttft_p90_vs_vllm",
          "hit_rate", "hit_rate_vs_ideal", "connector_tokens", "disk_bytes", "disk_files", "peak_rss_bytes", "wall_s",
          "load_average_1m")
RAN, FAILED, MISSING, SKIPPED = "ran", "failed", "missing", "skipped"


def ideal_hit_rate(records: list[dict], page_size: int, prior: dict[int, tuple[int, int]] | None, *,
                   replayed: bool = False) -> float:
    """What an infinite cache reaches on these requests. ``prior``: each client's request before
    the first one here (``(prompt_tokens, completion_tokens)``: a restart that continues);
    ``replayed``: every prompt here was sent before (a replay), so all its whole blocks but the
    last token's are there."""
    by_client: dict[int, dict[int, tuple[int, int]]] = {}
    for r in records:
        by_client.setdefault(r["client"], {})[r["round"]] = (r["prompt_tokens"], r["completion_tokens"])
    cached = prompt = 0
    for client, rounds in by_client.items():
        first = min(rounds)
        for round_index, (prompt_tokens, _) in rounds.items():
            if replayed:
                cached += (prompt_tokens - 1) // page_size * page_size
            else:
                previous = rounds.get(round_index - 1) if round_index > first else (prior or {}).get(client)
                cached += ideal_cached_tokens(prompt_tokens, previous, page_size)
            prompt += prompt_tokens
    return cached / prompt if prompt else 0.0


def summarize_run(got: dict, *, page_size: int, prior: dict[int, tuple[int, int]] | None,
                  replayed: bool = False) -> dict:
    """One run's figures from what its process wrote (``vllm_child``): the multi-turn benchmark's
    (imported here: its report imports torch, ``--help`` must not), and what only vLLM reports."""
    import numpy as np

    from chunkstore.bench.multiturn_report import summarize_run as summarize_multiturn

    records = [RequestRecord(r["client"], r["round"], r["sent_at_s"],
                             Reply(text="", output_ids=tuple(r["output_ids"]), prompt_tokens=r["prompt_tokens"],
                                   completion_tokens=r["completion_tokens"], cached_tokens=r["cached_tokens"],
                                   tier_tokens=None, ttft_s=r["ttft_s"], latency_s=r["latency_s"]))
               for r in got["records"]]
    full = summarize_multiturn("", "", DriveResult(records, got["duration_s"]), None, page_size=page_size,
                               bytes_per_token=None)
    keep = ("num_requests", "prompt_tokens", "cached_tokens", "completion_tokens", "hit_rate", "ttft_avg_s",
            "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "latency_avg_s", "latency_p90_s", "duration_s",
            "throughput_rps", "input_tokens_per_s", "output_tokens_per_s")
    run = {k: full[k] for k in keep}
    ideal = ideal_hit_rate(got["records"], page_size, prior, replayed=replayed)
    run["ideal_hit_rate"] = ideal
    run["hit_rate_vs_ideal"] = run["hit_rate"] / ideal if ideal else None
    sources = got["prompt_sources"]
    total = sum(sources.values())
    run["connector_tokens"] = sources["external_kv_transfer"]  # vLLM's own count: tokens the connector loaded
    run["hit_rate_by_source"] = {"vllm": sources["local_cache_hit"] / total if total else None,
                                 "connector": sources["external_kv_transfer"] / total if total else None}
    engine = [r["engine_ttft_s"] for r in got["records"] if r["engine_ttft_s"] is not None]
    run["ttft_vllm_avg_s"] = float(np.mean(engine)) if engine and len(engine) == len(records) else None
    for key in ("startup_s", "warm_up_s", "wall_s", "peak_rss_bytes", "chunks_stored", "chunk_wait_s",
                "load_failures"):
        run[key] = got.get(key)
    return run


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def add_ratios(run: dict, baseline: dict | None) -> None:
    """``run``'s throughput and TTFT against vLLM alone's in the same repetition and phase."""
    for key in ("throughput_rps", "ttft_avg_s", "ttft_p90_s"):
        name = key.rsplit("_", 1)[0] if key != "throughput_rps" else "throughput"
        run[f"{name}_vs_vllm"] = _ratio(run.get(key), baseline.get(key)) if baseline else None


def spread(values: list[float | None]) -> dict | None:
    """Median, lowest and highest of the repetitions that measured it (None: none did)."""
    got = [v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    return {"median": median(got), "min": min(got), "max": max(got), "n": len(got)} if got else None


def summarize_systems(rows: list[dict], systems: list[str], phases: list[str]) -> list[dict]:
    """One entry per system and phase: its status over the repetitions (``ran`` only when every
    one ran; else the first reason) and each SPREAD figure's spread."""
    out = []
    for system in systems:
        for phase in phases:
            mine = [r for r in rows if r["system"] == system and r["phase"] == phase]
            failed = [r for r in mine if r["status"] != RAN]
            entry = {"system": system, "phase": phase, "status": failed[0]["status"] if failed else RAN,
                     "reason": failed[0]["reason"] if failed else None, "repetitions": len(mine),
                     "outputs": sorted({r["outputs"]["verdict"] for r in mine if r.get("outputs")}),
                     "notes": sorted({n for r in mine for n in r.get("notes", ())})}
            for key in SPREAD:
                entry[key] = spread([r.get(key) for r in mine])
            out.append(entry)
    return out


# ---- targets ---------------------------------------------------------------------------------------

def _find(rows: list[dict], rep: int, system: str, phase: str) -> dict | None:
    return next((r for r in rows if (r["rep"], r["system"], r["phase"], r["status"]) == (rep, system, phase, RAN)),
                None)


def targets(rows: list[dict], reps: int, phases: list[str]) -> list[Target]:
    """The targets the systems run allow, each over every repetition (the worst one's value)."""
    def worst(values: list[float | None], op: str) -> float | None:
        if not values or any(v is None for v in values):
            return None
        return min(values) if op == ">=" else max(values)

    specs: list[tuple[str, str, float, list[float | None]]] = []

    def per_rep(phase: str, system: str, other: str, key: str) -> list[float | None]:
        out = []
        for rep in range(reps):
            a, b = _find(rows, rep, system, phase), _find(rows, rep, other, phase)
            out.append(_ratio(a[key], b[key]) if a and b else None)
        return out

    specs.append(("first_chunkstore_throughput_vs_vllm", ">=", 1.5,
                  per_rep("first", "chunkstore", "vllm", "throughput_rps")))
    specs.append(("first_chunkstore_ttft_avg_vs_vllm", "<=", 0.6, per_rep("first", "chunkstore", "vllm", "ttft_avg_s")))
    if "continue" in phases:
        specs.append(("continue_chunkstore_ttft_avg_vs_example", "<=", 0.5,
                      per_rep("continue", "chunkstore", "example", "ttft_avg_s")))
        specs.append(("continue_chunkstore_throughput_vs_example", ">=", 1.5,
                      per_rep("continue", "chunkstore", "example", "throughput_rps")))
    last = phases[-1]
    specs.append(("disk_bytes_chunkstore_vs_example", "<=", 0.4, per_rep(last, "chunkstore", "example", "disk_bytes")))
    out = []
    for name, op, threshold, values in specs:
        value = worst(values, op)
        if value is not None:
            out.append(Target(name, value, op, threshold))
    return out


TARGET_LABELS = {
    "first_chunkstore_throughput_vs_vllm": "first run: chunkstore / vLLM alone, throughput",
    "first_chunkstore_ttft_avg_vs_vllm": "first run: chunkstore / vLLM alone, TTFT avg",
    "continue_chunkstore_ttft_avg_vs_example": "restart, continue: chunkstore / ExampleConnector, TTFT avg",
    "continue_chunkstore_throughput_vs_example": "restart, continue: chunkstore / ExampleConnector, throughput",
    "disk_bytes_chunkstore_vs_example": "bytes on disk at the end: chunkstore / ExampleConnector",
}


# ---- table -----------------------------------------------------------------------------------------

PHASE_TITLES = {
    "first": "first run (each system over a new data folder)",
    "continue": "restart, continue (a new process over the folder the first run left, files made cold; every "
                "conversation goes on with new questions)",
    "replay": "restart, replay (a new process over that folder, files made cold; the same conversations again)",
}
# column label, SPREAD key, format, scale
COLUMNS = (("req/s", "throughput_rps", ".2f", 1.0), ("x vLLM", "throughput_vs_vllm", ".2f", 1.0),
           ("TTFT avg s", "ttft_avg_s", ".3f", 1.0), ("x vLLM", "ttft_avg_vs_vllm", ".2f", 1.0),
           ("TTFT P90 s", "ttft_p90_s", ".3f", 1.0), ("x vLLM", "ttft_p90_vs_vllm", ".2f", 1.0),
           ("hit/ideal", "hit_rate_vs_ideal", ".2f", 1.0), ("conn. tokens", "connector_tokens", ".0f", 1.0),
           ("disk MB", "disk_bytes", ".1f", 1e-6), ("files", "disk_files", ".0f", 1.0),
           ("RSS MB", "peak_rss_bytes", ".0f", 1e-6), ("wall s", "wall_s", ".0f", 1.0),
           ("load", "load_average_1m", ".1f", 1.0))


def _cell(s: dict | None, spec: str, scale: float) -> str:
    if s is None:
        return "-"
    lo, hi = format(s["min"] * scale, spec), format(s["max"] * scale, spec)
    return lo if lo == hi else f"{lo}-{hi}"


def _phase_lines(entries: list[dict]) -> list[str]:
    head = ["system", *(c[0] for c in COLUMNS), "outputs"]
    body = []
    for e in entries:
        if e["status"] != RAN:
            body.append([e["system"], f"{e['status']} (below)"] + [""] * (len(COLUMNS) - 1) + [""])
            continue
        body.append([e["system"], *(_cell(e[key], spec, scale) for _, key, spec, scale in COLUMNS),
                     "/".join(e["outputs"]) or "-"])
    widths = [max(len(row[i]) for row in [head, *body]) for i in range(len(head))]
    fmt = lambda row: "  ".join(c.ljust(w) if i in (0, len(row) - 1) else c.rjust(w)  # noqa: E731
                                for i, (c, w) in enumerate(zip(row, widths))).rstrip()
    lines = [fmt(head)]
    for row in body:
        if row[1].endswith("(below)"):
            lines.append(f"{row[0].ljust(widths[0])}  {row[1]}")
        else:
            lines.append(fmt(row))
    return lines


def format_table(r: dict) -> str:
    """The terminal table: per phase, one row per system (ranges over the repetitions), then the
    reasons a system did not run, the outputs' check and the targets."""
    w, c = r["workload"], r["continue_workload"]
    rate = "no gaps" if math.isinf(w["request_rate"]) else f"{w['request_rate']:g} req/s Poisson"
    lines = [f"chunkstore bench vllm: {w['num_clients']} clients x {w['num_rounds']} rounds"
             + (f", then {c['num_rounds']} more after the restart" if c else "")
             + f", {w['request_length']} + {w['output_length']} tokens a round, at most {w['max_parallel']} in "
               f"flight, {rate}, seed {w['seed']}",
             f"vLLM {r['vllm_version']}, model {r['model']['description']}; block {r['block_size']} tokens, KV cache "
             f"{r['kv_blocks']} blocks ({r['kv_share']:.2f} of the first run's final histories), prefix caching "
             f"{'on' if r['prefix_caching'] else 'off'}; host tier {r['host_bytes'] / 1e6:.1f} MB where a system has "
             f"one; forward on {r['forward_threads']} of {r['cpu_count']} cores; {r['reps']} repetition(s), "
             f"orders {' | '.join(','.join(o) for o in r['orders'])}; restarts' files made cold by "
             f"{r['cold_method']}; load average {r['load_average_1m']:.1f}",
             "ranges are lowest-highest over the repetitions; x vLLM: against vLLM alone in the same repetition "
             "and phase; load: the host's 1-minute load average as the run started (the run before adds ~1)", ""]
    for phase in r["phases"]:
        lines += [PHASE_TITLES[phase], *_phase_lines([e for e in r["summary"] if e["phase"] == phase]), ""]
    reasons = {}
    for e in r["summary"]:
        if e["status"] != RAN:
            reasons.setdefault((e["system"], e["status"], e["reason"]), []).append(e["phase"])
    for e in r["summary"]:
        for note in e["notes"]:
            reasons.setdefault((e["system"], "ran", note), []).append(e["phase"])
    for (system, status, reason), phases in reasons.items():
        lines.append(f"{system} ({', '.join(phases)}): {status}: {reason}" if status != RAN else
                     f"{system} ({', '.join(phases)}): {reason}")
    diverged = [row for row in r["runs"] if row.get("outputs") and row["outputs"]["verdict"] != "identical"]
    lines.append("greedy outputs identical to vLLM alone's for every system that ran" if not diverged else
                 "greedy outputs: " + "; ".join(
                     f"{row['system']} {row['phase']} rep {row['rep'] + 1}: {row['outputs']['verdict']} "
                     f"({len(row['outputs']['near_tie_divergences'])} near ties within "
                     f"{row['outputs']['near_tie_nats']:g} nats, {len(row['outputs']['differences'])} differences)"
                     for row in diverged))
    lines.append("")
    for name, t in r["targets"].items():
        lines.append(f"{TARGET_LABELS[name]:<62} {t['value']:7.3f}  {t['target']:<7} {'pass' if t['pass'] else 'FAIL'}")
    if not r["targets"]:
        lines.append("no target applies to the systems run")
    lines += ["", "all targets met" if r["all_pass"] else "some targets missed (timings swing on a shared machine)",
              f"total {r['total_s']:.0f} s"]
    return "\n".join(lines)
