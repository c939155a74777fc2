"""Server fixtures: real uvicorn servers on 127.0.0.1 (in a thread, or `chunkstore serve` as a subprocess), SSE parsing.

Every wait is bounded; every server and process a test starts is stopped by its fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from chunkstore.engine import Engine, load_model
from chunkstore.server.settings import ServerSettings
from tests.helpers.server import Served, ServeProcess, cache_config


@pytest.fixture(scope="session")
def tiny():
    return load_model("tiny")


@pytest.fixture(scope="module")
def served(tiny, tmp_path_factory) -> Iterator[Served]:
    """No API keys; shared by the tests of a module (use prompts of your own)."""
    root = tmp_path_factory.mktemp("served")
    with Served(Engine(tiny, cache_config(root)), ServerSettings()) as s:
        yield s


@pytest.fixture
def serve_process(tmp_path) -> Iterator:
    """Starts `chunkstore serve` subprocesses over ``tmp_path / "data"``; kills whatever is left."""
    started: list[ServeProcess] = []

    def start(*flags: str, env: dict[str, str] | None = None) -> ServeProcess:
        proc = ServeProcess(tmp_path / "data", tmp_path / f"serve-{len(started)}.log", *flags, env=env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
