"""guarded_h11: uvicorn's h11 protocol with ConnectionLimits enforced on every connection.

Invariants: a connection beyond ``max_connections`` open ones is answered 503 and closed as it
opens, never read and never counted; a request's header must be complete within
``header_timeout_s`` of its first byte (of the connection's start, for its first request); while
its body arrives no pause may exceed ``body_timeout_s`` (a pause the server causes, not reading
because the app has not asked for more, never counts); a request out of time gets a plain 408
when no response to it has started (a connection that sent nothing just closes), its connection
closes, and an app still waiting for its body sees a disconnect. An idle keep-alive connection
stays uvicorn's (``timeout_keep_alive``). One timer per connection: a read that moves its
deadline later only notes it (the timer re-arms itself when it fires early), so a body's reads
cost no timer churn; a deadline moved earlier (the body's after the header's) re-arms it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from chunkstore.http.connection_limits import ConnectionLimits

log = logging.getLogger("chunkstore.http")

NOTICE_INTERVAL_S = 10.0  # at most one log line per kind of closing in this time: a flood must not flood the log


def plain_response(status: str, text: str, *headers: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, written before or instead of the app's."""
    body = (text + "\n").encode()
    head = [f"HTTP/1.1 {status}", "content-type: text/plain; charset=utf-8", f"content-length: {len(body)}",
            "connection: close", *headers]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


class Tally:
    """Counts closings of one kind and logs them at most once per NOTICE_INTERVAL_S, each line with
    how many since the previous one (the last ones are logged when the interval is over)."""

    def __init__(self, message: str) -> None:
        self.message = message  # with one %d: the count
        self.count = 0
        self._logged_at_s: float | None = None
        self._flush: asyncio.TimerHandle | None = None

    def add(self, loop: asyncio.AbstractEventLoop) -> None:
        self.count += 1
        now_s = loop.time()
        if self._logged_at_s is None or now_s - self._logged_at_s >= NOTICE_INTERVAL_S:
            self._log(now_s)
        elif self._flush is None:
            self._flush = loop.call_at(self._logged_at_s + NOTICE_INTERVAL_S, self._log_pending, loop)

    def _log_pending(self, loop: asyncio.AbstractEventLoop) -> None:
        self._flush = None
        if self.count:
            self._log(loop.time())

    def _log(self, now_s: float) -> None:
        log.warning(self.message, self.count)
        self.count, self._logged_at_s = 0, now_s


class GuardedH11Protocol(H11Protocol):
    """Build one class per server with ``guarded_h11(limits)``: uvicorn makes a protocol per
    connection from the class it is given, and the class carries the limits and the tallies."""

    limits: ClassVar[ConnectionLimits] = ConnectionLimits()
    refused: ClassVar[Tally]
    header_timeouts: ClassVar[Tally]
    body_timeouts: ClassVar[Tally]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._is_refused = False
        self._timer: asyncio.TimerHandle | None = None
        self._deadline_s: float | None = None
        self._header_since_s: float | None = None  # when the header being read began
        self._last_read_s = 0.0  # the last read, or when reading resumed: the client's clock starts there

    # -- uvicorn's protocol, with the limits -------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._is_refused = True
            transport.write(plain_response("503 Service Unavailable", f"too many open connections "
                                           f"({self.limits.max_connections}); retry later", "retry-after: 1"))
            transport.close()
            self.refused.add(self.loop)
            return
        super().connection_made(transport)
        self._header_since_s = self._last_read_s = self.loop.time()
        self._watch()

    def data_received(self, data: bytes) -> None:
        if self._is_refused:
            return
        self._last_read_s = self.loop.time()
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        # Reading resumes now: bytes of a next request that came while it was paused (pipelined)
        # were waiting on the server, not the client.
        self._last_read_s = self.loop.time()
        super().on_response_complete()  # may start a pipelined request, or wait as keep-alive
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timer()
        if not self._is_refused:
            super().connection_lost(exc)

    # -- deadlines ---------------------------------------------------------------------------------

    def _watch(self) -> None:
        """Set the deadline the request's state calls for: its header's, its body's, or none."""
        if self.transport.get_protocol() is not self:  # upgraded (a websocket): no longer HTTP's
            return self._cancel_timer()
        state = self.conn.their_state
        if state is h11.IDLE:
            if self._header_since_s is None and self.conn.trailing_data[0]:  # a next request's first bytes
                self._header_since_s = self._last_read_s
            started = self._header_since_s
            self._deadline_s = None if started is None else started + self.limits.header_timeout_s
        else:
            self._header_since_s = None
            self._deadline_s = self._last_read_s + self.limits.body_timeout_s if state is h11.SEND_BODY else None
        if self._deadline_s is None:
            self._cancel_timer()
        elif self._timer is None or self._deadline_s < self._timer.when():  # a later one waits for the timer
            self._cancel_timer()
            self._timer = self.loop.call_at(self._deadline_s, self._on_deadline)

    def _on_deadline(self) -> None:
        self._timer = None
        if self._deadline_s is None or self.transport.is_closing():
            return
        now_s = self.loop.time()
        if self.conn.their_state is h11.SEND_BODY and self._is_server_holding_body():
            self._deadline_s = max(self._deadline_s, now_s + self.limits.body_timeout_s)
        if now_s < self._deadline_s:
            self._timer = self.loop.call_at(self._deadline_s, self._on_deadline)
            return
        self._time_out()

    def _is_server_holding_body(self) -> bool:
        """Whether the body waits on the server: reading paused until the app takes what came, or
        a client waiting for ``100 Continue`` until the app asks for the body."""
        return self.flow.read_paused or (self.cycle is not None and self.cycle.waiting_for_100_continue)

    def _time_out(self) -> None:
        is_header = self.conn.their_state is h11.IDLE
        cycle = None if is_header else self.cycle  # while a header is read, the cycle is the last request's
        if is_header and self.conn.trailing_data[0]:
            self.transport.write(plain_response("408 Request Timeout", f"the request header was not complete "
                                                f"within {self.limits.header_timeout_s:g} s"))
        elif not is_header and (cycle is None or not cycle.response_started):
            self.transport.write(plain_response("408 Request Timeout", f"the request body paused for more than "
                                                f"{self.limits.body_timeout_s:g} s"))
        if cycle is not None and not cycle.response_complete:
            cycle.disconnected = True  # the app's next receive() is http.disconnect, its sends are dropped
            cycle.message_event.set()
        self.transport.close()
        (self.header_timeouts if is_header else self.body_timeouts).add(self.loop)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def guarded_h11(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    """The protocol class to give uvicorn (``uvicorn.Config(http=...)``) for one server with ``limits``."""
    h = limits.header_timeout_s
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {
        "limits": limits,
        "refused": Tally(f"refused %d connection(s): {limits.max_connections} were open (--max-connections)"),
        "header_timeouts": Tally(f"closed %d connection(s) whose request header was not complete within {h:g} s "
                                 f"(--header-timeout-s)"),
        "body_timeouts": Tally(f"closed %d connection(s) whose request body paused for more than "
                               f"{limits.body_timeout_s:g} s (--body-timeout-s)"),
    })
