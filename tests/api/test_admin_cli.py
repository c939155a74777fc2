"""`chunkstore admin` as a real process: it prints where it serves and where the token is, keeps a
generated token in a 0600 file, answers, and exits cleanly on SIGTERM; errors exit 2 with a reason."""

from __future__ import annotations

import os
import queue
import re
import signal
import stat
import subprocess
import sys
import threading
from pathlib import Path

import httpx
import pytest

from chunkstore import ChunkStore
from chunkstore.cli import main
from tests.helpers.api import fill_store
from tests.helpers import TINY

REPO = Path(__file__).resolve().parents[2]
WAIT_S = 60.0


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKSTORE_")}
    env["PYTHONPATH"] = str(REPO)
    return env


def _admin(*args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "chunkstore.cli", "admin", *args], cwd=REPO, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _lines(stream) -> "queue.Queue[str]":
    q: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [q.put(line) for line in stream], daemon=True).start()
    return q


def _wait_line(q: "queue.Queue[str]", pattern: str) -> re.Match:
    seen = []
    while True:
        try:
            line = q.get(timeout=WAIT_S)
        except queue.Empty:
            raise AssertionError(f"no line matching {pattern!r}; got {seen}") from None
        seen.append(line)
        if m := re.search(pattern, line):
            return m


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_admin_serves_a_store_and_stops_on_sigterm(tmp_path):
    root = tmp_path / "store"
    fill_store(root)
    proc = _admin("--disk-path", str(root), "--port", "0")
    try:
        err = _lines(proc.stderr)
        url = _wait_line(err, r"serving .* at (http://127\.0\.0\.1:\d+/api/v1)").group(1)
        token_path = Path(_wait_line(err, r"admin token in (\S+)").group(1))
        assert token_path == root / "admin-token" and stat.S_IMODE(token_path.stat().st_mode) == 0o600
        token = token_path.read_text().strip()
        _wait_line(err, r"Application startup complete")
        assert httpx.get(url + "/healthz", timeout=10).json()["backend"] == "store"
        assert httpx.get(url + "/stats", timeout=10).json()["disk"]["num_chunks"] == 10
        assert httpx.post(url + "/flush", timeout=10).status_code == 401
        r = httpx.post(url + "/evict", json={"bytes_to_free": 1}, headers={"Authorization": f"Bearer {token}"},
                       timeout=10)
        assert r.status_code == 200 and r.json()["num_chunks"] == 1
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(WAIT_S)
    with ChunkStore(root, TINY):  # the writer lock was released
        pass


def test_admin_errors_exit_2(tmp_path, capsys, monkeypatch):
    for name in [k for k in os.environ if k.startswith("CHUNKSTORE_")]:
        monkeypatch.delenv(name)
    assert main(["admin", "--disk-path", str(tmp_path / "none"), "--port", "0"]) == 2
    assert "no chunk store" in capsys.readouterr().err
    root = tmp_path / "store"
    fill_store(root)
    with ChunkStore(root, TINY):  # a running server would hold the writer lock
        assert main(["admin", "--disk-path", str(root), "--port", "0"]) == 2
        assert "--read-only" in capsys.readouterr().err
    assert main(["admin", "--disk-path", str(root), "--namespace-token", "broken"]) == 2
    assert "NAMESPACE=TOKEN" in capsys.readouterr().err


def test_admin_on_a_taken_port_exits_2(tmp_path, capsys, monkeypatch):
    """The bind goes through the shared lifecycle (chunkstore.http.lifecycle): a clear reason, exit 2."""
    import socket

    for name in [k for k in os.environ if k.startswith("CHUNKSTORE_")]:
        monkeypatch.delenv(name)
    root = tmp_path / "store"
    fill_store(root)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["admin", "--disk-path", str(root), "--port", str(port)]) == 2
    assert f"cannot listen on 127.0.0.1:{port}" in capsys.readouterr().err
