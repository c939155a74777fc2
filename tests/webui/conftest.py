"""Browser fixtures: a real `chunkstore serve` subprocess on 127.0.0.1 (tests/server's ServeProcess)
with a little traffic, Debian's Chromium driven by Playwright, and pages that record every console
error and uncaught exception.

Browser tests are skipped (with the reason) only where /usr/bin/chromium is missing: CI installs it
(.ci/run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.server import ServeProcess
from tests.helpers.webui import CHROMIUM, TOKEN, Dashboard, send_traffic


def pytest_collection_modifyitems(items) -> None:
    """Tests with a browser or a `chunkstore serve` are `slow`: the fast subset (`-m "not slow"`)
    leaves them out (the dashboard's file checks stay in it); CI runs them."""
    here = Path(__file__).parent
    for item in items:
        uses = set(getattr(item, "fixturenames", ()))
        if here in Path(item.fspath).parents and uses & {"browser", "server", "dashboard"}:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[ServeProcess]:
    root = tmp_path_factory.mktemp("webui")
    proc = ServeProcess(root / "data", root / "serve.log", env={
        "CHUNKSTORE_ADMIN_TOKEN": TOKEN, "CHUNKSTORE_ADMIN_HISTORY_INTERVAL_S": "0.5",
        "CHUNKSTORE_ADMIN_EVENTS_INTERVAL_S": "0.5"})
    proc.data = root / "data"
    try:
        send_traffic(proc)
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def tiny():
    from chunkstore.engine import load_model

    return load_model("tiny")


@pytest.fixture(scope="module")
def browser() -> Iterator:
    if not CHROMIUM.exists():
        pytest.skip(f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright  # the dev extra's

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM))
        yield b
        b.close()


@pytest.fixture
def dashboard(browser, server) -> Iterator:
    """Opens dashboards (on ``server``, or ``url``); each test asserts its pages saw no console error."""
    opened: list[Dashboard] = []

    def make(width: int = 1280, height: int = 900, color_scheme: str = "light", url: str | None = None) -> Dashboard:
        d = Dashboard(browser, url or server.url, width, height, color_scheme)
        opened.append(d)
        return d

    yield make
    for d in opened:
        d.close()
