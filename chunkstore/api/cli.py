"""`chunkstore admin`: the management API alone, over a store on disk, served by uvicorn.

Invariants: importing this module imports nothing heavy (the parser is built for every command);
flags win over CHUNKSTORE_ADMIN_* variables, which win over defaults; the address served and the
admin token's file (never the token) are printed at start; the store is closed on exit.
"""

from __future__ import annotations

import argparse
import sys

from chunkstore.http import connection_limits as limits
from chunkstore.store_flags import add_store_flags


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_store_flags(p)
    p.add_argument("--host", help="address to bind (default 127.0.0.1, or $CHUNKSTORE_ADMIN_HOST); beyond "
                                  "loopback, reads need the token too")
    p.add_argument("--port", type=int, help="TCP port (default 8001, or $CHUNKSTORE_ADMIN_PORT; 0: any free port)")
    p.add_argument("--admin-token", help="the bearer token (default $CHUNKSTORE_ADMIN_TOKEN, else the token file "
                                         "in the store folder, generated on first start)")
    p.add_argument("--allowed-host", action="append", metavar="NAME",
                   help="a Host header name to accept besides loopback names and the bind address (repeatable)")
    p.add_argument("--namespace-token", action="append", metavar="NAMESPACE=TOKEN",
                   help="a token that sees and changes only NAMESPACE (repeatable)")
    p.add_argument("--read-only", action="store_true",
                   help="open the store read-only (beside a running writer); state-changing calls answer 409")
    p.add_argument("--header-timeout-s", type=float, metavar="SECONDS",
                   help="seconds a request's header may take from its first byte (a new connection's start); then "
                        f"408 and the connection closes (default {limits.HEADER_TIMEOUT_S:g}, or "
                        "$CHUNKSTORE_ADMIN_HEADER_TIMEOUT_S)")
    p.add_argument("--body-timeout-s", type=float, metavar="SECONDS",
                   help="longest pause while a request's body arrives; then 408 and the connection closes "
                        f"(default {limits.BODY_TIMEOUT_S:g}, or $CHUNKSTORE_ADMIN_BODY_TIMEOUT_S)")
    p.add_argument("--max-connections", type=int, metavar="N",
                   help="connections open at once; more are answered 503 and closed as they open "
                        f"(default {limits.MAX_CONNECTIONS}, or $CHUNKSTORE_ADMIN_MAX_CONNECTIONS)")


def _settings(args: argparse.Namespace):
    from chunkstore.api.settings import AdminSettings

    given = {"host": args.host, "port": args.port, "token": args.admin_token,
             "allowed_hosts": tuple(args.allowed_host) if args.allowed_host else None,
             "namespace_tokens": tuple(args.namespace_token) if args.namespace_token else None,
             "header_timeout_s": args.header_timeout_s, "body_timeout_s": args.body_timeout_s,
             "max_connections": args.max_connections}
    return AdminSettings(**{k: v for k, v in given.items() if v is not None})


SHUTDOWN_GRACE_S = 5.0  # on SIGTERM/SIGINT, how long running requests may finish


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM. Returns 0, or 2 with a message for a store that cannot be opened,
    bad settings, or an address that cannot be bound."""
    from pydantic import ValidationError

    from chunkstore.api.app import API_PREFIX, create_app
    from chunkstore.api.backend import StoreBackend
    from chunkstore.disk import IndexMissingError, seal_key_provider
    from chunkstore.disk.store import StoreBusyError
    from chunkstore.http.connection_limits import ConnectionLimits
    from chunkstore.http.lifecycle import bind, serve_until_signal, url_of

    def fail(message: str) -> int:
        print(f"chunkstore: error: {message}", file=sys.stderr)
        return 2

    try:
        settings = _settings(args)
    except ValidationError as exc:
        return fail(f"bad admin settings: {exc.errors()[0]['msg']}")
    from sqlalchemy.exc import DatabaseError

    try:
        backend = StoreBackend(args.disk_path, read_only=args.read_only, index_url=args.index_url,
                               object_store=args.object_store, seal_key=seal_key_provider(args.seal_key))
    except StoreBusyError as exc:
        return fail(f"{exc} (a running `chunkstore serve` mounts this API at {API_PREFIX}; or pass --read-only)")
    except (FileNotFoundError, IndexMissingError, RuntimeError, ValueError, OSError) as exc:
        return fail(str(exc))
    except DatabaseError as exc:  # (sqlalchemy's: a database that does not answer, or refuses)
        from chunkstore.disk import display_url

        where = display_url(args.index_url) if args.index_url else f"{args.disk_path}/index.db"
        return fail(f"cannot use the index at {where}: {exc.orig}")
    try:
        try:
            app = create_app(backend, settings)
            sock = bind(settings.host, settings.port)
        except (ValueError, OSError) as exc:  # BindError is an OSError
            return fail(str(exc))
        print(f"chunkstore admin: serving {args.disk_path} at {url_of(sock)}{API_PREFIX} "
              f"(docs at {API_PREFIX}/docs)", file=sys.stderr)
        token = app.state.admin.token
        where = f"in {token.path}" if token.path is not None else "from --admin-token / CHUNKSTORE_ADMIN_TOKEN"
        print(f"chunkstore admin: admin token {where}", file=sys.stderr, flush=True)
        # Returns after the signal instead of dying of it, so the store closes below.
        serve_until_signal(app, sock, log_level="info", grace_s=SHUTDOWN_GRACE_S, limits=ConnectionLimits.of(settings))
        return 0
    finally:
        backend.close()
