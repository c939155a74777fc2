"""`chunkstore serve`: the composition root of one process running the engine, the server and the
management API, and its orderly shutdown.

It sits above both apps: ``create_app`` builds the server's app (chunkstore.server) and mounts the
management API (chunkstore.api) and its dashboard in it, so neither app imports the other.
Invariants: flags override CHUNKSTORE_* environment variables, which override defaults (the cache's
flags are chunkstore.cache.config's); nothing is downloaded; on SIGTERM or SIGINT the server stops
accepting connections, lets running requests finish for ``shutdown_timeout_s``, aborts the rest
(their streams end with finish_reason ``abort``, their whole pages are cached), then closes the
engine, which writes to disk what the write policy keeps; every connection, the management API's
too, is held to the server's connection limits (``header_timeout_s``, ``body_timeout_s``,
``max_connections``); the exit code is 0 after an orderly shutdown and 2 when the settings, the
model, the store or the address cannot be used.
"""

from __future__ import annotations

import argparse
import gc
import logging
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from chunkstore.cache.config import CacheConfig, add_cli_arguments, env_name, help_text
from chunkstore.server.settings import ServerSettings

log = logging.getLogger("chunkstore.serve")

_FLAG_TYPES: dict[str, dict[str, Any]] = {
    "port": dict(type=int), "seed": dict(type=int), "max_queue_size": dict(type=int, metavar="N"),
    "max_running_requests": dict(type=int, metavar="N"), "torch_threads": dict(type=int, metavar="N"),
    "shutdown_timeout_s": dict(type=float, metavar="SECONDS"), "header_timeout_s": dict(type=float, metavar="SECONDS"),
    "body_timeout_s": dict(type=float, metavar="SECONDS"), "max_connections": dict(type=int, metavar="N"),
    "model": dict(type=Path, metavar="PATH"), "preset": dict(metavar="NAME"), "served_model_name": dict(metavar="NAME"),
    "api_key": dict(action="append", metavar="[NAME=]KEY"), "max_body_bytes": dict(metavar="SIZE"),
    "log_level": dict(metavar="LEVEL"),
}
_GROUPS = {"server": ("host", "port", "api_key", "served_model_name", "max_body_bytes", "shutdown_timeout_s",
                      "header_timeout_s", "body_timeout_s", "max_connections", "log_level"),
           "model and engine": ("model", "preset", "dtype", "seed", "device", "max_queue_size",
                                "max_running_requests", "torch_threads")}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``chunkstore serve``: the server's, the model's and engine's, and the cache's.
    Unset flags leave no attribute, so the environment and the defaults apply."""
    fields = ServerSettings.model_fields
    for title, names in _GROUPS.items():
        group = parser.add_argument_group(title)
        for name in names:
            info = fields[name]
            default = "none" if info.default in (None, ()) else info.default
            group.add_argument("--" + name.replace("_", "-"), dest=name, default=argparse.SUPPRESS,
                               help=help_text(info.description, env_name(name), str(default)),
                               **_FLAG_TYPES.get(name, {}))
    add_cli_arguments(parser)


def settings_from_args(args: argparse.Namespace) -> tuple[ServerSettings, CacheConfig]:
    """Both settings objects from the flags (then the environment, then defaults). Raises
    pydantic.ValidationError."""
    given = {name: getattr(args, name) for name in ServerSettings.model_fields if hasattr(args, name)}
    return ServerSettings(**given), CacheConfig.from_cli_args(args)


class _Exit(Exception):
    """Startup failed: print the message, exit 2."""


def _build_engine(settings: ServerSettings, cache_config: CacheConfig):
    import torch

    from sqlalchemy.exc import DBAPIError

    from chunkstore.disk import display_url
    from chunkstore.engine import Engine, EngineConfig, load_model  # torch and transformers: only now

    if settings.torch_threads is not None:
        torch.set_num_threads(settings.torch_threads)
    if settings.model is not None and not settings.model.is_dir():
        raise _Exit(f"--model {settings.model}: no such model folder (built-in models: --preset)")
    name = str(settings.model) if settings.model is not None else settings.preset
    try:
        loaded = load_model(name, seed=settings.seed, dtype=settings.dtype, device=settings.device)
    except (OSError, ValueError, RuntimeError) as exc:
        raise _Exit(f"cannot load the model {name}: {exc}") from None
    try:
        return Engine(loaded, cache_config, EngineConfig(max_queue_size=settings.max_queue_size,
                                                         max_running_requests=settings.max_running_requests))
    except (OSError, ValueError, RuntimeError) as exc:  # a busy or foreign store, pools that do not fit
        raise _Exit(f"cannot open the cache at {cache_config.disk_path}: {exc}") from None
    except DBAPIError as exc:  # a shared tier's database that does not answer, or refuses
        where = display_url(cache_config.index_url) if cache_config.index_url else cache_config.disk_path
        raise _Exit(f"cannot use the index at {where}: {exc.orig}") from None


def run(args: argparse.Namespace) -> int:
    """Serve until SIGTERM or SIGINT. Exit code: 0 after an orderly shutdown, 2 when it cannot start."""
    try:
        settings, cache_config = settings_from_args(args)
    except ValidationError as exc:
        print(f"chunkstore serve: error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    try:
        engine = _build_engine(settings, cache_config)
    except _Exit as exc:
        print(f"chunkstore serve: error: {exc}", file=sys.stderr)
        return 2
    from chunkstore.server.lifecycle import BindError  # uvicorn and fastapi: only now

    try:
        return _serve(engine, settings, cache_config)
    except (BindError, _Exit) as exc:
        print(f"chunkstore serve: error: {exc}", file=sys.stderr)
        return 2
    finally:
        log.info("closing the engine: running requests end, the cache writes down what its write policy keeps")
        engine.close()
        log.info("closed")


def _data_folder(engine, cache_config: CacheConfig) -> str:
    """Where this model's pages live: its store's folder (below the data folder for a second model)."""
    store = engine.cache.store
    return str(store.root) if store is not None else f"{cache_config.disk_path} (no disk tier)"


def _admin_settings(engine, settings: ServerSettings):
    """The mounted management API's settings: the server's address, and one admin token file per
    server, ``admin-token`` in the data folder, whichever model's store (the folder itself, or one
    below it) the server opened; CHUNKSTORE_ADMIN_TOKEN_FILE, when set, wins."""
    from chunkstore import api

    admin = api.AdminSettings(host=settings.host, port=settings.port)
    if admin.token_file is None and engine.cache.store is not None:
        admin = admin.model_copy(update={"token_file": Path(engine.cache.config.disk_path) / api.TOKEN_FILENAME})
    return admin


def create_app(engine, settings: ServerSettings):
    """The app of `chunkstore serve`: the server's APIs over ``engine``, the management API under
    /api/v1 (its own Host rule, body limit and errors; each tenant's API key is also its namespace
    token there, so tenants read their own chunks) with its metrics also at /metrics, and the
    dashboard at /. Raises ValueError when the management API has no admin token to be had, or its
    admin token is also a tenant's key."""
    from chunkstore import api  # fastapi: only now
    from chunkstore.api.webui import add_webui
    from chunkstore.server.app import MountedApp
    from chunkstore.server.app import create_app as create_server_app

    def mount_admin(parent) -> MountedApp:
        backend = api.CacheBackend(engine.cache, decode=engine.tokenizer.decode, serving=engine.serving.snapshot)
        admin = api.mount(parent, backend, _admin_settings(engine, settings),
                          namespace_digests=[(t.namespace, t.digest) for t in settings.tenants])
        add_webui(parent)  # the dashboard (webui/, docs/WEBUI.md) at /, calling the API above at api/v1/
        return MountedApp(api.API_PREFIX, admin, metrics_path=f"{api.API_PREFIX}/metrics")

    return create_server_app(engine, settings, mount=mount_admin)


def _serve(engine, settings: ServerSettings, cache_config: CacheConfig) -> int:
    from chunkstore.http.connection_limits import ConnectionLimits
    from chunkstore.http.lifecycle import url_of
    from chunkstore.server.lifecycle import bind, serve_until_signal

    try:
        app = create_app(engine, settings)
    except ValueError as exc:  # no admin token to be had, or it is also a tenant's key
        raise _Exit(f"cannot start the management API: {exc}") from None
    sock = bind(settings.host, settings.port)
    freeze_startup_heap()
    print(f"chunkstore serve: {url_of(sock)} model {settings.model_name!r} "
          f"({engine.loaded.model_id}, {engine.loaded.device}), data in {_data_folder(engine, cache_config)}", flush=True)
    serve_until_signal(app, sock, log_level=settings.log_level, grace_s=settings.shutdown_timeout_s,
                       limits=ConnectionLimits.of(settings))
    return 0


def freeze_startup_heap() -> None:
    """Keep what start-up built (the model, the engine, the app: about 310,000 objects on the
    default preset) out of the cyclic garbage collector's passes. A full collection visits every
    tracked object: 90 ms of CPU here, holding the GIL, so every request in flight stalled for it.
    Objects made later are collected as before."""
    gc.collect()
    gc.freeze()
