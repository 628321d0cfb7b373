"""Upstream failures, named, answered and logged: the helpers of hopmeter.proxy.addon.guard.

`connect_cause` names a failed connect from what mitmproxy hands its hooks; `answer_and_close`
answers a client whose upstream went silent (mitmproxy has no public way to); `CauseLog` logs the
first failure of each cause at once and then one line per interval, so a dead upstream under a
flood of requests costs a few log lines, not one per request.
"""

from __future__ import annotations

import errno
import re
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import orjson
from mitmproxy import http
from mitmproxy.net.http import http1

from hopmeter.clock import TimerHandle, Timers, timers_or_loop
from hopmeter.core.vocab import Ended
from hopmeter.log import get_logger
from hopmeter.proxy.fastpath.internals import connection_handlers

log = get_logger()

# mitmproxy gives hooks only `str(exc)` of a failed connect (proxy/server.py, open_connection);
# an OSError's text starts with its number, "[Errno 111] Connect call failed (...)": that number
# is the typed part left, so the cause is read from it, never from the English words.
_ERRNO = re.compile(r"\[Errno (-?\d+)\]")
# getaddrinfo's errors (socket.gaierror) are negative on glibc: -2 "Name or service not known".
_EAI = frozenset(
    getattr(socket, name)
    for name in ("EAI_NONAME", "EAI_AGAIN", "EAI_FAIL", "EAI_NODATA", "EAI_ADDRFAMILY")
    if hasattr(socket, name)
)
# mitmproxy's text for a connect it cancelled itself (the client left, or the guard closed it)
CANCELLED = "connection cancelled"
# Keys CauseLog keeps at once: the causes (seven) with room to spare; past it, lines are dropped
# to the count, never kept per key.
MAX_CAUSE_KEYS = 32


def connect_cause(message: str) -> tuple[Ended, str]:
    """(ending, errno name) of a failed upstream connect, from mitmproxy's error text."""
    found = _ERRNO.search(message)
    if found is None:
        return Ended.CONNECT_FAILED, "-"
    code = int(found.group(1))
    if code in _EAI:
        return Ended.DNS_FAILED, f"EAI{code}"
    name = errno.errorcode.get(code, str(code))
    if code == errno.ECONNREFUSED:
        return Ended.CONNECT_REFUSED, name
    # ETIMEDOUT here is the kernel giving up on the SYNs (~2 minutes on Linux): mitmproxy has
    # answered 502 already, so it is a failed connect, not the guard's own connect_timeout (504).
    return Ended.CONNECT_FAILED, name


def address_text(address: Any) -> str:
    """host:port, [v6]:port, or "?" when unknown."""
    if not address:
        return "?"
    host, port = address[0], address[1]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def error_body(status: int, cause: str, message: str) -> bytes:
    """An OpenAI-style error object: the shape LLM clients already parse and show."""
    return orjson.dumps({"error": {"message": message, "type": cause, "code": status}}) + b"\n"


def answer_and_close(
    flow: http.HTTPFlow,
    status: int | None,
    cause: str,
    message: str,
    headers: Mapping[str, str] | None = None,
) -> bool:
    """Answer `status` (with `headers` besides the usual two) on the flow's HTTP/1 client
    connection (if no response has started), then close that connection. False when there was
    no connection to close.

    mitmproxy has no public way to answer a flow that waits for its upstream (`flow.kill()` acts
    only at the next hook: mitmproxy issue 4711), so this takes the connection handler the
    Proxyserver addon keeps per client (`proxyserver.connections[client.id]`), writes to its
    `transports[client].writer` and calls its `close_connection(client)`, the path a layer's
    CloseConnection command takes. Closing the client makes mitmproxy end the flow (the `error`
    hook) and cancel the upstream connection or the connect in progress. An HTTP/2 client's
    connection is only closed: its streams cannot be answered one by one from here.
    """
    handlers = connection_handlers()
    handler = handlers.get(flow.client_conn.id) if handlers is not None else None
    if handler is None:
        return False
    client = flow.client_conn
    io = handler.transports.get(client)
    if io is None:
        return False
    writer = io.writer
    can_answer = writer is not None and not writer.is_closing() and http1_client(flow)
    if status is not None and flow.response is None and can_answer:
        assert writer is not None
        body = error_body(status, cause, message)
        fields = {"content-type": "application/json", "connection": "close", **(headers or {})}
        writer.write(http1.assemble_response(http.Response.make(status, body, fields)))
    handler.close_connection(client)
    return True


def http1_client(flow: http.HTTPFlow) -> bool:
    """Whether the client speaks HTTP/1 on this flow (an answer can be written as bytes)."""
    return flow.request.http_version in ("HTTP/1.1", "HTTP/1.0")


@dataclass(slots=True)
class _Burst:
    count: int  # failures since the last line
    first: str  # the first failure's line


class CauseLog:
    """Log the first failure of a cause at once; count the rest; one summary line per interval.

    Under a flood of N failures of one cause this logs one line, then one line per interval
    while the flood lasts, then nothing: a cause quiet for a whole interval is forgotten, so its
    next failure is news and logged at once. One timer serves every cause, and none runs while
    nothing fails.
    """

    def __init__(
        self,
        interval_s: float = 10.0,
        emit: Callable[[str], None] | None = None,
        *,
        timers: Timers | None = None,
    ) -> None:
        self.interval_s = interval_s
        self.emit = emit or _warn
        self.timers = timers  # None: the running loop's (hopmeter.clock)
        self.active: dict[str, _Burst] = {}
        self.timer: TimerHandle | None = None
        self.total = 0

    def report(self, cause: str, line: str) -> None:
        """One failure of `cause`, described by `line` (logged if it is the first)."""
        self.total += 1
        burst = self.active.get(cause)
        if burst is not None:
            burst.count += 1
            return
        if len(self.active) >= MAX_CAUSE_KEYS:
            return
        self.active[cause] = _Burst(0, line)
        self.emit(f"{line} (more of the same: one line per {self.interval_s:g}s)")
        if self.timer is None:
            try:
                timers = timers_or_loop(self.timers)
            except RuntimeError:  # no loop (offline tools, tests): no summaries
                return
            self.timer = timers.call_later(self.interval_s, self.flush)

    def flush(self) -> None:
        """The interval's summary: one line per cause that failed again."""
        self.timer = None
        for cause, burst in list(self.active.items()):
            if burst.count:
                self.emit(
                    f"hopmeter: upstream {cause}: {burst.count} more in the last "
                    f"{self.interval_s:g}s"
                )
                burst.count = 0
            else:
                del self.active[cause]  # quiet for an interval: its next failure is news
        if self.active:
            self.timer = timers_or_loop(self.timers).call_later(self.interval_s, self.flush)

    def close(self) -> None:
        """Stop the timer (the proxy is stopping)."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None


def _warn(line: str) -> None:
    log.warning(line)


def classify_error(message: str, client_open: bool = True) -> Ended:
    """How a flow that fired `error` ended, from mitmproxy's error message, and whether the
    client's connection was still open (an HTTP/2 client's close reads "peer closed connection",
    as an upstream's does)."""
    m = message.lower()
    if "client" in m or not client_open:
        return Ended.CLIENT_GONE
    if "server" in m or "reset" in m or "peer" in m or "closed" in m or "eof" in m:
        return Ended.UPSTREAM_RESET
    return Ended.ERROR
