"""Slow and idle clients cannot hold the servers: real `chunkstore serve` and `chunkstore admin`
processes on 127.0.0.1, real sockets, small limits set by their flags so the test takes seconds.

A request whose header does not complete, or whose body pauses, within its limit gets a 408 and its
connection closes (a connection that sent nothing just closes), while real requests are served
meanwhile; a body that keeps coming is never cut, a header that keeps trickling is; connections
beyond ``--max-connections`` are answered 503 at once and the server serves again once they go.
"""

from __future__ import annotations

import os
import queue
import re
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.helpers.api import fill_store
from tests.helpers.server import REPO, ServeProcess

pytestmark = pytest.mark.slow  # a `chunkstore serve` subprocess and limits of seconds: left out of the fast subset

LIMIT_S = 2.0  # --header-timeout-s and --body-timeout-s of the servers under test
CLOSE_BY_S = LIMIT_S + 15.0  # a generous bound: a held connection must be closed by then
HELD_PER_KIND = 100
HALF_SENT = {  # 300 connections in all: each kind sends this much of a request, then waits
    "header": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: applic",
    "body": b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 100\r\n\r\n{\"prompt\"",
    "idle": b"",
}


def _address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split("/")[0].rsplit(":", 1)
    return host, int(port)


def _connect(url: str, data: bytes) -> socket.socket:
    sock = socket.create_connection(_address(url), timeout=10)
    if data:
        sock.sendall(data)
    return sock


def _until_closed(socks: list[socket.socket], timeout_s: float) -> tuple[dict, dict]:
    """What each socket received and when the server closed it (monotonic), waiting at most ``timeout_s``."""
    received = {s: b"" for s in socks}
    closed_at: dict[socket.socket, float] = {}
    with selectors.DefaultSelector() as selector:
        for s in socks:
            s.setblocking(False)
            selector.register(s, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout_s
        while len(closed_at) < len(socks) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=0.1):
                try:
                    chunk = key.fileobj.recv(65536)
                except ConnectionResetError:
                    chunk = b""
                if chunk:
                    received[key.fileobj] += chunk
                else:
                    closed_at[key.fileobj] = time.monotonic()
                    selector.unregister(key.fileobj)
    return received, closed_at


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """`chunkstore serve` with both timeouts at LIMIT_S, stopped by its PID."""
    root = tmp_path_factory.mktemp("limits")
    process = ServeProcess(root / "data", root / "serve.log", "--header-timeout-s", str(LIMIT_S),
                           "--body-timeout-s", str(LIMIT_S))
    yield process
    process.stop()


def test_half_sent_requests_are_closed_while_real_ones_are_served(served):
    opened_at = time.monotonic()
    held = {kind: [_connect(served.url, data) for _ in range(HELD_PER_KIND)] for kind, data in HALF_SENT.items()}
    try:
        assert served.client.get("/health").status_code == 200
        reply = served.client.post("/v1/completions", json={"prompt": "meanwhile", "max_tokens": 2})
        assert reply.status_code == 200, reply.text
        assert served.client.get("/api/v1/healthz").status_code == 200  # the management API, mounted
        answered_at = time.monotonic()

        everything = [s for socks in held.values() for s in socks]
        received, closed_at = _until_closed(everything, CLOSE_BY_S)
        assert len(closed_at) == len(everything), f"{len(everything) - len(closed_at)} connections still open"
        assert answered_at < min(closed_at.values()), "the real requests waited for the held connections"
        assert min(closed_at.values()) - opened_at >= LIMIT_S * 0.9  # not closed before their limit
        assert max(closed_at.values()) - opened_at < CLOSE_BY_S  # all soon after it
        for kind, socks in held.items():
            for s in socks:
                if kind == "idle":
                    assert received[s] == b""  # nothing asked, nothing answered
                else:
                    assert received[s].startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received[s][:80]
                    assert b"connection: close" in received[s]
    finally:
        for socks in held.values():
            for s in socks:
                s.close()
    assert served.client.post("/v1/completions", json={"prompt": "after", "max_tokens": 2}).status_code == 200
    log = served.output()
    assert "(--header-timeout-s)" in log and "(--body-timeout-s)" in log
    assert "Traceback" not in log, log


def test_a_steady_body_is_served_and_a_trickling_header_is_cut(served):
    body = b'{"prompt": "slow but steady", "max_tokens": 2}'
    size = -(-len(body) // 4)
    pieces = [body[i:i + size] for i in range(0, len(body), size)]  # four pieces, a pause before each
    steady = _connect(served.url, b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: "
                                  b"application/json\r\nConnection: close\r\n" +
                      f"Content-Length: {len(body)}\r\n\r\n".encode())
    pause_s = LIMIT_S / 3  # every pause is short, the whole body takes longer than the limit
    started = time.monotonic()
    for piece in pieces:
        time.sleep(pause_s)
        steady.sendall(piece)
    assert time.monotonic() - started > LIMIT_S
    received, _ = _until_closed([steady], CLOSE_BY_S)
    assert received[steady].startswith(b"HTTP/1.1 200 OK\r\n"), received[steady][:200]
    steady.close()

    trickle = _connect(served.url, b"GET /health HTTP/1.1\r\n")
    started = time.monotonic()
    while not select.select([trickle], [], [], pause_s)[0]:  # a header line every pause: it never completes
        assert time.monotonic() - started < CLOSE_BY_S, "a trickling header was never cut"
        trickle.sendall(b"X-Slow: 1\r\n")
    received, _ = _until_closed([trickle], CLOSE_BY_S)
    assert received[trickle].startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received[trickle][:200]
    assert time.monotonic() - started >= LIMIT_S * 0.9
    trickle.close()


def _admin(*args: str) -> tuple[subprocess.Popen, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKSTORE_")}
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-m", "chunkstore.cli", "admin", "--port", "0", *args], cwd=REPO,
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in proc.stderr], daemon=True).start()
    while True:
        try:
            line = lines.get(timeout=60)
        except queue.Empty:
            proc.kill()
            raise AssertionError("chunkstore admin did not start") from None
        if m := re.search(r"at (http://\S+)/api/v1", line):
            return proc, m.group(1)


def test_the_admin_server_refuses_connections_over_its_cap_and_times_out_bodies(tmp_path: Path):
    root = tmp_path / "store"
    fill_store(root)
    proc, url = _admin("--disk-path", str(root), "--max-connections", "20", "--header-timeout-s", "30",
                       "--body-timeout-s", str(LIMIT_S))
    try:
        assert httpx.get(url + "/api/v1/healthz", timeout=10).status_code == 200
        held = [_connect(url, b"") for _ in range(20)]
        time.sleep(0.2)  # the server took them all
        started = time.monotonic()
        refused = httpx.get(url + "/api/v1/healthz", timeout=10)
        assert refused.status_code == 503 and "too many open connections (20)" in refused.text
        assert refused.headers["retry-after"] == "1" and time.monotonic() - started < 10
        for s in held:
            s.close()
        deadline = time.monotonic() + 10
        while (status := httpx.get(url + "/api/v1/healthz", timeout=10).status_code) != 200:
            assert time.monotonic() < deadline, status
            time.sleep(0.05)

        token = (root / "admin-token").read_text().strip()  # so the route waits for its body
        short = _connect(url, f"POST /api/v1/evict HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}"
                              f"\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{{".encode())
        received, closed_at = _until_closed([short], CLOSE_BY_S)
        assert closed_at and received[short].startswith(b"HTTP/1.1 408 Request Timeout\r\n"), received[short]
        short.close()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
