"""ConnectionLimits: how long a client may take to send a request, and how many connections may be open.

Invariants: each timeout is a finite number of seconds > 0 and the connection cap an integer >= 1,
checked at construction with a message naming the setting, its flag and the value given; the
defaults here are the defaults of both apps' settings (`chunkstore serve`, `chunkstore admin`).
Importing this module imports nothing heavy: the settings import it (chunkstore.http.guarded_h11
enforces the limits on uvicorn's connections).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

# A header is a few hundred bytes, one packet from any client; 10 s leaves room for a lossy link's
# retransmits (nginx's client_header_timeout is 60 s, Apache's mod_reqtimeout 20-40 s: both
# servers hold many thousand connections, this one a few hundred).
HEADER_TIMEOUT_S = 10.0
# A pause between two pieces of a body (not the whole body: an 8 MiB prompt on a slow link may
# take longer than this and still never pause that long).
BODY_TIMEOUT_S = 30.0
# Far above what the engine serves at once (its queue, 64, and running requests, 4, by default)
# plus idle keep-alive clients and dashboards, and far below the usual 1024 open files per process.
MAX_CONNECTIONS = 512


def flag_of(name: str) -> str:
    """The command-line flag of a setting: ``header_timeout_s`` -> ``--header-timeout-s``."""
    return "--" + name.replace("_", "-")


def check_timeout_s(name: str, value: Any) -> float:
    """``value`` as seconds. Raises ValueError naming the setting unless it is finite and > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} ({flag_of(name)}) must be a number of seconds greater than 0, got {value!r}")
    return float(value)


def check_count(name: str, value: Any) -> int:
    """``value`` as a count. Raises ValueError naming the setting unless it is an integer >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} ({flag_of(name)}) must be an integer of at least 1, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """``header_timeout_s``: from a request's first byte (a new connection's start, for its first
    request) until its header is complete. ``body_timeout_s``: the longest pause while its body
    arrives. ``max_connections``: connections open at once; more are refused as they open.
    Raises ValueError for a value out of its bounds."""

    header_timeout_s: float = HEADER_TIMEOUT_S
    body_timeout_s: float = BODY_TIMEOUT_S
    max_connections: int = MAX_CONNECTIONS

    def __post_init__(self) -> None:
        check_timeout_s("header_timeout_s", self.header_timeout_s)
        check_timeout_s("body_timeout_s", self.body_timeout_s)
        check_count("max_connections", self.max_connections)

    @classmethod
    def of(cls, settings: Any) -> "ConnectionLimits":
        """The limits an app's settings carry (its ``header_timeout_s``, ``body_timeout_s``,
        ``max_connections``), read by attribute: this layer imports neither app."""
        return cls(settings.header_timeout_s, settings.body_timeout_s, settings.max_connections)
