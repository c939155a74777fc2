"""The log of a real `chunkstore serve` subprocess is quiet: each alembic line once, no plugin chatter,
the generated admin token announced at INFO (never the token), no weight-loading progress bar."""

from __future__ import annotations

import re

import pytest

from tests.engine.test_loader import make_model_folder

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset


def test_serve_log_has_no_duplicates_warnings_or_progress_bars(serve_process, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    make_model_folder(model)
    server = serve_process("--model", str(model), "--log-level", "info")  # the last --log-level wins
    assert server.client.get("/health").status_code == 200
    log = server.output()
    alembic = [line for line in log.splitlines() if "alembic" in line]
    assert alembic, log  # a fresh store is migrated at info level
    assert len(alembic) == len(set(alembic)), "\n".join(alembic)
    assert "alembic.runtime.plugins" not in log
    assert not re.search(r"^WARNING", log, re.MULTILINE), log
    token_line = next(line for line in log.splitlines() if "generated an admin token" in line)
    assert token_line.startswith("INFO ")
    token = (tmp_path / "data" / "admin-token").read_text().strip()
    assert token and token not in log
    assert "Loading weights" not in log and "it/s]" not in log and "\r" not in log
