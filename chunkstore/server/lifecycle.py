"""Serve an app with uvicorn until SIGTERM or SIGINT, then shut down in order.

Invariants: once a signal arrives no new connection is accepted; requests still running after
``grace_s`` seconds are cancelled (the engine ends them as ``abort`` at their next step, so streams
finish with their last events and ``[DONE]``) and get a few more seconds before uvicorn cuts what is
left; ``serve_until_signal`` returns instead of letting the signal kill the process (uvicorn
re-raises it when done), so the caller can close the engine afterwards.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from typing import Any

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("chunkstore.serve")

ABORT_GRACE_S = 5.0  # after aborting, how long streams get to send their last events


class BindError(OSError):
    """The address cannot be listened on."""


def bind(host: str, port: int) -> socket.socket:
    """A TCP socket bound to (host, port); port 0 picks a free one. Raises BindError."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise BindError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return sock


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
    """uvicorn's server, which on shutdown gives running requests ``grace_s`` seconds, then aborts them."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, grace_s: float, latch: _SignalLatch) -> None:
        super().__init__(config)
        self.in_flight, self.grace_s, self.latch = app.state.in_flight, grace_s, latch

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.latch.received:  # a signal came before uvicorn's handlers were in place
            self.should_exit = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        timer = asyncio.get_running_loop().call_later(self.grace_s, self._abort_running)
        try:
            await super().shutdown(sockets)
        finally:
            timer.cancel()

    def _abort_running(self) -> None:
        count = self.in_flight.cancel_all()
        if count:
            log.warning("shutdown: aborting %d request(s) still running after %.1f s", count, self.grace_s)


def serve_until_signal(app: FastAPI, sock: socket.socket, *, log_level: str, grace_s: float) -> None:
    """Run ``app`` on ``sock`` (main thread) until SIGTERM or SIGINT and the shutdown above."""
    config = uvicorn.Config(app, log_level=log_level, lifespan="on",
                            timeout_graceful_shutdown=grace_s + ABORT_GRACE_S)
    with _SignalLatch() as latch:
        _GracefulServer(config, app, grace_s, latch).run(sockets=[sock])
