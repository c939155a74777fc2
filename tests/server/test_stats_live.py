"""`chunkstore stats` beside a live server: it shows every model's store in the data folder, and the
counts of a server that only reads (a disk hit) within seconds, not once the server stops."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.engine.test_loader import make_model_folder
from tests.helpers.fleet import cached, complete
from tests.helpers.server import STORY

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset


def stats(data) -> dict:
    out = subprocess.run([sys.executable, "-m", "chunkstore", "stats", "--disk-path", str(data), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_stats_shows_every_models_store_and_a_live_servers_disk_hit(serve_process, tmp_path):
    data = tmp_path / "data"
    first = serve_process()  # the preset: its store is the data folder itself
    complete(first, STORY)
    first.signal(signal.SIGTERM)
    assert first.wait() == 0
    model = tmp_path / "model"
    model.mkdir()
    make_model_folder(model)
    second = serve_process("--model", str(model))  # a second model: a store below the data folder
    prompt = "a prompt for the second model: " + STORY
    complete(second, prompt)
    second.signal(signal.SIGTERM)
    assert second.wait() == 0
    third = serve_process("--model", str(model))  # the same model again, its memory empty
    assert cached(complete(third, prompt))["disk"] > 0
    doc = stats(data)
    assert len(doc["models"]) == 1 and doc["num_chunks"] > 0
    deadline = time.monotonic() + 20  # the server writes its buffered counts every few seconds
    while (hits := stats(data)["models"][0]["stats"]["hits"]) == 0:
        assert time.monotonic() < deadline, "the live server's disk hits never reached the index"
        time.sleep(1)
    assert hits > 0 and third.proc.poll() is None  # seen while the server runs
