"""`chunkstore bench startup`: one real run reports every figure, bad options are refused. Timing
targets are never asserted (shared, noisy machines)."""

from __future__ import annotations

import argparse
import json
import math
import subprocess

import pytest

from chunkstore.bench import startup as bench

KINDS = ("import", "help", "stats", "serve_first", "serve_restart")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.slow  # starts two servers
def test_one_run_reports_every_figure_and_leaves_no_server(tmp_path, capsys):
    out = tmp_path / "startup.json"
    assert bench.run(parse(["--runs", "1", "--output", str(out)])) == 0
    r = json.loads(out.read_text())
    for kind in KINDS:
        assert math.isfinite(r["seconds"][kind]) and r["seconds"][kind] > 0, kind
        assert r["all_seconds"][kind] == [r["seconds"][kind]]
    assert r["serve_first_vs_import"] == pytest.approx(r["seconds"]["serve_first"] / r["seconds"]["import"])
    assert set(r["targets"]) == {"serve_first_vs_import", "serve_restart_vs_import"}
    table = capsys.readouterr().out
    assert "first /health" in table and "restart" in table
    leftover = subprocess.run(["pgrep", "-f", "chunkstore-startup-"], capture_output=True, text=True)
    assert leftover.stdout.strip() == "", "a benchmarked server is still running"


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_server_that_cannot_start_is_an_error_not_a_hang(tmp_path):
    folder = tmp_path / "not-a-folder"
    folder.write_text("a file where the data folder should be")
    with pytest.raises(bench.StartupError, match="exited 2"):
        bench.time_serve(folder, "tiny", timeout_s=60)


@pytest.mark.parametrize("argv, message", [(["--runs", "0"], "--runs"), (["--timeout-s", "0"], "--timeout-s"),
                                           (["--output", "/no/such/folder/x.json"], "does not exist")])
def test_bad_options_exit_2(argv, message, capsys):
    assert bench.run(parse(argv)) == 2
    assert message in capsys.readouterr().err
