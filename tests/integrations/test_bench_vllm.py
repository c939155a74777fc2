"""`chunkstore bench vllm` with vLLM's real CPU engine on a tiny workload: the JSON on stdout has every
configuration's figures, the restart finds the blocks the connector run saved, the greedy outputs
matched; bad options exit 2 with a message. Timings are never asserted (a shared 2-core machine).

Run in the vLLM environment (scripts/vllm_env.sh builds it):
    .venv-vllm/bin/python -m pytest -q -p no:cacheprovider tests/integrations/test_bench_vllm.py
Skipped entirely where vLLM is not installed (the main suite).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from chunkstore.bench import vllm as bench  # noqa: E402
from chunkstore.cli import main  # noqa: E402

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
TINY = ["--num-clients", "3", "--num-rounds", "2", "--request-length", "64", "--output-length", "3",
        "--max-parallel", "2", "--request-rate", "inf", "--no-progress"]
RUN_KEYS = {"name", "description", "num_requests", "prompt_tokens", "cached_tokens", "completion_tokens", "hit_rate",
            "hit_rate_by_source", "ideal_hit_rate", "ttft_avg_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
            "ttft_vllm_avg_s", "latency_avg_s", "latency_p90_s", "duration_s", "throughput_rps", "input_tokens_per_s",
            "output_tokens_per_s", "startup_s", "warm_up_s", "wall_s", "chunks_stored", "chunk_wait_s",
            "load_failures"}
RATIOS = ("restart_ttft_avg_vs_vllm", "restart_ttft_p50_vs_vllm", "restart_ttft_p90_vs_vllm",
          "restart_throughput_vs_vllm", "restart_hit_rate_vs_chunkstore", "chunkstore_ttft_avg_vs_vllm",
          "chunkstore_throughput_vs_vllm")


def test_a_tiny_run_reports_all_three_configurations(tmp_path):
    out_file = tmp_path / "result.json"
    out = subprocess.run([sys.executable, "-m", "chunkstore", "bench", "vllm", *TINY, "--json", "-o", str(out_file),
                          "--work-dir", str(tmp_path)], capture_output=True, text=True, cwd=REPO, timeout=600,
                         check=False)
    assert out.returncode == 0, out.stderr[-4000:]
    result = json.loads(out.stdout)  # stdout holds the JSON alone (vLLM's log lines go elsewhere)
    assert json.loads(out_file.read_text()) == result
    assert [r["name"] for r in result["runs"]] == ["vllm", "vllm+chunkstore", "restart"]
    for run in result["runs"]:
        assert RUN_KEYS <= set(run), RUN_KEYS - set(run)
        assert run["num_requests"] == 6 and run["completion_tokens"] == 6 * 3
        assert 0 <= run["hit_rate"] <= 1 and run["ttft_avg_s"] > 0 and run["throughput_rps"] > 0
        assert run["ttft_p50_s"] <= run["ttft_p90_s"] <= run["ttft_p99_s"]
    plain, connector, restart = result["runs"]
    assert plain["hit_rate_by_source"]["chunkstore"] == 0
    # The restart's vLLM starts empty: its hits on the first round come from the store alone.
    assert restart["hit_rate"] > 0 and restart["hit_rate_by_source"]["chunkstore"] > 0
    assert restart["load_failures"]["tokens"] < restart["cached_tokens"]  # some of its hits were loaded
    assert plain["load_failures"] == {"requests": 0, "tokens": 0}
    assert connector["chunks_stored"] >= result["chunks_expected"] > 0  # prompt blocks; reply blocks may add
    # The run fails (exit 1) on a difference other than a near tie; near ties are listed.
    outputs = result["outputs"]
    assert result["outputs_identical"] is (not outputs["near_tie_divergences"])
    assert 0 < outputs["compared_requests"] <= 2 * 6
    for tie in outputs["near_tie_divergences"]:
        assert tie["configuration"] in ("vllm+chunkstore", "restart")
        assert all(0 <= gap <= outputs["near_tie_nats"] for gap in tie["gap_nats"])
    assert result["kv_blocks"] > 0 and result["prefix_caching"] is True and result["cold_method"]
    for key in RATIOS:
        assert result[key] is not None and math.isfinite(result[key]) and result[key] > 0, key
    target = result["targets"]["restart_hit_rate_vs_chunkstore"]
    assert target["value"] == result["restart_hit_rate_vs_chunkstore"] and target["target"] == ">= 0.95"
    assert isinstance(result["all_pass"], bool)
    assert list(tmp_path.iterdir()) == [out_file]  # the temporary folder (model, data folder) is gone


@pytest.mark.parametrize("argv, message", [
    (["--block-size", "48"], "multiple of"),
    (["--kv-blocks", "2"], "cannot hold one client's last request"),
    (["--num-clients", "0"], "num_clients must be an integer >= 1"),
    (["--model", "/nonexistent/model"], "not a model folder"),
    (["--forward-threads", "0"], "--forward-threads must be >= 1"),
])
def test_bad_options_exit_2_with_a_message(argv, message, capsys):
    assert main(["bench", "vllm", *argv]) == 2
    err = capsys.readouterr().err
    assert "chunkstore bench vllm: error:" in err and message in err
    assert "Traceback" not in err


def _records(*outputs: tuple[list[int], list]) -> dict:
    return {"records": [{"client": 0, "round": r, "output_ids": ids, "top2": top2}
                        for r, (ids, top2) in enumerate(outputs)]}


def test_outputs_may_part_at_a_near_tie_only():
    tie = (([5, 7], [[(5, -0.1), (6, -0.2)], [(7, -0.30), (8, -0.35)]]),   # vllm's pick, by 0.05 nats
           ([5, 8], [[(5, -0.1), (6, -0.2)], [(8, -0.50), (7, -0.52)]]))   # the other's, by 0.02
    base = _records(tie[0], ([1, 2], [[(1, -0.1), (3, -2.0)], [(2, -0.1), (4, -3.0)]]))
    other = _records(tie[1], ([9, 9], [[(9, -0.1), (1, -2.0)], [(9, -0.1), (2, -3.0)]]))  # round 1: another prompt
    got = {bench.Setup.VLLM: base, bench.Setup.CONNECTOR: base, bench.Setup.RESTART: other}
    outputs = bench.compare_outputs(got)
    assert outputs["identical"] is False and outputs["compared_requests"] == 3
    (only,) = outputs["near_tie_divergences"]
    assert (only["configuration"], only["round"], only["token_index"]) == ("restart", 0, 1)

    decisive = _records(([5, 8], [[(5, -0.1), (6, -0.2)], [(8, -0.1), (7, -2.5)]]))
    with pytest.raises(bench.BenchFailure, match="not a near tie"):
        bench.compare_outputs({bench.Setup.VLLM: _records(tie[0]), bench.Setup.CONNECTOR: decisive,
                               bench.Setup.RESTART: _records(tie[0])})


def test_kv_load_failures_are_read_from_vllms_warnings():
    log = ("WARNING [scheduler.py:3426] Recovered from KV load failure: 2 request(s) rescheduled "
           "(768 tokens affected).\nERROR Failing 1 request(s) due to KV load failure (failure_policy=fail, "
           "64 tokens affected). Request IDs: x\n")
    assert bench.load_failures(log) == {"requests": 3, "tokens": 832}
    assert bench.load_failures("nothing failed") == {"requests": 0, "tokens": 0}
