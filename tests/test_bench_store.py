"""`chunkstore bench store` at a tiny size: every reported key is present and sane, --keep leaves a
readable store, options are validated. Timing targets are never asserted (shared, noisy disks)."""

from __future__ import annotations

import argparse
import json
import math

import pytest
import torch

from chunkstore import ChunkStore
from chunkstore.bench import store as bench
from chunkstore.bench.kvdata import KVSource, synthetic_pages
from chunkstore.disk.identity import ModelIdentity

pytestmark = pytest.mark.slow  # real benchmark runs: left out of the fast subset

TINY = ["--size-mb", "16", "--index-rows", "20000", "--no-progress"]

THROUGHPUTS = ("save_gbps", "load_gbps", "raw_write_gbps", "raw_read_gbps",
               "raw_write_1stream_gbps", "raw_read_1stream_gbps")
RATIOS = ("save_vs_raw", "load_vs_raw", "ratio_vs_bound")
OPTIONAL = ("raw_read_direct_gbps", "load_vs_raw_direct")  # None where there is no O_DIRECT
LATENCIES = ("exists_128_ms", "exists_128_miss_ms", "open_first_lookup_s")
CONFIG = ("size_mb", "num_pages", "page_shape", "page_size_bytes", "dtype", "kv_source", "codec",
          "workers", "read_threads", "batch_pages", "index_rows")


def parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(argv)


@pytest.fixture(scope="module")
def kept(tmp_path_factory) -> tuple[dict, object]:
    """One tiny run through the CLI entry point, with --keep and --output."""
    root = tmp_path_factory.mktemp("bench")
    keep, out = root / "keep", root / "result.json"
    assert bench.run(parse([*TINY, "--keep", str(keep), "--output", str(out)])) == 0
    return json.loads(out.read_text()), keep


def test_json_has_every_key_with_sane_values(kept):
    r, _ = kept
    for key in (*THROUGHPUTS, *RATIOS, *LATENCIES):
        assert isinstance(r[key], float) and math.isfinite(r[key]) and r[key] > 0, key
    for key in CONFIG:
        assert key in r, key
    for key in OPTIONAL:
        assert r[key] is None or (isinstance(r[key], float) and r[key] > 0), key
    assert r["size_mb"] == 16 and r["num_pages"] == 8
    assert r["page_shape"] == [32, 2, 16, 8, 128] and r["page_size_bytes"] == 2 << 20
    assert r["dtype"] == "bfloat16" and r["kv_source"] == "synthetic" and r["codec"] == "zstd_split"
    assert r["workers"] >= 1 and r["read_threads"] >= 1
    assert r["index_rows"] == 20000
    assert r["cold_method"] in ("drop_caches", "fadvise_dontneed", "none")
    assert r["raw_bytes"] == 8 * (2 << 20) and 0 < r["stored_bytes"] < r["raw_bytes"]
    assert r["rss_growth_mb"] == r["rss_growth_mb"]  # a number (may be <= 0: freed memory is reused)
    assert set(r["targets"]) == {"save_vs_raw", "load_vs_raw", "ratio_vs_bound", "exists_128_ms"}
    for t in r["targets"].values():
        assert set(t) == {"value", "target", "pass"} and isinstance(t["pass"], bool)
    assert r["all_pass"] == all(t["pass"] for t in r["targets"].values())


def test_kv_like_bf16_compresses_close_to_its_entropy_bound(kept):
    r, _ = kept
    assert len(r["plane_entropy_bits"]) == 2
    assert all(0 < h <= 8 for h in r["plane_entropy_bits"])
    assert r["compression_ratio"] > 1.2
    assert 1.2 < r["entropy_bound_ratio"] < 2.0
    assert r["compression_ratio"] <= r["entropy_bound_ratio"] * 1.01


def test_keep_leaves_a_readable_store(kept):
    r, keep = kept
    assert r["store_dir"] == str(keep / "store") and r["index_store_dir"] == str(keep / "index")
    assert len(list((keep / "store" / "chunks").rglob("*.kv"))) == r["num_pages"]
    assert not list(keep.glob("raw-*"))  # the plain-file baseline is always removed
    identity = ModelIdentity("chunkstore-bench", "bfloat16", 32, 8, 128, 16)
    with ChunkStore(keep / "store", identity, read_only=True) as s:
        assert s.stats().num_chunks == r["num_pages"]
    with ChunkStore(keep / "index", identity, read_only=True) as s:
        assert s.num_chunks() == 20000


def test_the_table_shows_the_figures_of_the_json(kept):
    r, _ = kept
    table = bench.format_table(r)
    for label in ("save / raw write", "load / raw read", "ratio / bound", "exists(128) ms", "cold reads"):
        assert label in table
    assert f"{r['save_vs_raw']:.2f}" in table and f"{r['exists_128_ms']:.3f}" in table


def test_pure_function_cleans_up_its_temp_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile
    monkeypatch.setattr(tempfile, "tempdir", None)
    cfg = bench.StoreBenchConfig(size_mb=4, index_rows=1000, num_layers=4, show_progress=False)
    r = bench.run_store_bench(cfg)
    assert r["store_dir"] is None and r["num_pages"] == 16
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv, message", [
    (["--size-mb", "0"], "size_mb must be > 0"),
    (["--layers", "-1"], "num_layers must be > 0"),
    (["--batch-pages", "0"], "batch_pages must be > 0"),
    (["--workers", "0"], "num_workers must be > 0"),
    (["--index-rows", "10"], "index_rows must be >= 128"),
    (["--dtype", "int7"], "valid dtypes: bfloat16"),
    (["--kv-source", "model"], "valid values: synthetic"),
    (["--codec", "lz4"], "valid values: none"),
    (["--output", "/nonexistent-folder/x.json"], "does not exist"),
    (["--device", "gpu"], "device must be cpu or cuda (cuda:N), got 'gpu'"),
    (["--device", "meta"], "device must be cpu or cuda"),
    *([(["--device", "cuda"], "this torch sees no CUDA device")] if not torch.cuda.is_available() else []),
])
def test_invalid_options_exit_2_with_a_clear_error(argv, message, capsys):
    assert bench.run(parse([*TINY, *argv])) == 2
    assert message in capsys.readouterr().err


def test_keep_refuses_a_folder_that_is_not_empty(tmp_path, capsys):
    (tmp_path / "something").write_text("x")
    assert bench.run(parse([*TINY, "--keep", str(tmp_path)])) == 2
    assert "new or empty folder" in capsys.readouterr().err


def test_synthetic_kv_is_seeded_and_shaped():
    identity = ModelIdentity("m", "bfloat16", 2, 2, 64, 16)
    a, b = synthetic_pages(identity, 3, seed=7), synthetic_pages(identity, 3, seed=7)
    assert a.shape == (3, *identity.page_shape) and a.dtype == torch.bfloat16
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
    assert not torch.equal(a, synthetic_pages(identity, 3, seed=8))
    assert torch.isfinite(a.float()).all()
    # Channel scales differ: the per-channel spread is far wider than one randn's.
    std = a.float().std(dim=(0, 3))  # over pages and tokens: one value per (layer, K/V, head, dim)
    assert std.max() / std.min() > 10


def test_kv_source_lists_valid_choices():
    assert KVSource.parse("synthetic") is KVSource.SYNTHETIC
    with pytest.raises(ValueError, match="valid values: synthetic"):
        KVSource.parse("model")


def test_a_sealed_store_is_timed_beside_the_unsealed_one(tmp_path):
    """--seal-key: the sealed store's figures, the cipher's own rates on the same bytes and what
    sealing costs beyond it, every one finite (their values are the benchmark's to report)."""
    from chunkstore.disk import write_key_file

    write_key_file(tmp_path / "seal.key")
    out = tmp_path / "result.json"
    assert bench.run(parse([*TINY, "--seal-key", str(tmp_path / "seal.key"), "--output", str(out)])) == 0
    r = json.loads(out.read_text())
    for key in ("sealed_save_gbps", "sealed_load_gbps", "sealed_save_cpu_s_per_gb", "sealed_load_cpu_s_per_gb",
                "seal_aead_gbps_per_core", "open_aead_gbps_per_core", "seal_cipher_cpu_s_per_gb",
                "open_cipher_cpu_s_per_gb", "sealed_save_vs_unsealed", "sealed_load_vs_unsealed",
                "seal_code_cpu_s_per_gb", "open_code_cpu_s_per_gb", "seal_code_vs_cipher", "open_code_vs_cipher"):
        assert math.isfinite(r[key]) and r[key] > 0, key
    for key in ("seal_extra_cpu_s_per_gb", "open_extra_cpu_s_per_gb", "seal_extra_vs_cipher", "open_extra_vs_cipher"):
        assert math.isfinite(r[key]), key  # a difference of two measurements: either sign
    assert r["sealed_bytes"] == r["stored_bytes"] + r["num_pages"] * 62  # the seal's 62 bytes a chunk
    assert {"sealed_save_vs_unsealed", "seal_extra_vs_cipher"} <= set(r["targets"])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_pages_put_from_and_loaded_into_device_memory(tmp_path):
    out = tmp_path / "r.json"  # every load is compared byte for byte inside the run: a wrong page exits 1
    assert bench.run(parse([*TINY, "--device", "cuda", "--output", str(out)])) == 0
    r = json.loads(out.read_text())
    assert r["device"].startswith("cuda") and r["load_gbps"] > 0 and r["save_gbps"] > 0
