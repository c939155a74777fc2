"""`chunkstore bench vllm` with vLLM's real CPU engine on a tiny workload: vLLM alone, ExampleConnector
and the chunkstore connector (and OffloadingConnector, which refuses this host) side by side, each a
first run and a restart that continues the conversations; the JSON on stdout has every run's
figures, a system that cannot start is a row with its reason, the outputs were checked against
vLLM alone's; bad options exit 2 with a message. Timings are never asserted (a shared 2-core machine).

Run in the vLLM environment (scripts/vllm_env.sh builds it):
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_bench_vllm.py
Skipped entirely where vLLM is not installed (the main suite).
"""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from chunkstore.bench.vllm_outputs import compare_outputs  # noqa: E402
from chunkstore.bench.vllm_runner import Phase, load_failures, log_notes  # noqa: E402
from chunkstore.bench.vllm_systems import System  # noqa: E402
from chunkstore.cli import main  # noqa: E402

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
TINY = ["--num-clients", "3", "--num-rounds", "2", "--continue-rounds", "1", "--request-length", "64",
        "--output-length", "3", "--max-parallel", "2", "--reps", "1", "--no-progress"]
RUN_KEYS = {"system", "rep", "phase", "status", "reason", "num_requests", "prompt_tokens", "cached_tokens",
            "completion_tokens", "hit_rate", "hit_rate_by_source", "ideal_hit_rate", "hit_rate_vs_ideal",
            "connector_tokens", "ttft_avg_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "ttft_vllm_avg_s",
            "latency_avg_s", "duration_s", "throughput_rps", "throughput_vs_vllm", "ttft_avg_vs_vllm",
            "ttft_p90_vs_vllm", "startup_s", "wall_s", "peak_rss_bytes", "disk_bytes", "disk_files", "load_failures",
            "notes", "outputs", "load_average_1m"}


def test_a_tiny_run_reports_every_system_side_by_side(tmp_path):
    out_file, plot = tmp_path / "result.json", tmp_path / "systems.png"
    out = subprocess.run([sys.executable, "-m", "chunkstore", "bench", "vllm", *TINY, "--systems",
                          "vllm,example,offloading,chunkstore", "--json", "-o", str(out_file), "--plot", str(plot),
                          "--work-dir", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=900,
                         check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)  # stdout holds the JSON alone (vLLM's log lines go elsewhere)
    assert json.loads(out_file.read_text()) == result
    assert plot.stat().st_size > 0
    assert [s["name"] for s in result["systems"]] == ["vllm", "example", "offloading", "chunkstore"]
    assert result["phases"] == ["first", "continue"] and result["orders"] == [["vllm", "example", "offloading",
                                                                                "chunkstore"]]
    runs = {(r["system"], r["phase"]): r for r in result["runs"]}
    assert len(runs) == len(result["runs"]) == 8
    for system in ("vllm", "example", "chunkstore"):
        for phase, requests in (("first", 6), ("continue", 3)):
            run = runs[system, phase]
            assert run["status"] == "ran" and run["reason"] is None, run["reason"]
            assert RUN_KEYS <= set(run), RUN_KEYS - set(run)
            assert run["num_requests"] == requests and run["completion_tokens"] == requests * 3
            assert 0 <= run["hit_rate"] <= 1 and run["ttft_avg_s"] > 0 and run["throughput_rps"] > 0
            assert run["ttft_p50_s"] <= run["ttft_p90_s"] <= run["ttft_p99_s"]
            assert run["peak_rss_bytes"] > 0 and run["wall_s"] > 0
            for key in ("throughput_vs_vllm", "ttft_avg_vs_vllm", "ttft_p90_vs_vllm"):
                assert math.isfinite(run[key]) and run[key] > 0, key
    # A system this host cannot start is a row with the reason its process gave, not a crash.
    offloading = runs["offloading", "first"]
    if offloading["status"] != "ran":  # vLLM's OffloadingConnector refuses the CPU platform
        assert offloading["status"] == "failed" and offloading["reason"]
        assert runs["offloading", "continue"]["status"] == "skipped"
    plain = runs["vllm", "continue"]
    assert plain["connector_tokens"] == 0 and plain["disk_bytes"] is None and plain["outputs"] is None
    # The restart continues every conversation: ExampleConnector's whole-prompt match finds none of
    # the new prompts, chunkstore's blocks find their histories.
    assert runs["example", "continue"]["connector_tokens"] == 0
    restart = runs["chunkstore", "continue"]
    assert restart["connector_tokens"] > 0 and restart["hit_rate_by_source"]["connector"] > 0
    assert restart["ideal_hit_rate"] > 0 and restart["hit_rate"] > 0
    for system in ("example", "chunkstore"):
        assert runs[system, "continue"]["disk_bytes"] >= runs[system, "first"]["disk_bytes"] > 0
        assert runs[system, "first"]["disk_files"] > 0
    # Outputs are vLLM alone's, request by request, for every system that ran (near ties listed).
    assert result["outputs_identical"] is True
    for system in ("example", "chunkstore"):
        for phase in ("first", "continue"):
            outputs = runs[system, phase]["outputs"]
            assert outputs["verdict"] in ("identical", "near ties") and not outputs["differences"]
            assert 0 < outputs["compared_requests"] + outputs["not_compared_requests"] <= 6
            assert all(0 <= gap <= outputs["near_tie_nats"] for t in outputs["near_tie_divergences"]
                       for gap in t["gap_nats"])
    summary = {(e["system"], e["phase"]): e for e in result["summary"]}
    assert summary["chunkstore", "first"]["throughput_rps"]["n"] == 1
    assert summary["offloading", "first"]["status"] == offloading["status"]
    assert set(result["targets"]) == {"first_chunkstore_throughput_vs_vllm", "first_chunkstore_ttft_avg_vs_vllm",
                                      "continue_chunkstore_ttft_avg_vs_example",
                                      "continue_chunkstore_throughput_vs_example", "disk_bytes_chunkstore_vs_example"}
    assert isinstance(result["all_pass"], bool)
    assert result["kv_blocks"] > 0 and result["host_bytes"] > 0 and result["cold_method"]
    assert sorted(tmp_path.iterdir()) == sorted([out_file, plot])  # the temporary folder is gone


@pytest.mark.parametrize("argv, message", [
    (["--block-size", "48"], "multiple of"),
    (["--kv-blocks", "2"], "cannot hold one client's last request"),
    (["--num-clients", "0"], "num_clients must be an integer >= 1"),
    (["--model", "/nonexistent/model"], "not a model folder"),
    (["--forward-threads", "0"], "--forward-threads must be >= 1"),
    (["--systems", "vllm,nosuch"], "unknown system 'nosuch'; valid: vllm, example, offloading, lmcache, chunkstore"),
    (["--systems", "example,example"], "names 'example' twice"),
    (["--restart", "later"], "unknown kind 'later'; valid: continue, replay"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--continue-rounds", "0"], "--continue-rounds must be >= 1"),
    (["--plot", "/nonexistent/folder/x.png"], "does not exist"),
])
def test_bad_options_exit_2_with_a_message(argv, message, capsys):
    assert main(["bench", "vllm", *argv]) == 2
    err = capsys.readouterr().err
    assert "chunkstore bench vllm: error:" in err and message in err
    assert "Traceback" not in err


def test_systems_and_restarts_parse_in_order_with_vllm_alone_always_run():
    assert System.parse_list("chunkstore,example") == [System.VLLM, System.CHUNKSTORE, System.EXAMPLE]
    assert System.parse_list("example,vllm") == [System.EXAMPLE, System.VLLM]
    assert Phase.parse_restarts("replay,continue") == [Phase.REPLAY, Phase.CONTINUE]
    lmcache = System.LMCACHE.missing_package()
    assert (lmcache is None) is (importlib.util.find_spec("lmcache") is not None)
    assert lmcache is None or "pip install lmcache" in lmcache


def _records(*outputs: tuple[list[int], list], prompts: tuple[str, ...] = ("p0", "p1")) -> list[dict]:
    return [{"client": 0, "round": r, "output_ids": ids, "best": best, "prompt_digest": prompts[r]}
            for r, (ids, best) in enumerate(outputs)]


def test_outputs_may_part_at_a_near_tie_only():
    tie = (([5, 7], [[(5, -0.1), (6, -0.2)], [(7, -0.30), (8, -0.35)]]),   # vllm's pick, by 0.05 nats
           ([5, 8], [[(5, -0.1), (6, -0.2)], [(8, -0.50), (7, -0.52)]]))   # the other's, by 0.02
    second = ([1, 2], [[(1, -0.1), (3, -2.0)], [(2, -0.1), (4, -3.0)]])
    base = _records(tie[0], second)
    other = _records(tie[1], second)
    outputs = compare_outputs(base, other)
    assert outputs["verdict"] == "near ties" and outputs["compared_requests"] == 1
    assert outputs["not_compared_requests"] == 1  # round 1's prompt holds the other reply
    (only,) = outputs["near_tie_divergences"]
    assert (only["round"], only["token_index"]) == (0, 1)
    assert compare_outputs(base, base)["verdict"] == "identical"

    decisive = _records(([5, 8], [[(5, -0.1), (6, -0.2)], [(8, -0.1), (7, -2.5)]]))
    got = compare_outputs(_records(tie[0]), decisive)
    assert got["verdict"] == "differ" and got["differences"][0]["this"] == [5, 8]
    # Three nearly tied: vLLM alone's two best at the same logprob, the other's pick a third one
    # 0.016 nats above vLLM alone's pick (as measured once here): a near tie too.
    three = compare_outputs(_records(([212], [[(212, -4.5734), (230, -4.5734), (219, -4.60)]])),
                            _records(([230], [[(230, -4.5655), (219, -4.5812), (212, -4.5812)]])))
    assert three["verdict"] == "near ties" and three["near_tie_divergences"][0]["gap_nats"] == \
        [pytest.approx(0.0), pytest.approx(0.0157)]
    # A prompt that is not the same tokens (a history that parted earlier) is not compared.
    moved = compare_outputs(base, _records(tie[0], second, prompts=("p0", "elsewhere")))
    assert moved["verdict"] == "identical" and moved["not_compared_requests"] == 1


def test_kv_load_failures_and_degraded_connectors_are_read_from_the_log():
    log = ("WARNING [scheduler.py:3426] Recovered from KV load failure: 2 request(s) rescheduled "
           "(768 tokens affected).\nERROR Failing 1 request(s) due to KV load failure (failure_policy=fail, "
           "64 tokens affected). Request IDs: x\n")
    assert load_failures(log) == {"requests": 3, "tokens": 832}
    assert load_failures("nothing failed") == {"requests": 0, "tokens": 0}
    degraded = ("LMCache ERROR: Failed to initialize LMCacheManager components: Traceback:\n"
                "RuntimeError: No supported cpu connector found.\n. System will operate in degraded mode (recompute).\n"
                "LMCache ERROR: Timeout occurred for rank 0, recreating all sockets.\n")
    assert log_notes(degraded) == ["ran degraded (RuntimeError: No supported cpu connector found.): nothing stored "
                                   "or loaded", "lookups that timed out: 1"]
    assert log_notes(log) == []
