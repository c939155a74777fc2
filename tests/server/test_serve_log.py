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


def test_the_admin_token_is_in_the_data_folder_whatever_the_model(serve_process, tmp_path):
    """The preset first (its store is the data folder), then a local model folder (its store is one
    below it): both servers keep the one token the README names, data/admin-token, and a wrong
    token's 401 names that file."""
    first = serve_process()
    assert first.client.get("/health").status_code == 200
    first.stop()
    token = (tmp_path / "data" / "admin-token").read_text().strip()
    model = tmp_path / "model"
    model.mkdir()
    make_model_folder(model)
    second = serve_process("--model", str(model))
    assert "models" in second.output().split("data in ")[1]  # this model's store is below the data folder
    assert not list((tmp_path / "data" / "models").rglob("admin-token"))
    ok = second.client.post("/api/v1/flush", json={}, headers={"Authorization": f"Bearer {token}"})
    assert ok.status_code == 200, ok.text
    bad = second.client.post("/api/v1/flush", json={}, headers={"Authorization": "Bearer wrong"})
    assert bad.status_code == 401 and str(tmp_path / "data" / "admin-token") in bad.text
