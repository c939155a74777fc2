"""Crash safety: real writer processes SIGKILLed at random points (chunkstore.testing.crash_soak), then checked.

A kill may lose the step in flight and leave files to clean up; it must never leave a temp file
after the next open, a corrupt or half-written chunk, a row without its file, or a page that
loads with other bytes than were written.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from chunkstore.disk.files import TMP_PREFIX, Durability
from chunkstore.disk.index import ChunkIndex, sqlite_url
from chunkstore.disk.store import ChunkStore
from chunkstore.testing import crash_soak as soak

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

REPO_ROOT = Path(__file__).resolve().parents[1]


def _open(path: Path) -> ChunkStore:
    return ChunkStore(path, soak.SOAK_IDENTITY, capacity_bytes=soak.DEFAULT_CAPACITY_BYTES,
                      durability=Durability.NONE, num_workers=2)


def _spawn(script: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), *args], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _wait_for_line(proc: subprocess.Popen, want: str) -> None:
    line = proc.stdout.readline().strip()
    if line != want:
        proc.kill()
        raise AssertionError(f"child said {line!r}, not {want!r}: {proc.communicate()[1][-3000:]}")


def test_sigkill_cycles_fork_server(tmp_path):
    # Create the store first: a kill during the very first open hits the migration bug that
    # test_kill_during_first_migration pins down, and would end this run at cycle 0.
    _open(tmp_path / "s").close()
    r = soak.run_crash_cycles(tmp_path / "s", 80, rng_seed=20240601)
    assert r["failures"] == []
    assert r["cycles"] == 80
    assert r["keys_checked"] == 80 * len(soak.all_pages())
    # the run did real work: kills at start and mid-write, data present, durability checked
    assert r["steps_committed"] > 200
    assert r["kills_at_start"] > 0
    assert r["hits"] > 0 and r["misses"] > 0
    assert r["durable_checked"] > 0
    assert r["rows_without_file"] == 0  # file first, row second: a kill cannot leave a dangling row


def test_sigkill_cycles_exec_writer(tmp_path):
    """The real `python -m chunkstore.testing.crash_soak writer` entry point, one interpreter per cycle."""
    _open(tmp_path / "s").close()
    r = soak.run_crash_cycles(tmp_path / "s", 2, rng_seed=7, spawn=soak.Spawn.EXEC, max_delay_s=0.2)
    assert r["failures"] == []
    assert r["cycles"] == 2


def test_killed_writer_leaves_temps_that_open_removes(tmp_path):
    path = tmp_path / "s"
    proc = _spawn("""
        import sys, time
        from chunkstore.testing import crash_soak as soak
        from chunkstore.disk.files import ChunkFiles, Durability
        from chunkstore.disk.store import ChunkStore
        from tests.helpers.faults import FaultyPayloads
        payloads = FaultyPayloads(ChunkFiles(sys.argv[1], Durability.NONE))
        store = ChunkStore(sys.argv[1], soak.SOAK_IDENTITY, num_workers=2, payloads=payloads)
        def hang(key):  # every temp file is complete, none is published yet
            print("written", flush=True)
            time.sleep(600)
        payloads.hook("publish", hang)
        pages = soak.chain_for("default", (0, 1, 2))
        store.put(pages, [soak.expected_page(p.key) for p in pages])
    """, str(path))
    try:
        _wait_for_line(proc, "written")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL
    temps = [e.name for e in os.scandir(path / "tmp") if e.name.startswith(TMP_PREFIX)]
    assert len(temps) == 3
    pages = soak.chain_for("default", (0, 1, 2))
    with _open(path) as store:
        assert len(store.payloads.leftovers()) == 0
        assert not any(store.exists([p.key for p in pages]))
        assert store.get(pages) == [None, None, None]
        assert not any(store.payloads.path_for(p.key).exists() for p in pages)
        # and the store works: the same pages can be written and read back
        assert store.put(pages, [soak.expected_page(p.key) for p in pages]).ok
        assert all(soak.same_bytes(t, soak.expected_page(p.key)) for p, t in zip(pages, store.get(pages)))


def test_kill_during_first_migration(tmp_path):
    """A writer SIGKILLed while the first open creates the index: the next open must work."""
    path = tmp_path / "s"
    proc = _spawn("""
        import sys
        sys.path.insert(0, sys.argv[2])  # the repository, for tests.helpers
        from tests.helpers.crash import die_in_the_first_migration
        die_in_the_first_migration()
        from chunkstore.testing import crash_soak as soak
        from chunkstore.disk.store import ChunkStore
        ChunkStore(sys.argv[1], soak.SOAK_IDENTITY)
    """, str(path), str(REPO_ROOT))
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL, err
    with _open(path) as store:
        pages = soak.chain_for("default", (1,))
        assert store.put(pages, [soak.expected_page(pages[0].key)]).ok


def _soak_store_with_data(path: Path) -> ChunkStore:
    soak.run_writer(path, seed=3, max_steps=40)  # in-process, no kill: a known-good soak store
    store = _open(path)
    assert store.num_chunks() > 0
    return store


def test_checker_catches_wrong_bytes(tmp_path, capsys):
    """The checks can fail: a well-formed chunk file with other KV under a key is reported."""
    with _soak_store_with_data(tmp_path / "s") as store:
        assert soak.check_store(store) == []
        victim = next(p for p in soak.all_pages() if store.exists([p.key])[0])
        with ChunkStore(tmp_path / "forge", soak.SOAK_IDENTITY) as forge:
            assert forge.put([victim], [soak.expected_page(victim.key) + 1]).ok
            forged = forge.payloads.path_for(victim.key)
        shutil.copyfile(forged, store.payloads.path_for(victim.key))
        problems = soak.check_store(store)
        assert any("WRONG BYTES" in p and victim.key.hex() in p for p in problems)


def test_checker_catches_lost_pages(tmp_path):
    with _soak_store_with_data(tmp_path / "s") as store:
        victim = next(p for p in soak.all_pages() if store.exists([p.key])[0])
        index = ChunkIndex(sqlite_url(store.root))  # the row goes (as a lost write would leave it), then the file
        index.delete([victim.key])
        index.close()
        store.payloads.delete(victim.key)
        problems = soak.check_store(store, must_survive={victim.key})
        assert any("gone" in p for p in problems)


def test_plan_is_a_function_of_the_seed():
    a = [s for _, s in zip(range(200), soak.plan(5))]
    assert a == [s for _, s in zip(range(200), soak.plan(5))]
    assert a != [s for _, s in zip(range(200), soak.plan(6))]
    assert {s.op for s in a} == set(soak.StepOp)


def test_expected_page_depends_on_the_key_only():
    k1, k2 = (p.key for p in soak.chain_for("default", (0, 1)))
    assert soak.same_bytes(soak.expected_page(k1), soak.expected_page(k1))
    assert not torch.equal(soak.expected_page(k1), soak.expected_page(k2))


def _soak_args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    soak.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_soak_command_json(capsys):
    """`chunkstore soak crash` as the CLI wires it; the default store is a temporary folder."""
    rc = soak.run(_soak_args("--iterations", "3", "--seed", "11", "--json"))
    out = json.loads(capsys.readouterr().out)
    assert rc == 0, out["failures"]
    assert out["cycles"] == 3 and out["seed"] == 11 and out["failures"] == []
    assert out["disk_path"] is None  # removed after a clean run


def test_soak_command_refuses_another_models_store(tmp_path, capsys, identity):
    ChunkStore(tmp_path / "real", identity).close()
    assert soak.run(_soak_args("--iterations", "1", "--disk-path", str(tmp_path / "real"))) == 2
    assert "not a soak store" in capsys.readouterr().err
    assert soak.run(_soak_args("--iterations", "0")) == 2


def test_add_arguments_keeps_options_the_parser_has():
    parser = argparse.ArgumentParser()
    parser.add_argument("--disk-path", default="x")
    parser.add_argument("--json", action="store_true")
    soak.add_arguments(parser)  # no argparse conflict
    args = parser.parse_args(["--iterations", "2"])
    assert args.disk_path == "x" and args.iterations == 2 and args.json is False
