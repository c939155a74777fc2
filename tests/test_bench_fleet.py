"""`chunkstore bench fleet` at a tiny size, on a throwaway PostgreSQL and moto's S3 server: every
configuration runs and every figure is present and sane; bad options are refused. Hit rates and
timings are reported, never asserted (shared, noisy machines; a publish races the next turn)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from chunkstore.bench import fleet as bench

TINY = ["--servers", "2", "--num-clients", "3", "--num-rounds", "2", "--request-length", "40",
        "--request-rate", "4", "--io-pages", "16", "--no-progress"]


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_tiny_fleet_reports_every_configuration_and_figure(tmp_path, capsys, postgres_server, moto_s3):
    out = tmp_path / "fleet.json"
    assert bench.run(parse([*TINY, "--output", str(out)])) == 0
    r = json.loads(out.read_text())
    assert [run["name"] for run in r["runs"]] == list(bench.CONFIGS)
    assert [run["servers"] for run in r["runs"]] == [1, 2, 2]
    for run in r["runs"]:
        assert 0.0 <= run["disk_hit_rate"] <= run["hit_rate"] <= 1.0 and run["mean_ttft_s"] > 0
    assert r["runs"][0]["hit_rate"] > 0  # one server sees every turn of a conversation
    assert r["runs"][1]["disk_hit_rate"] == 0  # a private tier never holds another server's pages
    for key in ("publish_mb_s", "raw_put_mb_s", "read_mb_s", "raw_get_mb_s", "publish_vs_raw", "read_vs_raw",
                "publish_vs_raw_write_once", "raw_write_once_put_mb_s", "publish_vs_raw_stream", "read_vs_raw_stream",
                "raw_stream_put_mb_s", "raw_stream_get_mb_s", "io_batch_pages",
                "index_lookup_ms_per_request"):
        assert math.isfinite(r["io"][key]) and r["io"][key] > 0, key
    assert r["io"]["pages"] == 16 and len(r["io"]["publish_vs_raw_rounds"]) == r["io"]["rounds"] == bench.IO_ROUNDS
    assert set(r["targets"]) == {"shared_vs_one_server", "publish_vs_raw", "read_vs_raw"}
    table = capsys.readouterr().out
    assert "shared tier / one server (hit rate)" in table and "publish / raw PUT" in table


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_a_sealed_tier_is_timed_beside_the_unsealed_one(tmp_path, capsys, postgres_server, moto_s3):
    from chunkstore.disk import write_key_file

    write_key_file(tmp_path / "seal.key")
    out = tmp_path / "fleet.json"
    assert bench.run(parse([*TINY, "--seal-key", str(tmp_path / "seal.key"), "--output", str(out)])) == 0
    io = json.loads(out.read_text())["io"]
    for key in ("sealed_publish_mb_s", "sealed_read_mb_s", "sealed_publish_vs_unsealed", "sealed_read_vs_unsealed"):
        assert math.isfinite(io[key]) and io[key] > 0, key
    assert len(io["sealed_read_vs_unsealed_rounds"]) == bench.IO_ROUNDS
    assert "sealed publish / unsealed publish" in capsys.readouterr().out


@pytest.mark.parametrize("argv, why", [
    (["--servers", "1"], "at least 2"),
    (["--index-url", "postgresql+psycopg://x@127.0.0.1/db"], "both --index-url and --object-store"),
    (["--device-pages", "8", "--host-pages", "4"], "host-pages"),
    (["--seal-key", "k", "--index-url", "postgresql+psycopg://x@127.0.0.1/db", "--object-store", "s3://b/p"],
     "throwaway local services"),
])
def test_bad_options_are_refused(argv, why, capsys):
    assert bench.run(parse(argv)) == 2
    assert why in capsys.readouterr().err
