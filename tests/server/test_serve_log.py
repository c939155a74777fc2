"""The log of a real `chunkstore serve` subprocess is quiet: a new store's schema in one line (alembic's
own at debug only), at most five lines before the one that says where it listens, no plugin chatter,
the generated admin token announced at INFO (never the token), no weight-loading progress bar."""

from __future__ import annotations

import re

import pytest

from tests.engine.test_loader import make_model_folder

pytestmark = pytest.mark.slow  # `chunkstore serve` subprocesses: left out of the fast subset


def test_serve_log_is_short_and_has_no_duplicates_warnings_or_progress_bars(serve_process, tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    make_model_folder(model)
    server = serve_process("--model", str(model), "--log-level", "info")  # the last --log-level wins
    assert server.client.get("/health").status_code == 200
    log = server.output()
    assert "alembic" not in log, log  # its steps and "Context impl" lines are at debug
    created = [line for line in log.splitlines() if "schema created" in line]
    assert len(created) == 1 and created[0].startswith("INFO chunkstore.disk.migrations"), log
    assert len(log.split("chunkstore serve: http://")[0].splitlines()) <= 5, log
    assert not re.search(r"^WARNING", log, re.MULTILINE), log
    token_line = next(line for line in log.splitlines() if "generated an admin token" in line)
    assert token_line.startswith("INFO ")
    token = (tmp_path / "data" / "admin-token").read_text().strip()
    assert token and token not in log
    assert "Loading weights" not in log and "it/s]" not in log and "\r" not in log


def test_alembic_steps_show_at_debug(serve_process):
    server = serve_process("--log-level", "debug")
    assert server.client.get("/health").status_code == 200
    log = server.output()
    assert "DEBUG alembic.runtime.migration: Running upgrade  -> 0001" in log, log
    assert "INFO alembic" not in log
