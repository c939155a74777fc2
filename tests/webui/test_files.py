"""The dashboard's files: all shipped by a pip install, nothing loaded from elsewhere, and the
vendored library as its README says (version and checksums)."""

from __future__ import annotations

import fnmatch
import hashlib
import re
import tomllib

from chunkstore.api.webui import WEBUI_DIR
from tests.helpers.server import REPO


def test_every_file_of_the_dashboard_is_package_data():
    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["chunkstore.webui"]
    for path in WEBUI_DIR.rglob("*"):
        if path.is_file() and path.suffix != ".py" and "__pycache__" not in path.parts:  # modules install as such
            name = path.relative_to(WEBUI_DIR).as_posix()
            assert any(fnmatch.fnmatch(name, g) and name.count("/") == g.count("/") for g in globs), \
                f"webui/{name} would not be installed: add it to [tool.setuptools.package-data] in pyproject.toml"


def test_the_page_loads_nothing_from_elsewhere():
    for path in [WEBUI_DIR / "index.html", WEBUI_DIR / "app.css", *WEBUI_DIR.glob("js/**/*.js")]:
        text = path.read_text()
        assert not re.search(r"""(src|href)=["'](https?:)?//""", text), path
        assert not re.search(r"""(fetch|import)\s*\(\s*["'`](https?:)?//""", text), path
        assert not re.search(r"""url\(\s*["']?(https?:)?//""", text), path
        for module in re.findall(r"""from\s+["'](\.[^"']+)["']""", text):
            assert (path.parent / module).resolve().is_file(), f"{path.name} imports {module}, which is missing"


def test_the_vendored_library_is_the_one_its_readme_names():
    readme = (WEBUI_DIR / "vendor" / "README.md").read_text()
    header = (WEBUI_DIR / "vendor" / "uPlot.iife.min.js").read_text()[:100]
    version = re.search(r"uPlot \(v([\d.]+)\)", header).group(1)
    assert f"| {version} |" in readme and f"uplot@{version}" in readme
    for name in ("uPlot.iife.min.js", "uPlot.min.css", "uPlot.LICENSE"):
        digest = hashlib.sha256((WEBUI_DIR / "vendor" / name).read_bytes()).hexdigest()
        assert f"{digest}  {name}" in readme, f"{name}'s checksum is not the README's"
    assert "MIT License" in (WEBUI_DIR / "vendor" / "uPlot.LICENSE").read_text()


def test_a_missing_dashboard_leaves_the_api_running(tmp_path, monkeypatch, caplog):
    """Without its files (a broken install) the app still starts: `/` is 404, the API answers."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    import chunkstore.api.webui as webui

    monkeypatch.setattr(webui, "WEBUI_DIR", tmp_path / "missing")
    app = FastAPI()

    @app.get("/health")
    def health() -> dict:
        return {"ok": True}

    webui.add_webui(app)
    client = TestClient(app)
    assert client.get("/").status_code == 404 and client.get("/health").json() == {"ok": True}
    assert "not installed" in caplog.text
