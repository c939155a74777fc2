"""Property-based testing of the generation APIs' OpenAPI spec (/openapi.json) with schemathesis,
against a real server over the tiny preset, with every check: no 5xx; every status documented;
every response of its documented content type and schema; the spec and the server agree in both
directions (a request the spec calls valid is served, one it forbids is refused); a method the
spec does not list is 405 with an ``Allow`` that names exactly the ones it does.

Three ways of calling: a server without API keys; one with keys, called with a key; the same
called without one (every operation answers 401). Bounded: the examples, coverage (boundary and
negative cases) and fuzzing phases, about 850 requests in ~50 s without keys, fewer with them,
each generating at most a few tokens (schemathesis_hooks.py). A longer run (thousands of cases per
mode) is ``st run URL/openapi.json --checks all --max-examples 150`` against `chunkstore serve`.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from chunkstore.engine import Engine, EngineConfig
from chunkstore.server.settings import ServerSettings
from tests.openapi_ops import count_operations
from tests.helpers.server import REPO, Served, cache_config

ST = shutil.which("schemathesis") or shutil.which("st")
pytestmark = [pytest.mark.skipif(ST is None, reason="schemathesis is not installed (pip install schemathesis)"),
              pytest.mark.slow]
KEY = "alice-schemathesis-key"
# Every check; a response may take a while on two shared CPU cores (schemathesis' default limit is 10 s).
CHECKS = ["--checks", "all", "--max-response-time", "60"]


def run_schemathesis(url: str, *, max_examples: int, headers: tuple[str, ...] = ()) -> None:
    operations = count_operations(f"{url}/openapi.json")
    cmd = [ST, "run", f"{url}/openapi.json", *CHECKS, "--phases", "examples,coverage,fuzzing", "--mode", "all",
           "--max-examples", str(max_examples), "--workers", "1", "--seed", "1", "--no-color",
           "--request-timeout", "30", *(arg for header in headers for arg in ("--header", header))]
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks", "PYTHONPATH": str(REPO)}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert f"Tested: {operations}" in out.stdout, out.stdout[-3000:]  # every operation of the spec


def test_schemathesis_over_the_generation_api(tiny, tmp_path):
    engine = Engine(tiny, cache_config(tmp_path), EngineConfig(max_queue_size=8, max_running_requests=2))
    with Served(engine, ServerSettings()) as served:
        run_schemathesis(served.url, max_examples=15)


def test_schemathesis_with_api_keys(tiny, tmp_path):
    engine = Engine(tiny, cache_config(tmp_path), EngineConfig(max_queue_size=8, max_running_requests=2))
    with Served(engine, ServerSettings(api_key=(f"alice={KEY}",))) as served:
        run_schemathesis(served.url, max_examples=3, headers=(f"Authorization: Bearer {KEY}",))
        run_schemathesis(served.url, max_examples=2)  # no key: 401 before anything else, bodies included
