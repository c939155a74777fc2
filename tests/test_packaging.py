"""The built wheel: one top-level package, chunkstore, holding the management API, the dashboard's
files and everything else; the alembic migrations as data files."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # builds a wheel


@pytest.fixture(scope="module")
def wheel_names(tmp_path_factory) -> list[str]:
    out = tmp_path_factory.mktemp("wheel")
    build = tmp_path_factory.mktemp("build")  # not the checkout's build/: a clean build
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out),
                    str(REPO)], check=True, timeout=300, cwd=build, capture_output=True)
    wheel, = out.glob("chunkstore-*.whl")
    with zipfile.ZipFile(wheel) as z:
        return z.namelist()


def test_the_only_top_level_package_is_chunkstore(wheel_names):
    top = {name.split("/")[0] for name in wheel_names if not name.split("/")[0].endswith((".dist-info", ".data"))}
    assert top == {"chunkstore"}


def test_the_api_and_the_dashboard_install_under_chunkstore(wheel_names):
    names = set(wheel_names)
    assert {"chunkstore/api/__init__.py", "chunkstore/api/app.py", "chunkstore/api/routers/chunks.py",
            "chunkstore/disk/store.py", "chunkstore/webui/index.html"} <= names
    api = REPO / "chunkstore" / "api"
    source_modules = {str(p.relative_to(api)) for p in api.rglob("*.py")}
    assert {f"chunkstore/api/{m}" for m in source_modules} <= names, "an api module is missing from the wheel"
    assert any(n.endswith(".data/data/share/chunkstore/alembic/env.py") for n in names)
