"""`chunkstore bench fleet --simulate-servers` and `--index-rows` at a tiny size, on their own
throwaway PostgreSQL and S3 servers: every N runs as processes of its own and every figure of the
JSON is there and sane; bad options are refused. Timings and targets are reported, never asserted
(shared, noisy machines)."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from chunkstore.bench import fleet as bench
from chunkstore.bench import fleet_rows
from chunkstore.bench.fleet_sizing import fit_line, servers_by_lock
from chunkstore.bench.fleet_trace import TraceConfig, schedule, tokens
from tests.helpers.server import REPO


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_the_trace_sends_a_conversations_next_round_to_the_next_server():
    cfg = TraceConfig(servers=4, rate_per_server=2.0, duration_s=20.0, think_s=2.0, rounds=3)
    requests = schedule(cfg)
    assert requests == schedule(cfg)  # the same in every process
    by_conversation: dict[tuple[int, int], list] = {}
    for r in requests:
        by_conversation.setdefault((r.slot, r.conversation), []).append(r)
    for rounds in by_conversation.values():
        assert [r.round for r in rounds] == list(range(len(rounds)))
        assert len({r.namespace for r in rounds}) == 1
        assert all(b.server == (a.server + 1) % cfg.servers for a, b in zip(rounds, rounds[1:]))
        prompt, answer = tokens(cfg, rounds[-1])  # a round's prompt extends the last one's prompt and answer
        if len(rounds) > 1:
            before, said = tokens(cfg, rounds[-2])
            assert prompt[:len(before) + len(said)] == before + said
        assert len(prompt) == rounds[-1].round * 80 + 64 and len(answer) == 16


def test_the_evictor_lock_bounds_the_fleet_whatever_the_databases_cores():
    assert servers_by_lock(1.0, 0.010) == 70  # held 10 ms a request: 70 requests a second at 70%
    assert servers_by_lock(5.0, 0.010) == 14
    assert servers_by_lock(1.0, 0.0) is None  # an unbounded tier never takes it


def test_the_activity_sampler_sees_the_evictor_lock_held_and_waited_for(postgres_url):
    """What the lock's figures are read from: a server holding the evictor lock for a second, a
    second server waiting for it meanwhile."""
    import threading
    import time

    from sqlalchemy.engine import make_url

    from chunkstore.bench.fleet_probes import ActivitySampler
    from chunkstore.disk.index import ChunkIndex

    database = make_url(postgres_url).database
    holder, waiter = ChunkIndex(postgres_url), ChunkIndex(postgres_url)

    def wait_for_it():
        with waiter.evictor_lock():
            pass

    try:
        idle = ActivitySampler(postgres_url, database)
        idle.start()
        time.sleep(0.5)
        before = idle.stop()
        sampler = ActivitySampler(postgres_url, database)
        sampler.start()
        with holder.evictor_lock():
            waiting = threading.Thread(target=wait_for_it)
            waiting.start()
            time.sleep(1.0)
        waiting.join(timeout=30)
        during = sampler.stop()
    finally:
        holder.close()
        waiter.close()
    assert before.samples >= 2 and before.held_share == 0 and before.waiting_share == 0
    assert during.samples >= 5 and during.held_share >= 0.5 and during.waiting_share >= 0.4


def test_the_models_line_is_fitted_by_relative_error():
    """The database's cores at N = 1, 16 and 32 of one run: one server's 0.012 cores are its
    upkeep more than its requests. A plain least-squares line followed the two large points and
    predicted 62% too little at N = 1; by relative error every N is within 20%."""
    rates, cores = [0.43, 8.13, 17.62], [0.0120, 0.0576, 0.1596]
    fixed, per_request = fit_line(rates, cores)
    assert fixed > 0 and per_request > 0
    assert max(abs((fixed + per_request * x) / y - 1) for x, y in zip(rates, cores)) < 0.2
    assert fit_line([1.0, 2.0, 3.0], [3.0, 5.0, 7.0]) == pytest.approx((1.0, 2.0))  # a line is itself
    assert fit_line([1.0, 2.0], [1.0, 3.0]) == pytest.approx((0.0, 15 / 13))  # no negative upkeep: through 0
    assert fit_line([1.0, 2.0, 3.0], [0.0, 5.0, 7.0]) == fit_line([2.0, 3.0], [5.0, 7.0])  # nothing measured
    assert fit_line([1.0], [0.0]) == (0.0, 0.0)


@pytest.mark.parametrize("argv, says", [(["--simulate-servers", "0,4"], "at least 1"),
                                        (["--simulate-servers", "one"], "not a list of server counts"),
                                        (["--index-rows", "12"], "at least 1k"),
                                        (["--index-rows", "ten"], "not a row count")])
def test_bad_scale_options_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as exc:
        parse(argv)
    assert exc.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.slow  # tens of seconds: CI runs it, the fast subset does not
def test_one_and_four_simulated_servers_report_every_figure(tmp_path, capsys, postgres_server, moto_s3):
    out = tmp_path / "scale.json"
    argv = ["--simulate-servers", "1,4", "--sim-rate", "2", "--sim-warmup", "2", "--sim-duration", "3",
            "--sim-min-requests", "0", "--no-progress", "--output", str(out)]
    assert bench.run(parse(argv)) == 0
    r = json.loads(out.read_text())
    assert [p["servers"] for p in r["points"]] == [1, 4]
    for p in r["points"]:
        assert p["requests"] > 0 and p["requests_per_s"] > 0 and p["window_s"] > 0
        assert p["lookup_ms"]["n"] == p["requests"] and p["lookup_ms"]["p50"] <= p["lookup_ms"]["p99"]
        in_db = p["lookup_db_ms"]  # the lookup statement's own time in PostgreSQL (puts send it too)
        assert in_db["calls"] >= p["requests"] // 2 and 0 < in_db["mean_ms"] <= in_db["max_ms"]
        assert p["publish_ms"]["n"] > 0
        assert 0 <= p["local_copy_hits_per_request"] <= p["loaded_pages_per_request"]
        assert p["db_cpu_s"] >= 0 and p["statements_per_1000_requests"] > 0 and p["top_statements"]
        assert p["connections"]["max"] >= p["servers"]  # each server its own pool
        assert 0 <= p["evictor_lock"]["waiting_share"] <= 1 and p["evictor_lock"]["samples"] > 0
        lock = p["evictor_lock"]
        assert 0 <= lock["held_share"] <= 1 and lock["held_s_per_request"] >= 0 and lock["sampled_held_s_per_request"] >= 0
        assert lock["passes_per_request"] >= 0 and lock["waited_s_per_request"] >= 0  # only puts that must evict
        room = p["room_lock"]
        assert room["passes_per_request"] > 0 and room["pass_ms"]["n"] > 0  # a bounded tier: every commit passes it
        assert 0 < room["pass_ms"]["p50"] <= room["pass_ms"]["p90"] and room["waited_s_per_request"] >= 0
        assert room["held_s_per_request"] > 0
        assert p["bucket_requests_per_request"] is None or p["bucket_requests_per_request"] > 0
        assert 0 < p["machine_busy_share"] <= 1
    model = r["model"]
    assert set(model["fitted_on_servers"]) <= {1, 4} and len(model["checks"]) == 2
    assert model["statements_per_request"] > 0 and model["db_cpu_s_per_request"] >= 0
    assert model["servers_per_database"] and all(set(c["error"]) <= set(c["measured"]) for c in model["checks"])
    assert model["lock_from_servers"] in (1, 4) and model["evictor_lock_s_per_request"] >= 0
    assert model["room_lock_s_per_request"] > 0
    for lock in ("evictor_lock", "room_lock"):
        assert all(n is None or n >= 0 for n in model[f"servers_by_{lock}"].values())
    assert {"db_cpu_per_request_largest_vs_smallest", "statements_per_request_largest_vs_smallest",
            "lookup_p99_largest_vs_smallest"} <= set(r["targets"])
    text = capsys.readouterr().out
    assert "stmts/1k req" in text and "in db mean/max" in text


def test_the_index_sizes_lookups_alternate_and_each_size_gets_all_of_its_own():
    sizes = ["100k", "1M", "10M"]
    turns = list(fleet_rows.lookup_rounds(sizes, 501))
    assert len(turns) == fleet_rows.LOOKUP_ROUNDS * len(sizes)
    for size in sizes:
        assert sum(n for s, n in turns if s == size) == 501
    firsts = [turns[r * len(sizes)][0] for r in range(fleet_rows.LOOKUP_ROUNDS)]
    assert set(firsts) == set(sizes)  # no size always goes first, straight after the loads


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_bulk_loaded_index_reports_lookups_plans_and_its_size(tmp_path, capsys, postgres_server):
    out = tmp_path / "rows.json"
    assert bench.run(parse(["--index-rows", "4k", "--no-progress", "--output", str(out)])) == 0
    r = json.loads(out.read_text())
    (point,) = r["points"]
    assert point["rows"] == 4000 and point["plan_chunks"] == 40
    assert 0 < point["lookup_ms"]["p50"] <= point["lookup_ms"]["p99"] and point["plan_s"] > 0
    assert 0 < point["warm_lookup_ms"]["p50"] <= point["warm_lookup_ms"]["p99"]
    assert 0 < point["in_buffers_lookup_ms"]["p50"] <= point["in_buffers_lookup_ms"]["p99"]
    assert r["in_buffers_lookup_p50_largest_vs_smallest"] == 1.0  # one size: its own ratio
    assert "shared_buffers=128MB" in r["setting"]  # 4k rows fit PostgreSQL's default
    assert r["huge_pages_in_use_bytes"] is None or r["huge_pages_in_use_bytes"] >= 0
    assert 0 < point["indexes_bytes"] < point["table_bytes"] <= point["database_bytes"]
    assert set(r["targets"]) == {"lookup_p50_largest_vs_smallest", "plan_s_largest"}
    assert "lookup p50 / p99 ms" in capsys.readouterr().out


def _descendants(pid: int) -> dict[int, list[str]]:
    """The processes under ``pid`` (children, theirs, ...), each with its command line."""
    parents, cmdlines = {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdlines[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes().decode().split("\0")
        except (OSError, IndexError):  # gone meanwhile
            continue
        parents[int(stat.parent.name)] = int(fields[1])
    out, frontier = {}, {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier and child not in out}
        out.update((child, cmdlines[child]) for child in frontier)
    return out


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_benchmark_stopped_by_sigterm_stops_its_database_and_deletes_its_folders(tmp_path, postgres_server):
    """As Ctrl-C does: the PostgreSQL server the benchmark started is stopped, nothing of it is left."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "chunkstore", "bench", "fleet", "--index-rows", "10M"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    try:
        for line in proc.stderr:  # the 100k rows' database is loaded: its server is up
            if "1,000,000 rows" in line:
                break
        started = _descendants(proc.pid)
        # (the postmaster; a child it has just forked still bears its command line)
        data_dirs = sorted({cmd[cmd.index("-D") + 1] for cmd in started.values() if "-D" in cmd})
        assert len(data_dirs) == 1 and Path(data_dirs[0]).is_dir(), "the benchmark's PostgreSQL is running"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:  # (an assertion failed first)
            proc.terminate()
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    alive = [pid for pid in started if Path(f"/proc/{pid}").exists()]
    assert alive == [] and not Path(data_dirs[0]).exists()
    assert list(tmp_path.iterdir()) == []
