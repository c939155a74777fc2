"""``chunkstore bench sglang`` at a tiny size, through its ``run(args)``: both backends' figures and
every target in the JSON, the temporary folder gone, a page read back wrong fails the run, and a
Python without SGLang gets exit code 2 and the hint to use the SGLang environment.

Run in the SGLang environment (scripts/sglang_env.sh builds it):
    .venv-sglang/bin/python -m pytest -q -p no:cacheprovider tests/integrations
Skipped entirely where SGLang is not installed (the main suite).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading

import pytest

pytest.importorskip("sglang")
torch = pytest.importorskip("torch")

from sglang.srt.mem_cache.hicache_storage import HiCacheFile
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

from chunkstore.bench import sglang as bench

pytestmark = pytest.mark.sglang

TINY = ["--num-layers", "2", "--num-heads", "2", "--head-dim", "64", "--page-size", "16", "--num-pages", "16",
        "--request-pages", "4", "--no-progress"]
FIGURES = ("set_gbps", "set_pages_per_s", "set_published_gbps", "set_ack_gbps", "get_cold_gbps",
           "get_cold_pages_per_s", "get_warm_gbps", "get_warm_pages_per_s", "disk_bytes", "compression_ratio")


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_a_small_run_reports_both_backends_and_every_target(tmp_path, capsys):
    work, out = tmp_path / "work", tmp_path / "result.json"
    work.mkdir()
    before = set(threading.enumerate())
    env_before = os.environ.get(bench.FILE_DIR_ENV)
    code = bench.run(_args(*TINY, "--work-dir", str(work), "--json", "-o", str(out)))
    assert code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)  # stdout is exactly the JSON document
    assert printed == json.loads(out.read_text())
    ran = {s["name"] for s in printed["systems"] if s["status"] == "ran"} - {"chunkstore", "file"}
    assert set(printed["backends"]) == {"chunkstore", "hicache_file", *ran}
    for name, figures in printed["backends"].items():
        for key in FIGURES:
            assert figures[key] > 0, (name, key)
    assert printed["backends"]["hicache_file"]["files"] == 16  # one file per page
    assert printed["backends"]["hicache_file"]["disk_bytes"] >= printed["logical_bytes"]  # raw bytes
    assert set(printed["targets"]) == {"get_cold_vs_file", "get_warm_vs_file", "disk_bytes_vs_file", "set_vs_file"}
    for name, target in printed["targets"].items():
        assert target["value"] > 0 and isinstance(target["pass"], bool), name
    assert printed["all_pass"] == all(t["pass"] for t in printed["targets"].values())
    assert printed["cold_method"] != "none"
    assert printed["background_priority"] in bench.PRIORITIES  # the backend's default, as it read it
    assert list(work.iterdir()) == []  # the temporary folder is removed
    assert os.environ.get(bench.FILE_DIR_ENV) == env_before
    leftover = [t for t in threading.enumerate()  # tqdm's monitor is one per process, by design
                if t not in before and t.is_alive() and t.name != "tqdm_monitor"]
    assert not leftover, f"threads left running: {leftover}"


def test_the_table_names_both_backends_and_strict_turns_a_miss_into_exit_1(tmp_path, monkeypatch, capsys):
    record = bench.record_targets

    def with_a_miss(result, targets):  # which real targets a tiny run meets is up to the machine
        record(result, [*targets, bench.Target("unreachable", 1.0, ">=", 2.0)])

    monkeypatch.setattr(bench, "record_targets", with_a_miss)
    code = bench.run(_args(*TINY, "--work-dir", str(tmp_path), "--strict"))
    table = capsys.readouterr().out
    assert code == 1
    assert "figures: chunkstore / HiCacheFile" in table and "some targets missed" in table
    for row in ("set GB/s, until on disk", "get GB/s, cold", "get GB/s, warm", "MiB on disk"):
        assert row in table


def test_a_page_read_back_wrong_fails_the_run(tmp_path, monkeypatch, capsys):
    original = HiCacheFile.get

    def flipping_get(self, key, target_location, target_sizes=None):
        got = original(self, key, target_location, target_sizes)
        if got is not None:
            got.view(torch.uint8).view(-1)[0] ^= 0xFF  # one byte wrong, as a bad disk would return it
        return got

    monkeypatch.setattr(HiCacheFile, "get", flipping_get)
    code = bench.run(_args(*TINY, "--work-dir", str(tmp_path)))
    err = capsys.readouterr().err
    assert code == 1
    assert "HiCacheFile read back page" in err and "differ" in err
    assert list(tmp_path.iterdir()) == []


def test_without_sglang_the_command_exits_2_and_names_the_sglang_environment(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sglang", None)  # import sglang now raises ImportError
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.hicache_storage", None)
    assert bench.run(_args(*TINY)) == 2
    err = capsys.readouterr().err
    assert "SGLang is not importable" in err and ".venv-sglang/bin/chunkstore bench sglang" in err


def test_invalid_options_exit_2(capsys):
    assert bench.run(_args("--num-pages", "0")) == 2
    assert "num_pages must be > 0" in capsys.readouterr().err


# What SGLang registers under the names the test below borrows (backend_factory.py).
SGLANG_REGISTERED = {"mooncake": ("sglang.srt.mem_cache.storage.mooncake_store.mooncake_store", "MooncakeStore"),
                     "aibrix": ("sglang.srt.mem_cache.storage.aibrix_kvcache.aibrix_kvcache_storage",
                                "AibrixKVCacheStorage")}


def test_other_systems_are_tried_each_a_row_and_one_that_starts_runs_the_same_phases(tmp_path, monkeypatch,
                                                                                      capsys):
    """Here none of SGLang's other backends starts (their packages, a GPU driver or a service are
    missing), so HiCacheFile takes two of their names. Under aibrix's, which SGLang's controller
    drives as it drives HiCacheFile, it runs every phase. Under mooncake's, which the controller
    drives through the zero-copy calls HiCacheFile does not have, it stores nothing: a failed row,
    and the run goes on."""
    monkeypatch.setenv(bench.FILE_DIR_ENV, str(tmp_path / "stand-ins"))  # where the stand-ins keep pages
    for name in SGLANG_REGISTERED:
        StorageBackendFactory.register_backend(name, "tests.integrations.sglang_stand_ins", "FileUnderAnotherName")
    try:
        work = tmp_path / "work"
        work.mkdir()
        code = bench.run(_args(*TINY, "--work-dir", str(work), "--json", "--systems",
                               "chunkstore,file,aibrix,mooncake,nixl"))
    finally:
        for name, (module, cls) in SGLANG_REGISTERED.items():
            StorageBackendFactory.register_backend(name, module, cls)
    out = capsys.readouterr()
    assert code == 0, out.err
    printed = json.loads(out.out)
    rows = {s["name"]: s for s in printed["systems"]}
    assert list(rows) == ["chunkstore", "file", "aibrix", "mooncake", "nixl"]
    assert all(rows[n]["status"] == "ran" and rows[n]["reason"] is None for n in ("chunkstore", "file", "aibrix"))
    assert rows["mooncake"]["status"] == "failed" and "wrote 0 of" in rows["mooncake"]["reason"]
    assert rows["nixl"]["status"] in ("missing", "failed") and rows["nixl"]["reason"]  # NIXL is not installed here
    assert set(printed["backends"]) == {"chunkstore", "hicache_file", "aibrix"}
    for key in ("set_gbps", "get_cold_gbps", "get_warm_gbps"):
        assert printed["backends"]["aibrix"][key] > 0, key
    assert printed["order"]["set"] == ["chunkstore", "hicache_file", "aibrix", "mooncake"]
    table = bench.format_table(printed)
    assert "aibrix (AIBrix KVCache): set " in table and "mooncake (Mooncake store): failed: " in table


@pytest.mark.parametrize("systems, message", [
    ("chunkstore,file,nosuch", "unknown system 'nosuch'"),
    ("chunkstore,file,nixl,nixl", "names a system twice"),
    ("chunkstore,nixl", "must include chunkstore and file"),
])
def test_bad_systems_exit_2_and_say_why(systems, message, capsys):
    assert bench.run(_args("--systems", systems)) == 2
    assert message in capsys.readouterr().err
