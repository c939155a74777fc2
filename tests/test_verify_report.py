"""`chunkstore verify` without --repair reports what a crash leaves (chunk files without an index
row, leftover temp files) as damage and exits 1, changing nothing; --repair fixes it; a put in
flight is never reported.

The crash is real: writer processes are SIGKILLed between publishing their files and committing
their rows, and while their temp files are written (the seams tests/test_crash.py uses); the CLI
runs as a real subprocess.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from chunkstore.disk.files import Durability
from chunkstore.disk.index import ChunkIndex, sqlite_url
from chunkstore.disk.maintenance import verify
from chunkstore.disk.store import ChunkStore
from chunkstore.testing import crash_soak as soak

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]

ORPHANED = soak.chain_for("default", (0, 1, 2))  # published, then killed before the row commit
UNPUBLISHED = soak.chain_for("ns1", (1, 0))  # temp files written, then killed before publish
KEPT = soak.chain_for("default", (2,))  # committed before the crashes

_WRITER = """
    import sys, time
    from chunkstore.testing import crash_soak as soak
    from chunkstore.disk.files import ChunkFiles, Durability
    from chunkstore.disk.store import ChunkStore
    from chunkstore.disk.index import ChunkIndex
    from tests.helpers.faults import FaultyPayloads
    def hang(*args, **kwargs):
        print("hung", flush=True)
        time.sleep(600)
    class HangingIndex(ChunkIndex):  # the files are published; their rows never commit
        insert = hang
    index = HangingIndex if sys.argv[2] == "before-row" else ChunkIndex
    payloads = FaultyPayloads(ChunkFiles(sys.argv[1], Durability.NONE))
    store = ChunkStore(sys.argv[1], soak.SOAK_IDENTITY, num_workers=2, index_factory=index, payloads=payloads)
    if sys.argv[2] == "before-row":
        pages = soak.chain_for("default", (0, 1, 2))
    else:
        payloads.hook("publish", hang)  # every temp file is complete; none is published
        pages = soak.chain_for("ns1", (1, 0))
    store.put(pages, [soak.expected_page(p.key) for p in pages])
"""


def _open(path: Path, **kwargs) -> ChunkStore:
    return ChunkStore(path, soak.SOAK_IDENTITY, durability=Durability.NONE, num_workers=2, **kwargs)


def _kill_writer_at(path: Path, where: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_WRITER), str(path), where],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line == "hung", proc.communicate(timeout=60)[1][-3000:]
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL


def _cli_verify(path: Path, *extra: str) -> tuple[int, dict]:
    out = subprocess.run([sys.executable, "-m", "chunkstore.cli", "verify", "--disk-path", str(path), "--json",
                          *extra], capture_output=True, text=True, timeout=120)
    assert out.returncode in (0, 1), out.stderr
    return out.returncode, json.loads(out.stdout)


@pytest.fixture
def crashed(tmp_path) -> Path:
    path = tmp_path / "s"
    with _open(path) as store:
        assert store.put(KEPT, [soak.expected_page(p.key) for p in KEPT]).ok
    _kill_writer_at(path, "before-row")
    _kill_writer_at(path, "before-publish")
    return path


def test_verify_reports_orphans_and_temp_files_and_exits_1(crashed):
    orphan_files = [crashed / "chunks" / p.key.hex()[:2] / p.key.hex()[2:4] / f"{p.key.hex()}.kv" for p in ORPHANED]
    assert all(f.is_file() for f in orphan_files)
    temps_before = sorted((crashed / "tmp").iterdir())
    assert len(temps_before) == len(UNPUBLISHED)

    code, report = _cli_verify(crashed)
    assert code == 1, report
    assert (report["orphans"], report["temps"]) == (len(ORPHANED), len(UNPUBLISHED))
    assert (report["checked"], report["ok"], report["corrupt"], report["missing"]) == (1, 1, 0, 0)
    assert (report["adopted"], report["temps_removed"], report["quarantined"]) == (0, 0, 0)
    # Without --repair nothing changed.
    assert all(f.is_file() for f in orphan_files)
    assert sorted((crashed / "tmp").iterdir()) == temps_before

    code, report = _cli_verify(crashed, "--repair")
    assert code == 0 and report["adopted"] == len(ORPHANED) and report["quarantined"] == 0
    code, report = _cli_verify(crashed)
    assert code == 0, report
    assert (report["orphans"], report["temps"], report["checked"]) == (0, 0, len(KEPT) + len(ORPHANED))
    with _open(crashed) as store:
        got = store.get(ORPHANED)
        assert all(t is not None and soak.same_bytes(t, soak.expected_page(p.key)) for p, t in zip(ORPHANED, got))


def test_verify_in_process_counts_the_same_damage(crashed):
    with _open(crashed, read_only=True) as store:
        report = verify(store)
    assert (report.orphans, report.temps, report.damage) == (len(ORPHANED), len(UNPUBLISHED),
                                                             len(ORPHANED) + len(UNPUBLISHED))


def test_a_put_in_flight_is_not_damage(tmp_path):
    """A writer's own temp file being written, and a file whose row commits under the writer lock
    while verify looks, are not reported."""
    with _open(tmp_path / "s") as store:
        assert store.put(KEPT, [soak.expected_page(p.key) for p in KEPT]).ok
        row = store.chunk_rows([KEPT[0].key])[KEPT[0].key]
        writing, committing, verified = threading.Event(), threading.Event(), threading.Event()

        def segments():  # this process's temp file, half written until verify is done
            yield b"x" * 100
            writing.set()
            verified.wait(30)

        def publish_in_flight():  # the row goes away and comes back under the writer lock, as a
            index = ChunkIndex(sqlite_url(store.root))  # the test's own, on the store's file
            with store.exclusive():  # put's publish and row commit hold the writer lock
                index.delete([row.key])
                committing.set()
                verified.wait(2.0)  # verify blocks on this lock to look again: let it wait
                index.insert([row])
            index.close()

        threads = [threading.Thread(target=store.payloads.stage, args=(b"\2" * 32, segments())),
                   threading.Thread(target=publish_in_flight)]
        for t in threads:
            t.start()
        try:
            assert writing.wait(30) and committing.wait(30)
            report = verify(store)
        finally:
            verified.set()
            for t in threads:
                t.join(30)
    assert (report.orphans, report.temps, report.damage) == (0, 0, 0), report
