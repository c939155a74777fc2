"""ServerSettings and the `chunkstore serve` flags: parsing, precedence (flag > CHUNKSTORE_* > default), API
key entries."""

from __future__ import annotations

import argparse

import pytest
from pydantic import ValidationError

from chunkstore.cli import main
from chunkstore.engine import EngineConfig
from chunkstore.serve import add_arguments, run, settings_from_args
from chunkstore.server.settings import ServerSettings, Tenant


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("CHUNKSTORE_"):
            monkeypatch.delenv(name)


def test_defaults_are_the_embedded_ones():
    settings, cache = settings_from_args(parse())
    assert (settings.host, settings.port, settings.preset, settings.model) == ("127.0.0.1", 8000, "tiny", None)
    assert settings.model_name == "tiny" and settings.tenants == ()
    assert (settings.max_queue_size, settings.max_running_requests) == \
        (EngineConfig().max_queue_size, EngineConfig().max_running_requests)
    assert str(cache.disk_path) == "chunkstore-data"


def test_empty_environment_variables_count_as_unset(monkeypatch):
    for name in ("MODEL", "SERVED_MODEL_NAME", "DTYPE", "DEVICE", "API_KEY"):
        monkeypatch.setenv(f"CHUNKSTORE_{name}", "")
    settings = ServerSettings()
    assert (settings.model, settings.dtype, settings.device, settings.tenants) == (None, None, None, ())
    assert settings.model_name == "tiny"


def test_flags_override_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("CHUNKSTORE_PORT", "9001")
    monkeypatch.setenv("CHUNKSTORE_API_KEY", "alice=k-alice-1, bob=k-bob-2")
    monkeypatch.setenv("CHUNKSTORE_DEVICE_SIZE", "32pages")
    monkeypatch.setenv("CHUNKSTORE_MAX_BODY_BYTES", "1MiB")
    settings, cache = settings_from_args(parse("--page-size", "16"))
    assert settings.port == 9001 and [t.name for t in settings.tenants] == ["alice", "bob"]
    assert settings.max_body_bytes == 2**20 and cache.device_size == "32pages" and cache.page_size == 16
    settings, cache = settings_from_args(parse("--port", "9002", "--api-key", "carol=k-carol-3", "--api-key",
                                               "plain-key", "--device-size", "8pages", "--model", str(tmp_path)))
    assert settings.port == 9002 and [t.namespace for t in settings.tenants][0] == "carol"
    assert settings.tenants[1].namespace.startswith("key-") and cache.device_size == "8pages"
    assert settings.model_name == tmp_path.name
    assert settings.torch_threads is None  # torch's own default: one thread per core
    assert settings_from_args(parse("--torch-threads", "1"))[0].torch_threads == 1


@pytest.mark.parametrize("entry,name", [
    ("alice=secret-1", "alice"), ("team.a@x=abc", "team.a@x"),
    ("c2VjcmV0a2V5==", None),  # base64 padding: a bare key, not NAME=KEY
    ("a b=c", None),
])
def test_api_key_entries(entry, name):
    if " " in entry:
        with pytest.raises(ValueError):
            Tenant.parse(entry)
        return
    tenant = Tenant.parse(entry)
    if name is None:
        assert tenant.namespace.startswith("key-") and len(tenant.namespace) == 20
        assert Tenant.parse(entry).namespace == tenant.namespace  # stable across restarts
    else:
        assert tenant.name == tenant.namespace == name


@pytest.mark.parametrize("kwargs,says", [
    ({"api_key": ("a=k1", "b=k1")}, "same API key"),
    ({"api_key": ("a=k1", "a=k2")}, "same tenant name"),
    ({"api_key": ("",)}, "non-empty"),
    ({"port": 70000}, "port"),
    ({"max_body_bytes": "12pages"}, "not a size"),
    ({"log_level": "loud"}, "log level"),
    ({"max_running_requests": 0}, "max_running_requests"),
    ({"torch_threads": 0}, "torch_threads"),
])
def test_bad_settings(kwargs, says):
    with pytest.raises(ValidationError, match=says):
        ServerSettings(**kwargs)


def test_bad_flags_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--device-size", "5 lots"])
    assert exc.value.code == 2 and "not a size" in capsys.readouterr().err
    assert run(parse("--preset", "huge", "--disk-path", str(tmp_path / "d"))) == 2
    assert "unknown preset 'huge'" in capsys.readouterr().err
    assert run(parse("--model", str(tmp_path / "missing"))) == 2
    assert "no such model folder" in capsys.readouterr().err
    assert run(parse("--port", "-1")) == 2
    # A shared tier's database that does not answer at start-up (nothing listens on port 1).
    assert run(parse("--preset", "tiny", "--disk-path", str(tmp_path / "d"),
                     "--index-url", "postgresql+psycopg://kv:secret@127.0.0.1:1/chunks")) == 2
    err = capsys.readouterr().err
    assert "cannot use the index at postgresql+psycopg://kv:***@127.0.0.1:1/chunks" in err and "secret" not in err


def test_connection_limits_from_flags_the_environment_and_defaults(monkeypatch):
    from chunkstore.http.connection_limits import ConnectionLimits

    settings, _ = settings_from_args(parse())
    assert ConnectionLimits.of(settings) == ConnectionLimits()  # one set of defaults
    monkeypatch.setenv("CHUNKSTORE_HEADER_TIMEOUT_S", "4.5")
    monkeypatch.setenv("CHUNKSTORE_MAX_CONNECTIONS", "64")
    settings, _ = settings_from_args(parse("--body-timeout-s", "7", "--max-connections", "32"))
    assert ConnectionLimits.of(settings) == ConnectionLimits(header_timeout_s=4.5, body_timeout_s=7.0,
                                                             max_connections=32)


@pytest.mark.parametrize("flag,value,says", [
    ("--header-timeout-s", "0", "header_timeout_s (--header-timeout-s) must be a number of seconds greater than 0, "
                                "got 0.0"),
    ("--body-timeout-s", "-2", "body_timeout_s (--body-timeout-s) must be a number of seconds greater than 0, "
                               "got -2.0"),
    ("--body-timeout-s", "inf", "got inf"),
    ("--header-timeout-s", "nan", "got nan"),
    ("--max-connections", "0", "max_connections (--max-connections) must be an integer of at least 1, got 0"),
])
def test_bad_connection_limits_name_the_flag_and_the_value(flag, value, says, capsys):
    assert run(parse(flag, value)) == 2
    assert says in capsys.readouterr().err


def test_the_admin_takes_the_same_connection_limits(monkeypatch, tmp_path, capsys):
    from chunkstore.api.settings import AdminSettings
    from chunkstore.http.connection_limits import ConnectionLimits

    assert ConnectionLimits.of(AdminSettings()) == ConnectionLimits()
    monkeypatch.setenv("CHUNKSTORE_ADMIN_BODY_TIMEOUT_S", "3")
    assert AdminSettings().body_timeout_s == 3.0
    with pytest.raises(SystemExit) as exc:
        main(["admin", "--disk-path", str(tmp_path), "--max-connections", "many"])
    assert exc.value.code == 2 and "--max-connections: invalid int value: 'many'" in capsys.readouterr().err
    assert main(["admin", "--disk-path", str(tmp_path), "--header-timeout-s", "-1"]) == 2
    assert "header_timeout_s (--header-timeout-s) must be a number of seconds greater than 0, got -1.0" in \
        capsys.readouterr().err
