"""``chunkstore bench multiturn``'s figures: one run's summary, the targets, the table and the plot.

Invariants: one function (``summarize_run``) builds every figure and the table, the JSON and the
plot only show its dict, so they never disagree; hit rates are cached / prompt tokens as the
requests report them (SGLang's definition); a figure a backend cannot measure (the cache's
transfer paths over HTTP) is None, never 0; targets are reported, never asserted.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from chunkstore.bench.common import Target
from chunkstore.bench.contention import ForwardCost, contention_factor, ttft_floor_avg_s
from chunkstore.bench.workload import DriveResult, ideal_cached_tokens
from chunkstore.cache.stats import HIT_TIERS, CacheStats

PERCENTILES = (50, 90, 99)
_PATHS = ("device_to_host", "host_to_disk", "disk_to_host", "host_to_device")


def _mean(values: list[float]) -> float:
    return float(np.mean(values)) if values else math.nan


def _latency_figures(prefix: str, values: list[float]) -> dict[str, float]:
    out = {f"{prefix}_avg_s": _mean(values)}
    for p in PERCENTILES:
        out[f"{prefix}_p{p}_s"] = float(np.percentile(values, p)) if values else math.nan
    return out


def ideal_hit_rate(result: DriveResult, page_size: int) -> float:
    """The hit rate an infinite cache reaches on the requests this run sent (their actual lengths)."""
    by_client: dict[int, dict[int, tuple[int, int]]] = {}
    for rec in result.records:
        by_client.setdefault(rec.client, {})[rec.round_index] = (rec.reply.prompt_tokens, rec.reply.completion_tokens)
    cached = prompt = 0
    for rounds in by_client.values():
        for r, (prompt_tokens, _) in rounds.items():
            cached += ideal_cached_tokens(prompt_tokens, rounds.get(r - 1), page_size)
            prompt += prompt_tokens
    return cached / prompt if prompt else 0.0


def tier_bytes(stats: CacheStats) -> dict[str, dict[str, int]]:
    """Bytes read from and written to each tier by the transfer paths (a page computed on the
    device and inserted is not a transfer: it counts nowhere)."""
    b = {name: stats.paths[name].num_bytes for name in _PATHS}
    return {
        "device": {"read": b["device_to_host"], "written": b["host_to_device"]},
        "host": {"read": b["host_to_disk"] + b["host_to_device"], "written": b["device_to_host"] + b["disk_to_host"]},
        "disk": {"read": b["disk_to_host"], "written": b["host_to_disk"]},
    }


def load_s_per_token(stats: CacheStats, bytes_per_token: float) -> dict[str, float | None]:
    """Worker wall time per token moved: host = host->device; disk = disk->host plus host->device
    (the whole way up). None for a path that moved nothing."""
    def per_token(name: str) -> float | None:
        p = stats.paths[name]
        return p.total_s / (p.num_bytes / bytes_per_token) if p.num_bytes else None

    host, disk = per_token("host_to_device"), per_token("disk_to_host")
    return {"host": host, "disk": disk + (host or 0.0) if disk is not None else None}


def _per_page(cpu_s: float | None, stats: CacheStats, path: str) -> float | None:
    pages = stats.paths[path].num_pages
    return cpu_s / pages if cpu_s is not None and pages else None


def summarize_run(name: str, description: str, result: DriveResult, stats: CacheStats | None, *,
                  page_size: int, bytes_per_token: float | None, extra: dict | None = None,
                  forward_cost: ForwardCost | None = None, store_cpu_s: dict[str, float | None] | None = None) -> dict:
    """Every figure of one configuration's run, JSON-ready (NaN and None where not measurable).
    ``forward_cost``: the forward's cost fitted on this invocation's no-cache run (contention.py);
    ``store_cpu_s``: CPU seconds of the store's write and load threads over the run."""
    replies = [rec.reply for rec in result.records]
    prompt = sum(r.prompt_tokens for r in replies)
    cached = sum(r.cached_tokens for r in replies)
    completion = sum(r.completion_tokens for r in replies)
    has_tiers = all(r.tier_tokens is not None for r in replies)
    by_tier = {t: sum(r.tier_tokens[t] for r in replies) / prompt if has_tiers and prompt else None
               for t in HIT_TIERS}
    cold = [r for r in replies if r.cached_tokens == 0 and r.prefill_s is not None]
    prefill_per_token = (sum(r.prefill_s for r in cold) / sum(r.prompt_tokens for r in cold)) if cold else None
    timed = [r for r in replies if r.forward_s is not None and r.prompt_tokens > r.cached_tokens]
    computed = sum(r.prompt_tokens - r.cached_tokens for r in timed)
    duration = result.duration_s
    hit_rate = cached / prompt if prompt else 0.0
    ideal = ideal_hit_rate(result, page_size)
    run = {
        "name": name,
        "description": description,
        "num_requests": len(replies),
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "completion_tokens": completion,
        "hit_rate": hit_rate,
        "hit_rate_by_tier": by_tier,
        "ideal_hit_rate": ideal,
        "hit_rate_vs_ideal": hit_rate / ideal if ideal else None,
        **_latency_figures("ttft", [r.ttft_s for r in replies]),
        **_latency_figures("latency", [r.latency_s for r in replies]),
        "duration_s": duration,
        "throughput_rps": len(replies) / duration,
        "input_tokens_per_s": prompt / duration,
        "output_tokens_per_s": completion / duration,
        "tokens_per_s": (prompt + completion) / duration,
        "prefill_s_per_token": prefill_per_token,
        "forward_s_per_token": sum(r.forward_s for r in timed) / computed if computed else None,
        "contention_factor": contention_factor(replies, forward_cost),
        "ttft_served_avg_s": (_mean([r.ttft_s - r.queue_s for r in replies])
                              if replies and all(r.queue_s is not None for r in replies) else None),
        "ttft_floor_avg_s": None,
        "ttft_vs_floor": None,
        "throughput_at_floor_rps": None,
        "store_cpu_s": store_cpu_s,
        "store_cpu_s_per_page": None,
        "load_s_per_token": None,
        "bytes_by_tier": None,
        "paths": None,
        "evicted_pages": None,
        "cache_stats": None,
    }
    if stats is not None and bytes_per_token:
        run["load_s_per_token"] = load_s_per_token(stats, bytes_per_token)
        run["bytes_by_tier"] = tier_bytes(stats)
        run["paths"] = {name: {"pages": p.num_pages, "bytes": p.num_bytes, "failed_pages": p.failed_pages,
                               "total_s": p.total_s, "gbps": p.gbps} for name, p in stats.paths.items()}
        run["evicted_pages"] = dict(stats.evicted_pages)
        run["cache_stats"] = stats.as_dict()
        floor = ttft_floor_avg_s(replies, forward_cost, run["load_s_per_token"])
        run["ttft_floor_avg_s"] = floor
        served = run["ttft_served_avg_s"]
        run["ttft_vs_floor"] = served / floor if floor and served is not None else None
        run["throughput_at_floor_rps"] = throughput_at_floor(run)
        if store_cpu_s is not None:
            run["store_cpu_s_per_page"] = {"written": _per_page(store_cpu_s["write"], stats, "host_to_disk"),
                                           "loaded": _per_page(store_cpu_s["load"], stats, "disk_to_host")}
    run.update(extra or {})
    return run


def throughput_at_floor(run: dict) -> float | None:
    """The throughput the run would have had with every prefill at its TTFT floor: the engine is
    saturated here (requests queue: TTFT is mostly waiting), so its duration is the sum of the
    requests' service times, and each would be ``served - floor`` shorter. Decode steps and the
    forward's fixed cost stay: what no cache removes. None without a floor."""
    served, floor = run.get("ttft_served_avg_s"), run.get("ttft_floor_avg_s")
    if served is None or floor is None or not run["num_requests"]:
        return None
    duration = run["duration_s"] - run["num_requests"] * (served - floor)
    return run["num_requests"] / duration if duration > 0 else None


def bounds(runs: list[dict]) -> dict[str, float]:
    """Figures beside the targets that say what the workload allows on this machine: the disk
    run's throughput over the memory run's, both at their floors (the most a disk tier with no
    contention and no load cost beyond its measured per-token figures could reach)."""
    by_name = {r["name"]: r for r in runs}
    disk, memory = by_name.get("device+host+disk"), by_name.get("device+host")
    if disk is None or memory is None:
        return {}
    at_floor = disk.get("throughput_at_floor_rps"), memory.get("throughput_at_floor_rps")
    if None in at_floor:
        return {}
    return {"disk_throughput_vs_device_host_at_floor": at_floor[0] / at_floor[1]}


# ---- targets ---------------------------------------------------------------------------------------

def targets(runs: list[dict]) -> list[Target]:
    """The benchmark's targets that the runs present allow (none is asserted)."""
    by_name = {r["name"]: r for r in runs}
    disk, memory, restart = (by_name.get(n) for n in ("device+host+disk", "device+host", "disk-restart"))
    out = []
    if disk is not None and disk["ideal_hit_rate"]:
        out.append(Target("disk_hit_rate_vs_ideal", disk["hit_rate"] / disk["ideal_hit_rate"], ">=", 0.95))
    if disk is not None and memory is not None:
        out.append(Target("disk_throughput_vs_device_host", disk["throughput_rps"] / memory["throughput_rps"],
                          ">=", 1.6))
        out.append(Target("disk_ttft_avg_vs_device_host", disk["ttft_avg_s"] / memory["ttft_avg_s"], "<=", 0.57))
    if disk is not None and disk.get("contention_factor") is not None:
        out.append(Target("disk_contention_factor", disk["contention_factor"], "<=", 1.15))
    if disk is not None and disk.get("ttft_vs_floor") is not None:
        out.append(Target("disk_ttft_vs_floor", disk["ttft_vs_floor"], "<=", 1.2))
    if disk is not None and restart is not None and disk["hit_rate"]:
        out.append(Target("restart_hit_rate_vs_disk", restart["hit_rate"] / disk["hit_rate"], ">=", 0.9))
    return out


_TARGET_LABELS = {
    "disk_hit_rate_vs_ideal": "device+host+disk hit rate / ideal",
    "disk_throughput_vs_device_host": "device+host+disk throughput / device+host",
    "disk_ttft_avg_vs_device_host": "device+host+disk avg TTFT / device+host",
    "restart_hit_rate_vs_disk": "disk-restart hit rate / device+host+disk",
    "disk_contention_factor": "device+host+disk forward / uncontended",
    "disk_ttft_vs_floor": "device+host+disk served TTFT / its floor",
}


_BOUND_LABELS = {
    "disk_throughput_vs_device_host_at_floor": "the throughput ratio, both runs at floor",
}


# ---- table -----------------------------------------------------------------------------------------

def _fmt(value, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return format(value, spec)


def _tier(run: dict, key: str, tier: str, field: str | None = None, spec: str = ".3f", scale: float = 1.0):
    value = run.get(key)
    if value is None:
        return "-"
    value = value.get(tier) if field is None else value.get(tier, {}).get(field)
    return _fmt(value * scale if value is not None else None, spec)


def format_table(result: dict) -> str:
    """The terminal table: one column per configuration, then the targets."""
    runs = result["runs"]
    rows: list[tuple[str, list[str]]] = [
        ("hit rate", [_fmt(r["hit_rate"], ".3f") for r in runs]),
        *[(f"  from {t}", [_tier(r, "hit_rate_by_tier", t) for r in runs]) for t in HIT_TIERS],
        ("ideal hit rate (infinite cache)", [_fmt(r["ideal_hit_rate"], ".3f") for r in runs]),
        ("TTFT avg (s)", [_fmt(r["ttft_avg_s"], ".3f") for r in runs]),
        *[(f"TTFT P{p} (s)", [_fmt(r[f"ttft_p{p}_s"], ".3f") for r in runs]) for p in PERCENTILES],
        ("latency avg (s)", [_fmt(r["latency_avg_s"], ".3f") for r in runs]),
        ("latency P90 (s)", [_fmt(r["latency_p90_s"], ".3f") for r in runs]),
        ("throughput (req/s)", [_fmt(r["throughput_rps"], ".3f") for r in runs]),
        ("input tokens/s", [_fmt(r["input_tokens_per_s"], ".0f") for r in runs]),
        ("output tokens/s", [_fmt(r["output_tokens_per_s"], ".1f") for r in runs]),
        ("duration (s)", [_fmt(r["duration_s"], ".1f") for r in runs]),
        *[(f"{tier} MB read / written", [f"{_tier(r, 'bytes_by_tier', tier, 'read', '.1f', 1e-6)} / "
                                         f"{_tier(r, 'bytes_by_tier', tier, 'written', '.1f', 1e-6)}" for r in runs])
          for tier in HIT_TIERS],
        ("prefill ms/token (cold requests)", [_fmt(_scaled(r["prefill_s_per_token"]), ".3f") for r in runs]),
        ("load ms/token from host", [_tier(r, "load_s_per_token", "host", None, ".4f", 1e3) for r in runs]),
        ("load ms/token from disk", [_tier(r, "load_s_per_token", "disk", None, ".4f", 1e3) for r in runs]),
        ("forward ms/computed token", [_fmt(_scaled(r.get("forward_s_per_token")), ".3f") for r in runs]),
        ("contention (forward / no-cache fit)", [_fmt(r.get("contention_factor"), ".2f") for r in runs]),
        ("TTFT from prefill start avg (s)", [_fmt(r.get("ttft_served_avg_s"), ".3f") for r in runs]),
        ("TTFT floor avg (s)", [_fmt(r.get("ttft_floor_avg_s"), ".3f") for r in runs]),
        ("  TTFT from prefill start / floor", [_fmt(r.get("ttft_vs_floor"), ".2f") for r in runs]),
        ("throughput at the floor (req/s)", [_fmt(r.get("throughput_at_floor_rps"), ".3f") for r in runs]),
        ("store CPU ms/page written", [_tier(r, "store_cpu_s_per_page", "written", None, ".2f", 1e3) for r in runs]),
        ("store CPU ms/page loaded", [_tier(r, "store_cpu_s_per_page", "loaded", None, ".2f", 1e3) for r in runs]),
    ]
    names = [r["name"] for r in runs]
    label_width = max(len(label) for label, _ in rows)
    widths = [max(len(n), *(len(cells[i]) for _, cells in rows)) for i, n in enumerate(names)]
    lines = [result["header"], ""]
    lines.append(" " * label_width + "  " + "  ".join(n.rjust(w) for n, w in zip(names, widths)))
    lines += [label.ljust(label_width) + "  " + "  ".join(c.rjust(w) for c, w in zip(cells, widths))
              for label, cells in rows]
    if result["targets"]:
        lines.append("")
        for name, t in result["targets"].items():
            lines.append(f"{_TARGET_LABELS[name]:<44} {t['value']:8.3f}  {t['target']:<7} "
                         f"{'pass' if t['pass'] else 'FAIL'}")
        for name, value in result.get("bounds", {}).items():
            lines.append(f"{_BOUND_LABELS[name]:<44} {value:8.3f}  (what the floors allow)")
        lines += ["", "all targets met" if result["all_pass"] else "some targets missed"]
    return "\n".join(lines)


def _scaled(seconds: float | None) -> float | None:
    return seconds * 1e3 if seconds is not None else None


# ---- plot ------------------------------------------------------------------------------------------

def write_plot(result: dict, path: Path) -> None:
    """A PNG comparing the configurations: hit rate by tier against the ideal, TTFT, throughput.
    Raises RuntimeError when matplotlib is not installed (``pip install chunkstore[plot]``)."""
    try:
        import matplotlib
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'chunkstore[plot]'") from None
    matplotlib.use("Agg", force=True)
    from matplotlib import pyplot as plt

    runs = result["runs"]
    names = [r["name"] for r in runs]
    x = np.arange(len(runs))
    fig, (ax_hit, ax_ttft, ax_tput) = plt.subplots(1, 3, figsize=(15, 4.8))
    bottom = np.zeros(len(runs))
    has_tiers = all(r["hit_rate_by_tier"]["device"] is not None for r in runs)
    for tier, color in zip(HIT_TIERS, ("#4c72b0", "#55a868", "#c44e52")):
        values = np.array([r["hit_rate_by_tier"][tier] or 0.0 for r in runs]) if has_tiers else \
            np.array([r["hit_rate"] for r in runs]) * (tier == "device")
        ax_hit.bar(x, values, bottom=bottom, color=color, label=tier if has_tiers else "cached")
        bottom += values
    ax_hit.scatter(x, [r["ideal_hit_rate"] for r in runs], marker="_", s=900, color="black", label="ideal", zorder=3)
    ax_hit.set(title="cache hit rate (cached / prompt tokens)", ylim=(0, 1.25))
    ax_hit.legend(loc="upper center", ncol=4, fontsize=8)
    width = 0.38
    ax_ttft.bar(x - width / 2, [r["ttft_avg_s"] for r in runs], width, label="average")
    ax_ttft.bar(x + width / 2, [r["ttft_p90_s"] for r in runs], width, label="P90")
    ax_ttft.set(title="time to first token (s)")
    ax_ttft.legend(fontsize=8)
    ax_tput.bar(x, [r["throughput_rps"] for r in runs], color="#8172b2")
    ax_tput.set(title="throughput (requests/s)")
    for ax in (ax_hit, ax_ttft, ax_tput):
        ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
    fig.suptitle(result["header"].split("\n")[0], fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
