"""Helpers of the dashboard's browser tests: traffic for a served cache and a page wrapper that
collects console and page errors.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

from tests.helpers.server import REPO, STORY, ServeProcess

CHROMIUM = Path("/usr/bin/chromium")


TOKEN = "webui-test-admin-token"


NAMESPACES = ("alice", "bob")


VIEWS = ("overview", "namespaces", "chunks", "controls", "settings")


SHOTS = Path(os.environ.get("CHUNKSTORE_SCREENSHOTS_DIR", REPO / "screenshots" / "webui"))


def send_traffic(server: ServeProcess, rounds: int = 2) -> None:
    """Completions in two namespaces, each prompt twice or more, so that there are chunks and hits."""
    for i in range(rounds):
        for ns in NAMESPACES:
            for turn in range(3):
                r = server.client.post("/v1/completions", json={
                    "prompt": f"{ns} says: {STORY * 2} (turn {turn})", "max_tokens": 3, "user": ns})
                assert r.status_code == 200, r.text


class Traffic:
    """Sends completions from a thread until stopped (the charts plot rates between live samples)."""

    def __init__(self, server: ServeProcess) -> None:
        self.server = server
        self.stop_event = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop_event.is_set():
            send_traffic(self.server, rounds=1)

    def __enter__(self) -> "Traffic":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        self.thread.join(60)


class Dashboard:
    """One browser page on the dashboard, with the console errors and page errors it has seen."""

    def __init__(self, browser, url: str, width: int = 1280, height: int = 900, color_scheme: str = "light") -> None:
        self.url = url
        self.context = browser.new_context(viewport={"width": width, "height": height}, color_scheme=color_scheme)
        self.page = self.context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"pageerror: {e}"))
        self.page.set_default_timeout(20_000)

    def open(self, view: str = "overview", token: str | None = TOKEN) -> "Dashboard":
        """Loads the page at ``#view`` (it asks nothing first: on these loopback servers without tenants
        the reads need no token) and, with ``token``, gives it as a user does: **Token…**, then save."""
        self.page.goto(f"{self.url}/#{view}")
        self.page.wait_for_selector(f"#view-{view}:not([hidden])")
        if token is not None:
            self.give_token(token)
        return self

    def give_token(self, token: str) -> None:
        """Answers the token dialog with ``token``, opening it first from the header unless a 401 has."""
        if not self.page.is_visible("#token-dialog[open]"):
            self.page.click("#token-button")
        self.page.fill("#token-input", token)
        self.page.click("#token-save")

    def go(self, view: str) -> None:
        self.page.evaluate("view => { window.location.hash = view; }", view)
        self.page.wait_for_selector(f"#view-{view}:not([hidden])")

    def close(self) -> None:
        self.context.close()
