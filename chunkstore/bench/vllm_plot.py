"""``chunkstore bench vllm --plot``: a PNG of the systems side by side, drawn from the result's
summary alone (the dict the table and the JSON show).

Invariants: a bar is a median over the repetitions and its whisker the lowest-highest; ratios are
drawn on a log scale; a system that did not run in a phase has no bar there, and says so under its
name, as a degraded one does.
"""

from __future__ import annotations

from pathlib import Path

PANELS = (("throughput_vs_vllm", "throughput / vLLM alone"), ("ttft_avg_vs_vllm", "average TTFT / vLLM alone"),
          ("ttft_p90_vs_vllm", "P90 TTFT / vLLM alone"), ("hit_rate_vs_ideal", "hit rate / ideal"))


def check_matplotlib() -> None:
    """Raises ValueError when matplotlib is missing (checked before minutes of benchmark)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("--plot needs matplotlib: pip install 'chunkstore[plot]'") from None


def write_plot(result: dict, path: Path) -> None:
    """Per phase, the throughput and TTFT ratios and the hit rate against the ideal; then the
    bytes on disk at the end of the last phase. Raises ValueError without matplotlib."""
    check_matplotlib()
    import matplotlib

    matplotlib.use("Agg", force=True)
    import numpy as np
    from matplotlib import pyplot as plt

    phases, systems = result["phases"], [s["name"] for s in result["systems"]]
    x = np.arange(len(systems))
    fig, axes = plt.subplots(1, len(PANELS) + 1, figsize=(4.2 * (len(PANELS) + 1), 4.6))
    width = 0.8 / len(phases)
    for k, phase in enumerate(phases):
        entries = {e["system"]: e for e in result["summary"] if e["phase"] == phase}
        for ax, (key, title) in zip(axes, PANELS):
            mids, lows, highs = [], [], []
            for name in systems:
                s = entries[name][key]
                mids.append(s["median"] if s else np.nan)
                lows.append(s["median"] - s["min"] if s else 0.0)
                highs.append(s["max"] - s["median"] if s else 0.0)
            ax.bar(x + (k - (len(phases) - 1) / 2) * width, mids, width, yerr=[lows, highs], capsize=3, label=phase)
            ax.set_title(title, fontsize=9)
    last = {e["system"]: e for e in result["summary"] if e["phase"] == phases[-1]}
    disk = [last[name]["disk_bytes"]["median"] / 1e6 if last[name]["disk_bytes"] else np.nan for name in systems]
    axes[-1].bar(x, disk, color="#8172b2")
    axes[-1].set_title(f"MB on disk after the {phases[-1]} run", fontsize=9)
    ran = {name: all(e["status"] == "ran" for e in result["summary"] if e["system"] == name) for name in systems}
    degraded = {e["system"] for e in result["summary"] if any("degraded" in n for n in e["notes"])}
    labels = [f"{name}\n(did not run)" if not ran[name] else f"{name}\n(degraded)" if name in degraded else name
              for name in systems]
    for ax in axes:
        ax.set_xticks(x, labels, rotation=20, ha="right", fontsize=8)
    for ax in axes[:3]:  # ratios: on a log scale 2x and 0.5x sit as far from 1 (and a degraded 30x fits)
        ax.set_yscale("log")
        ax.axhline(1.0, color="grey", linewidth=0.8)
    axes[0].legend(fontsize=8)
    fig.suptitle(format_title(result), fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def format_title(result: dict) -> str:
    w = result["workload"]
    return (f"chunkstore bench vllm: {w['num_clients']} clients x {w['num_rounds']} rounds, vLLM "
            f"{result['vllm_version']}, {result['reps']} repetition(s); bars: medians, whiskers: lowest-highest")
