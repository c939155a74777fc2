"""Helpers of the server's tests: the tiny preset's settings, an in-process server on loopback, a
`chunkstore serve` subprocess stopped by its PID, SSE parsing and chunk counts on disk.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import uvicorn

from chunkstore.cache.config import CacheConfig
from chunkstore.disk.store import ChunkStore, read_identity
from chunkstore.engine import Engine
from chunkstore.serve import create_app
from chunkstore.server.lifecycle import bind
from chunkstore.server.settings import ServerSettings

PAGE_SIZE = 16


REPO = Path(__file__).resolve().parents[2]


STARTUP_TIMEOUT_S = 90


STORY = ("The cache keeps the attention keys and values of every prefix it has seen, on the device, "
         "in host memory and on disk, so that a prompt it has seen before is not computed again. ")


def cache_config(root: Path, **kwargs) -> CacheConfig:
    kwargs.setdefault("device_size", "64pages")
    return CacheConfig(page_size=PAGE_SIZE, disk_path=root / "disk", **kwargs)


class LiveServer:
    """An app served by uvicorn in a thread on a free loopback port."""

    def __init__(self, app) -> None:
        self.app = app
        self.sock = bind("127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(15)


class Served:
    """An engine, its app on a live server, and an HTTP client for it."""

    def __init__(self, engine: Engine, settings: ServerSettings) -> None:
        self.engine = engine
        self.live = LiveServer(create_app(engine, settings))
        self.url = self.live.url
        self.client = httpx.Client(base_url=self.url, timeout=60)

    def __enter__(self) -> "Served":
        self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()
        self.live.__exit__()
        self.engine.close()


def sse_events(response: httpx.Response) -> list[dict | str]:
    """The events of an SSE response: parsed JSON objects, and the final "[DONE]"."""
    events: list[dict | str] = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


def stream(client: httpx.Client, path: str, body: dict, **kwargs) -> list[dict | str]:
    with client.stream("POST", path, json=body, **kwargs) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        return sse_events(response)


class ServeProcess:
    """`python -m chunkstore.cli serve` on a free port over ``data``; stdout and stderr go to a log."""

    def __init__(self, data: Path, log: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.log = log
        args = [sys.executable, "-m", "chunkstore.cli", "serve", "--port", "0", "--page-size", str(PAGE_SIZE),
                "--device-size", "64pages", "--disk-path", str(data), "--log-level", "warning", *flags]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("CHUNKSTORE_")}
        full_env.update(env or {}, PYTHONPATH=str(REPO))
        with open(log, "w") as out:
            self.proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, cwd=data.parent, env=full_env)
        self.url = self._wait_for_url()
        self.client = httpx.Client(base_url=self.url, timeout=60)
        self._wait_healthy()

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def _wait_for_url(self) -> str:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            for line in self.output().splitlines():
                if line.startswith("chunkstore serve: http://"):
                    return line.split()[2]
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited with {self.proc.returncode}:\n{self.output()}")
            time.sleep(0.05)
        raise RuntimeError(f"serve did not start within {STARTUP_TIMEOUT_S} s:\n{self.output()}")

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"serve never became healthy:\n{self.output()}")

    def signal(self, signum: int) -> None:
        self.proc.send_signal(signum)

    def wait(self, timeout_s: float = 60) -> int:
        return self.proc.wait(timeout_s)

    def stop(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


def disk_chunks(data: Path) -> int:
    """Chunks in the store at ``data`` (opened read-only, beside a server that writes it)."""
    with ChunkStore(data, read_identity(data), read_only=True) as store:
        return store.stats().num_chunks


def wait_for_disk_chunks(data: Path, at_least: int, timeout_s: float = 30) -> int:
    """Polls the store until it holds ``at_least`` chunks (write-through persists in the background)."""
    deadline = time.monotonic() + timeout_s
    while (count := disk_chunks(data)) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"the store holds {count} chunks after {timeout_s} s, expected {at_least}")
        time.sleep(0.1)
    return count
