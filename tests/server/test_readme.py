"""The README's examples, run as a user copies them: its curl command twice against a real
`chunkstore serve` on the embedded defaults (the second answer shows the hit the README prints), and
its Python example in a fresh folder."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys

import pytest

from tests.helpers.server import REPO

README = (REPO / "README.md").read_text()


def blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def run_curl(url: str) -> dict:
    (curl,) = [b for b in blocks("sh") if "curl" in b]
    assert "localhost:8000" in curl
    done = subprocess.run(["bash", "-c", curl.replace("localhost:8000", url.removeprefix("http://"))],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_the_quick_start_curl_shows_a_hit_the_second_time_and_from_disk_after_a_restart(serve_process):
    flags = ("--page-size", "64", "--device-size", "256pages")  # the README's defaults, not ServeProcess's
    served = serve_process(*flags)
    first, second = run_curl(served.url), run_curl(served.url)
    assert first["prompt_tokens_details"]["cached_tokens"] == 0
    assert second["prompt_tokens_details"]["cached_tokens"] > 0
    (printed,) = [b for b in blocks("json") if "cached_tokens" in b]
    assert json.loads(printed) == second, "the README prints another answer than the server gives"
    served.signal(signal.SIGTERM)
    assert served.wait() == 0
    after = run_curl(serve_process(*flags).url)
    assert after["cached_tokens_details"]["disk"] == second["prompt_tokens_details"]["cached_tokens"]


def test_the_python_example_runs(tmp_path):
    (example,) = blocks("python")
    done = subprocess.run([sys.executable, "-c", example], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "my-kv-store" / "store.json").is_file()
