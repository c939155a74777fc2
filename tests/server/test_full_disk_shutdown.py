"""`chunkstore serve` stopped by SIGTERM while its disk is really full (a small tmpfs, filled): the
orderly shutdown tries to write memory down, reports what it could not write, closes the index
cleanly and exits 0; the store opens again afterwards and holds nothing half-written."""

from __future__ import annotations

import signal

import pytest

from chunkstore.disk.store import ChunkStore, read_identity
from tests.fullfs import fill, small_tmpfs
from tests.helpers.server import STORY, ServeProcess, disk_chunks
from tests.server.test_process import complete, fed_pages

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset


def test_sigterm_on_a_full_disk_reports_the_unwritten_pages_and_exits_0(tmp_path):
    with small_tmpfs(tmp_path / "mnt", 64 << 20) as mnt:
        data = mnt / "data"
        server = ServeProcess(data, tmp_path / "serve.log", "--write-policy", "write_back",
                              "--shutdown-timeout-s", "1")
        try:
            usage = complete(server, "kept in memory until shutdown: " + STORY)["usage"]
            assert disk_chunks(data) == 0  # write-back: the pages are in memory only
            filler = fill(mnt)
            server.signal(signal.SIGTERM)
            code = server.wait()
        finally:
            server.stop()
        out = server.output()
        assert code == 0, out
        assert "Traceback" not in out, out
        assert "No space left on device" in out and str(data) in out, out  # the reason and the folder
        assert "database or disk is full" in out, out  # the index's commit at close failed, and was reported
        assert f"{fed_pages(usage)} page(s) could not be written to disk" in out, out
        filler.unlink()  # space is back: the store opens, with nothing half-written in it
        assert [p.name for p in (data / "tmp").iterdir()] == []
        with ChunkStore(data, read_identity(data)) as store:
            assert store.stats().num_chunks == 0
