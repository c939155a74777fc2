"""Property-based testing of the generation APIs' OpenAPI spec (/openapi.json) with schemathesis,
against a real server over the tiny preset: no 5xx, every status documented, every response of its
documented content type and schema, for valid and invalid (negative) requests alike.

Bounded: the examples, coverage (boundary and negative cases) and fuzzing phases, about 850
requests in ~50 s here, each generating at most a few tokens (schemathesis_hooks.py).
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
CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance"


def test_schemathesis_over_the_generation_api(tiny, tmp_path):
    engine = Engine(tiny, cache_config(tmp_path), EngineConfig(max_queue_size=8, max_running_requests=2))
    with Served(engine, ServerSettings()) as served:
        operations = count_operations(f"{served.url}/openapi.json")
        cmd = [ST, "run", f"{served.url}/openapi.json", "--checks", CHECKS, "--phases", "examples,coverage,fuzzing",
               "--mode", "all", "--max-examples", "15", "--workers", "1", "--seed", "1", "--no-color",
               "--request-timeout", "30"]
        env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.server.schemathesis_hooks", "PYTHONPATH": str(REPO)}
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=REPO)
    assert out.returncode == 0, out.stdout[-6000:] + out.stderr[-2000:]
    assert f"Tested: {operations}" in out.stdout, out.stdout[-3000:]  # every operation of the spec
