"""Serve an ASGI app with uvicorn on a bound socket until SIGTERM or SIGINT, then shut down in order.

Used by `chunkstore serve` and `chunkstore admin`. Invariants: once a signal arrives no new
connection is accepted; requests still running after ``grace_s`` seconds are handed to ``abort``
(the server's: the engine ends them as ``abort`` at their next step, so streams finish with their
last events) and get ``ABORT_GRACE_S`` more before uvicorn cuts what is left (without ``abort``,
uvicorn cuts them at ``grace_s``); ``serve_until_signal`` returns instead of letting the signal kill
the process (uvicorn re-raises it when done), so the caller can close what it opened afterwards;
every connection is served by uvicorn's h11 protocol with the server's ConnectionLimits
(chunkstore.http.guarded_h11), whatever other HTTP implementation is installed.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from starlette.types import ASGIApp

from chunkstore.http.connection_limits import ConnectionLimits
from chunkstore.http.guarded_h11 import guarded_h11

log = logging.getLogger("chunkstore.serve")

ABORT_GRACE_S = 5.0  # after aborting, how long streams get to send their last events


class BindError(OSError):
    """The address cannot be listened on."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); ``host`` may be an IPv6 address with or without brackets;
    port 0 picks a free one. Raises BindError."""
    address = host.strip().strip("[]")
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((address, port))
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


def url_of(sock: socket.socket) -> str:
    """``http://host:port`` of a bound socket (IPv6 in brackets)."""
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _SignalLatch:
    """Our SIGTERM/SIGINT handlers, installed around uvicorn's: they only note the signal, so the one
    uvicorn re-raises after its shutdown does not kill the process."""

    def __init__(self) -> None:
        self.received: list[int] = []
        self._previous: dict[int, Any] = {}

    def _note(self, signum: int, frame) -> None:
        self.received.append(signum)

    def __enter__(self) -> "_SignalLatch":
        self._previous = {sig: signal.signal(sig, self._note) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class _GracefulServer(uvicorn.Server):
    """uvicorn's server, which on shutdown gives running requests ``grace_s`` seconds, then calls ``abort``."""

    def __init__(self, config: uvicorn.Config, grace_s: float, abort: Callable[[], int] | None,
                 latch: _SignalLatch) -> None:
        super().__init__(config)
        self.grace_s, self.abort, self.latch = grace_s, abort, latch

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.latch.received:  # a signal came before uvicorn's handlers were in place
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.abort is None:
            return await super().shutdown(sockets)
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._abort_running)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _abort_running(self) -> None:
        count = self.abort() if self.abort is not None else 0
        if count:
            log.warning("shutdown: aborting %d request(s) still running after %.1f s", count, self.grace_s)


def serve_until_signal(app: ASGIApp, sock: socket.socket, *, log_level: str, grace_s: float,
                       abort: Callable[[], int] | None = None, limits: ConnectionLimits = ConnectionLimits()) -> None:
    """Run ``app`` on ``sock`` (main thread) until SIGTERM or SIGINT and the shutdown above.
    ``abort`` cancels the requests still running and returns how many it cancelled; ``limits``
    bound how long a request may take to arrive and how many connections are open."""
    timeout_s = grace_s + ABORT_GRACE_S if abort is not None else grace_s
    config = uvicorn.Config(app, log_level=log_level, lifespan="on", timeout_graceful_shutdown=timeout_s,
                            http=guarded_h11(limits))
    with _SignalLatch() as latch:
        _GracefulServer(config, grace_s, abort, latch).run(sockets=[sock])
