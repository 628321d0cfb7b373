"""UpstreamGuard: upstream failures answered, recorded and logged the way a reverse proxy does.

- **Connect failures** (refused, DNS, TLS): mitmproxy answers 502 itself (with the `lazy`
  connection strategy, `hopmeter run`'s default); the guard names the cause from the hook that
  fired (`server_connect_error`, `tls_failed_server`) and the errno in its text, and hands it to
  the HopMeter addon for the record.
- **Timeouts**: one timer per flow, re-armed lazily. The flow moves through three phases:
  connecting (TCP and TLS, `hopmeter_connect_timeout`), waiting for the response headers, and
  the body (both `hopmeter_read_timeout`, the longest silence allowed). Only a body that comes
  through hopmeter's tap is watched: one that mitmproxy buffers shows nothing until it is whole,
  so its silence is left to mitmproxy's `tcp_timeout`. A chunk only stores its
  time (`ResponseTap.last_s`); when the timer comes due it compares that time with the limit and
  either re-arms once or acts: before headers it answers 504 (`answer_and_close`), after them it
  cuts the stream (`upstream_idle`). mitmproxy itself has no connect timeout (a dropped SYN waits
  ~2 minutes for the kernel) and no read timeout but its per-connection `tcp_timeout`.
- **Logging**: one line for the first failure of each cause, then one per interval (`CauseLog`).
- **Readiness**: each failure to connect makes that upstream not ready at once, each response
  makes it ready (hopmeter.proxy.addon.readiness).

Measured on this project's VM (docs/reliability.md §3): with a 1.5 s read timeout the 504 came at
1.51 s; a 600 s timeout costs a normal stream one `call_later` and one `cancel`.

The clock and the timers are the constructor's (hopmeter.clock: the monotonic clock and the
running loop by default); tests hand in a `hopmeter.testing.ManualClock` and advance it.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Protocol

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from hopmeter.clock import MONOTONIC, Clock, TimerHandle, Timers, timers_or_loop
from hopmeter.core.upstream import CAUSE_FIXES, STATUS_SENT, UpstreamFailure
from hopmeter.core.vocab import Ended
from hopmeter.errors import UsageError
from hopmeter.log import get_logger
from hopmeter.proxy import options
from hopmeter.proxy.addon.browser_gate import answered_here
from hopmeter.proxy.addon.failures import (
    CANCELLED,
    CauseLog,
    address_text,
    answer_and_close,
    connect_cause,
    http1_client,
)
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.addon.tap import ResponseTap

log = get_logger()

CONNECT, HEADERS, BODY = "connect", "headers", "body"  # a watched flow's phases, in order
# How long a client connection the guard closed is remembered: mitmproxy tears the upstream side
# down after `client_disconnected`, and that teardown's errors are not upstream failures.
FORGET_CLOSED_S = 5.0
# how long after a client's `client_disconnected` its flows still waiting for an upstream are
# ended by hopmeter (mitmproxy ends the others by then: `client_disconnected`)
ORPHAN_WAIT_S = 1.0


@dataclass(slots=True, eq=False)
class Watch:
    """One flow's timer: its phase and its last sign of life."""

    flow: http.HTTPFlow
    phase: str
    last_s: float  # monotonic: the phase's start, or the body's last chunk (see `_last`)
    handle: TimerHandle | None = None
    due_s: float = 0.0  # when `handle` fires
    tap: ResponseTap | None = None


class Measured(Protocol):
    """What the guard needs of the measuring addon (HopMeter): whether it stopped measuring, and
    where to say why an upstream failed a flow."""

    stopped: bool

    def upstream_failed(self, flow: http.HTTPFlow, failure: UpstreamFailure) -> None: ...

    def internal_error(self, where: str, exc: BaseException | None = None) -> None: ...

    def orphaned(self, flow: http.HTTPFlow) -> None: ...


class UpstreamGuard:
    """Names why an upstream failed a flow, enforces the connect and read timeouts, answers 504."""

    def __init__(
        self,
        meter: Measured,
        readiness: Readiness | None = None,
        *,
        clock: Clock = MONOTONIC,
        timers: Timers | None = None,
    ) -> None:
        self.meter = meter
        self.clock = clock
        self.timers = timers  # None: the running loop's
        self.readiness = readiness
        self.watches: dict[str, Watch] = {}  # flow id -> its watch
        self.by_client: dict[str, set[str]] = {}  # client connection id -> flow ids watched
        self.closed: set[str] = set()  # client connections a timeout of ours closed
        self.causes = CauseLog(timers=timers)
        self.connect_timeout_s: float = options.default("hopmeter_connect_timeout")
        self.read_timeout_s: float = options.default("hopmeter_read_timeout")
        self.unanswered = 0  # failures with no flow to answer (the eager connection strategy)

    # -- options -------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        options.declare(loader, options.GUARD)

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        try:
            if "hopmeter_connect_timeout" in updated:
                self.connect_timeout_s = options.read(opts, "hopmeter_connect_timeout")
            if "hopmeter_read_timeout" in updated:
                self.read_timeout_s = options.read(opts, "hopmeter_read_timeout")
            if "hopmeter_failure_log_interval" in updated:
                self.causes.interval_s = options.read(opts, "hopmeter_failure_log_interval")
        except UsageError as exc:
            raise exceptions.OptionsError(str(exc)) from None

    def running(self) -> None:
        opts = ctx.options
        if not opts.server:  # `mitmdump -n` (reading a file, say): no proxy, nothing to warn of
            return
        # eager connects when a client connects, to an address known then (reverse, transparent,
        # socks5, ...); a regular or upstream proxy learns it from the request, and answers 502
        modes = {str(m).split(":", 1)[0].split("@", 1)[0] for m in opts.mode}
        if opts.connection_strategy == "eager" and modes - {"regular", "upstream"}:
            log.warning(
                "hopmeter: connection_strategy is eager: a client whose upstream cannot be "
                "reached gets its connection closed unanswered, with no record; "
                "--set connection_strategy=lazy answers 502 and records why"
            )
        if opts.tcp_timeout < self.read_timeout_s:
            log.warning(
                "hopmeter: mitmproxy's tcp_timeout is below hopmeter_read_timeout: a silent "
                "upstream ends as an empty reply at tcp_timeout; raise tcp_timeout",
                tcp_timeout=opts.tcp_timeout,
                read_timeout=self.read_timeout_s,
            )

    def done(self) -> None:
        for watch in self.watches.values():
            if watch.handle is not None:
                watch.handle.cancel()
        self.watches.clear()
        self.by_client.clear()
        self.causes.close()

    # -- a flow's phases -----------------------------------------------------------------------
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not flow.live or flow.request.method == "CONNECT" or self.meter.stopped:
            return
        if answered_here(flow):
            return  # hopmeter answers it itself: no upstream to wait for
        watch = Watch(flow=flow, phase=CONNECT, last_s=self.clock())
        self.watches[flow.id] = watch
        self.by_client.setdefault(flow.client_conn.id, set()).add(flow.id)
        self._arm(watch, watch.last_s + self.connect_timeout_s)

    def request(self, flow: http.HTTPFlow) -> None:
        # The request is forwarded whole: the upstream's turn. A request on a kept-alive upstream
        # connection gets no server_connected; by now flow.server_conn is that connection (at
        # requestheaders it was an unconnected placeholder).
        watch = self.watches.get(flow.id)
        if watch is not None and watch.phase != BODY and flow.server_conn.connected:
            self._enter(watch, HEADERS)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        watch = self.watches.get(flow.id)
        if watch is None or flow.response is None:
            return
        if self.readiness is not None:
            self.readiness.succeeded(flow.server_conn.address)
        stream = flow.response.stream  # the HopMeter addon's tap: it runs before this addon
        if not isinstance(stream, ResponseTap):
            # mitmproxy buffers this body (hopmeter does not measure it, or left it to
            # mitmproxy): no chunk comes by until it is whole, so a slow body could not be told
            # from a silent one. Its silence is mitmproxy's tcp_timeout's, which `hopmeter run`
            # keeps above the read timeout.
            self._forget(flow)
            return
        watch.tap = stream
        self._enter(watch, BODY)

    def response(self, flow: http.HTTPFlow) -> None:
        self._forget(flow)

    def error(self, flow: http.HTTPFlow) -> None:
        self._forget(flow)

    def client_disconnected(self, client: Any) -> None:
        timers = timers_or_loop(self.timers)
        if client.id in self.closed:
            timers.call_later(FORGET_CLOSED_S, self.closed.discard, client.id)
        if client.id in self.by_client:
            # mitmproxy ends what it will of the client's flows as it closes the client's
            # upstream connections, right after this hook; one still waiting for its upstream a
            # moment later gets no hook any more (an HTTP/2 stream queued for an upstream
            # connection when a relay cut the client's): ended then, its watch forgotten
            timers.call_later(ORPHAN_WAIT_S, self._orphans, client.id)

    def _orphans(self, client_id: str) -> None:
        for watch in self._of_client(client_id):
            try:
                self._forget(watch.flow)
                self.meter.orphaned(watch.flow)
            except Exception as exc:
                with contextlib.suppress(Exception):
                    self.meter.internal_error("guard", exc)

    # -- the upstream connection ---------------------------------------------------------------
    def server_connected(self, data: Any) -> None:
        if not data.server.tls:  # with TLS, connecting ends at tls_established_server
            self._connected(data.client)

    def tls_established_server(self, data: Any) -> None:
        self._connected(data.context.client)

    def server_connect_error(self, data: Any) -> None:
        message = data.server.error or ""
        if message == CANCELLED:
            return  # cancelled because the client left or a timeout of ours closed it
        cause, name = connect_cause(message)
        self._failed(data.client, cause, f"{name} {address_text(data.server.address)}", data)

    def tls_failed_server(self, data: Any) -> None:
        detail = f"{data.conn.error} {address_text(data.conn.address)}"
        self._failed(data.context.client, Ended.TLS_FAILED, detail, data)

    # -- internals -----------------------------------------------------------------------------
    def _connected(self, client: Any) -> None:
        for watch in self._of_client(client.id):
            if watch.phase == CONNECT:
                self._enter(watch, HEADERS)

    def _failed(self, client: Any, cause: Ended, detail: str, data: Any) -> None:
        if client.id in self.closed or client.timestamp_end is not None:
            return  # the client left (or we closed it) first: the upstream side is torn down
        waiting = [w for w in self._of_client(client.id) if w.flow.response is None]
        # mitmproxy answers each waiting flow 502 itself, over HTTP/1 and HTTP/2 alike
        answered = bool(waiting)
        failure = UpstreamFailure(
            cause=cause, detail=detail, status_sent=STATUS_SENT[cause] if answered else None
        )
        for watch in waiting:
            self.meter.upstream_failed(watch.flow, failure)
        if not waiting:
            self.unanswered += 1  # eager strategy: no request was read, nothing to answer
        if self.readiness is not None:
            server = getattr(data, "server", None) or getattr(data, "conn", None)
            self.readiness.failed(getattr(server, "address", None), cause, detail)
        self._log(failure, "answered 502" if answered else "connection closed unanswered")

    def _log(self, failure: UpstreamFailure, outcome: str) -> None:
        self.causes.report(
            failure.cause,
            f"hopmeter: upstream {failure.cause} ({failure.detail}); {outcome}. "
            f"{CAUSE_FIXES[failure.cause]}",
        )

    def _of_client(self, client_id: str) -> list[Watch]:
        ids = self.by_client.get(client_id, ())
        return [self.watches[i] for i in ids if i in self.watches]

    def _forget(self, flow: http.HTTPFlow) -> None:
        watch = self.watches.pop(flow.id, None)
        if watch is None:
            return
        if watch.handle is not None:
            watch.handle.cancel()
        ids = self.by_client.get(flow.client_conn.id)
        if ids is not None:
            ids.discard(flow.id)
            if not ids:
                del self.by_client[flow.client_conn.id]

    def _limit(self, watch: Watch) -> float:
        return self.connect_timeout_s if watch.phase == CONNECT else self.read_timeout_s

    def _last(self, watch: Watch) -> float:
        tap = watch.tap
        return max(watch.last_s, tap.last_s) if tap is not None else watch.last_s

    def _enter(self, watch: Watch, phase: str) -> None:
        """Start a phase; re-arm only if its deadline comes before the armed one (a few times
        per flow at most: otherwise the timer is re-armed lazily when it comes due)."""
        watch.phase, watch.last_s = phase, self.clock()
        deadline = watch.last_s + self._limit(watch)
        if watch.handle is None or deadline < watch.due_s:
            if watch.handle is not None:
                watch.handle.cancel()
            self._arm(watch, deadline)

    def _arm(self, watch: Watch, deadline: float) -> None:
        watch.due_s = deadline
        watch.handle = timers_or_loop(self.timers).call_later(
            deadline - self.clock(), self._fire, watch
        )

    def _fire(self, watch: Watch) -> None:
        """The timer came due: re-arm if there was life since, else act on the silence. A fault
        is counted (`internal_errors{where="guard"}`); one in telling whether the timeout came
        leaves the flow alone (the timer tries again a limit later), one in acting on it still
        closes the client's connection: a silent upstream must not hold the client for good."""
        try:
            self._due(watch)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.meter.internal_error("guard", exc)
            if watch.handle is None and self.watches.get(watch.flow.id) is watch:
                with contextlib.suppress(Exception):
                    self._arm(watch, self.clock() + self._limit(watch))

    def _due(self, watch: Watch) -> None:
        watch.handle = None
        if self.watches.get(watch.flow.id) is not watch:
            return
        flow = watch.flow
        deadline = self._last(watch) + self._limit(watch)
        if self.clock() < deadline:
            self._arm(watch, deadline)
            return
        if watch.phase == CONNECT and flow.server_conn.connected:
            # a reused upstream connection (no server_connected) whose request is still
            # uploading: from now on the read timeout applies
            self._enter(watch, HEADERS)
            return
        if watch.phase == HEADERS and flow.request.timestamp_end is None:
            # the client is still sending its request: the upstream is waiting, not silent
            # (mitmproxy's tcp_timeout guards a client that stops sending)
            self._enter(watch, HEADERS)
            return
        try:
            self._timed_out(watch)
        except Exception as exc:
            with contextlib.suppress(Exception):
                self.meter.internal_error("guard", exc)
            with contextlib.suppress(Exception):  # the timeout came: it still ends the flow
                answer_and_close(watch.flow, None, "guard", "hopmeter: upstream timed out")

    def _timed_out(self, watch: Watch) -> None:
        flow = watch.flow
        limit = self._limit(watch)
        server = flow.server_conn
        what = "silent"
        if watch.phase == CONNECT:
            cause = Ended.CONNECT_TIMEOUT
            if server.tls and server.timestamp_tcp_setup is not None and not server.tls_established:
                # the connection was accepted, the TLS handshake never answered: most often an
                # https:// upstream URL for a plain-HTTP port, whose server waits for a request
                cause, what = Ended.TLS_FAILED, "TLS handshake unanswered"
        elif watch.phase == HEADERS:
            cause = Ended.UPSTREAM_TIMEOUT
        else:
            cause = Ended.UPSTREAM_IDLE
        address = flow.server_conn.address or (flow.request.host, flow.request.port)
        before_headers = flow.response is None
        answered = before_headers and http1_client(flow)
        failure = UpstreamFailure(
            cause=cause,
            detail=f"{what} {limit:g}s {address_text(address)}",
            status_sent=STATUS_SENT[cause] if answered else None,
            timeout_s=limit,
        )
        self.meter.upstream_failed(flow, failure)
        if watch.phase == CONNECT and self.readiness is not None:
            self.readiness.failed(address, cause, failure.detail)
        self.closed.add(flow.client_conn.id)
        status = failure.status_sent
        message = f"hopmeter: upstream {cause} after {limit:g}s ({address_text(address)})"
        answer_and_close(flow, status, cause, message)
        if status is not None:
            self._log(failure, f"answered {status}")
        else:
            self._log(failure, "connection closed" if before_headers else "stream cut")
