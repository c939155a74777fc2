"""`chunkstore bench tiers` at a tiny size: every reported figure is present and sane, bad options are
refused. Timing targets are never asserted (shared, noisy machines)."""

from __future__ import annotations

import argparse
import json
import math

import pytest

from chunkstore.bench import tiers as bench

TINY = ["--conversations", "20", "--requests", "5", "--request-tokens", "1024", "--size-mb", "8",
        "--batch-pages", "4", "--layers", "2", "--no-progress"]
FIGURES = ("match_insert_ms", "match_insert_disk_ms", "host_to_device_gbps", "memcpy_gbps",
           "disk_to_device_gbps", "load_gbps", "host_to_device_vs_memcpy", "disk_to_device_vs_load",
           "device_to_host_gbps", "memcpy_d2h_gbps", "device_to_host_vs_memcpy")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


def test_a_tiny_run_reports_every_figure(tmp_path, capsys):
    out = tmp_path / "tiers.json"
    assert bench.run(parse([*TINY, "--output", str(out)])) == 0
    r = json.loads(out.read_text())
    for key in FIGURES:
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, key
    assert set(r["targets"]) == {"match_insert_ms", "host_to_device_vs_memcpy", "disk_to_device_vs_load"}
    assert r["match_insert_new_pages"] == 0  # a 1k request is a prefix of a 5k conversation in the tree
    assert r["transfer_pages"] == 4 * bench.TiersBenchConfig(
        size_mb=8, batch_pages=4, num_layers=2).num_batches
    # every path the run drove moved pages, and the disk one moved all of them
    assert r["paths"]["disk_to_host"]["pages"] == r["transfer_pages"]
    assert r["paths"]["host_to_device"]["pages"] == r["transfer_pages"]
    # write-through: every page the fill inserted was backed up to the host, and that was timed
    assert r["device_to_host_vs_memcpy"] == r["device_to_host_gbps"] / r["memcpy_d2h_gbps"]
    table = capsys.readouterr().out
    assert "match+insert ms" in table and "disk->device / load" in table and "device->host / memcpy" in table


@pytest.mark.parametrize("argv, message", [
    (["--conversations", "0"], "num_conversations must be > 0"),
    (["--request-tokens", "10"], "at least one page"),
    (["--output", "/no/such/folder/x.json"], "does not exist"),
])
def test_bad_options_are_refused(argv, message, capsys):
    assert bench.run(parse([*TINY, *argv])) == 2
    assert message in capsys.readouterr().err
