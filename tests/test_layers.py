"""The layering contracts in pyproject.toml ([tool.importlinter]) hold: `lint-imports` over the
package as it installs (the repository's api/ folder is chunkstore.api)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_lint_imports_keeps_every_contract(tmp_path):
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(REPO / "chunkstore", tmp_path / "chunkstore", ignore=ignore)
    shutil.copytree(REPO / "api", tmp_path / "chunkstore" / "api", ignore=ignore)
    lint_imports = Path(sys.executable).with_name("lint-imports")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    done = subprocess.run([str(lint_imports), "--no-cache", "--config", str(REPO / "pyproject.toml")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_building_the_server_app_loads_no_admin_code():
    """The server gets the admin app from the composition root (chunkstore.serve), at run time too."""
    code = ("import sys, chunkstore.server.app, chunkstore.server.lifecycle; "
            "print(sorted(m for m in sys.modules if m == 'chunkstore.serve' "
            "or m.startswith(('chunkstore.api', 'chunkstore.webui'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO, timeout=120)
    assert out.stdout.strip() == "[]"
