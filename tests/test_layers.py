"""The layering contracts in pyproject.toml ([tool.importlinter]) hold: `lint-imports` over the
checkout as it is (its folders are the packages)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_lint_imports_keeps_every_contract():
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([str(lint_imports), "--no-cache", "--config", str(REPO / "pyproject.toml")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_building_the_server_app_loads_no_admin_code():
    """The server gets the admin app from the composition root (chunkstore.serve), at run time too."""
    code = ("import sys, chunkstore.server.app, chunkstore.server.lifecycle; "
            "print(sorted(m for m in sys.modules if m == 'chunkstore.serve' "
            "or m.startswith(('chunkstore.api', 'chunkstore.webui'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]"


@pytest.mark.slow  # several seconds: CI runs it, the fast subset does not
def test_opening_and_migrating_a_store_loads_nothing_above_the_disk_tier(tmp_path):
    """The disk tier runs alembic's env.py whenever it creates or upgrades an index: that must not
    reach up into the API (whose table the same index holds) or the cache, out of the linter's sight."""
    code = ("import json, sys; from chunkstore.disk.store import ChunkStore; from tests.helpers import TINY; "
            f"ChunkStore({str(tmp_path / 'store')!r}, TINY).close(); "
            "print(json.dumps({'migrated': 'alembic.command' in sys.modules, 'above': sorted(m for m in sys.modules "
            "if m.startswith('chunkstore.') and m.split('.')[1] not in ('disk', 'sizes', 'choices', 'priority'))}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, timeout=120)
    assert json.loads(out.stdout) == {"migrated": True, "above": []}
