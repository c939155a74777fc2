"""The server's shutdown: chunkstore.http.lifecycle, with the requests in flight aborted after the grace.

Invariants: as chunkstore.http.lifecycle's, with ``abort`` the app's ``InFlight.cancel_all`` (the
engine ends those requests as ``abort`` at their next step, so streams finish with their last events
and ``[DONE]``).
"""

from __future__ import annotations

import socket

from fastapi import FastAPI

from chunkstore.http import lifecycle
from chunkstore.http.connection_limits import ConnectionLimits
from chunkstore.http.lifecycle import BindError, bind

__all__ = ["BindError", "bind", "serve_until_signal"]


def serve_until_signal(app: FastAPI, sock: socket.socket, *, log_level: str, grace_s: float,
                       limits: ConnectionLimits) -> None:
    """Run the server's ``app`` on ``sock`` until SIGTERM or SIGINT and an orderly shutdown."""
    lifecycle.serve_until_signal(app, sock, log_level=log_level, grace_s=grace_s, abort=app.state.in_flight.cancel_all,
                                 limits=limits)
