"""Drain: on SIGTERM, stop taking new work and let the streams in flight finish.

`hopmeter run` only (it owns the process's signals; a user's own mitmdump keeps mitmproxy's).
The first SIGTERM or SIGINT:
1. marks the proxy not ready (/readyz answers 503) and closes every listening socket, so a new
   connection is refused (`server=False`: Proxyserver stops its servers; connections already
   accepted stay open);
2. closes client connections that sit idle between requests (keep-alive), as nginx does on a
   graceful shutdown, and answers every response that starts from now on with
   `Connection: close` (HTTP/1), so each connection closes after its current response;
3. waits until no flow is in flight (nor a WebSocket open), or `hopmeter_drain_timeout`
   seconds, then stops the master; the HopMeter addon records what is still in flight as ended
   `shutdown`, and the outputs write what they hold until the same deadline
   (hopmeter.proxy.addon.outlets: past it, what is left is counted lost and said).
A second signal stops at once, with the same records.

The clock and the timers are the constructor's (hopmeter.clock; tests advance a ManualClock).
"""

from __future__ import annotations

import asyncio

from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from hopmeter.clock import MONOTONIC, Clock, Timers, sleep
from hopmeter.errors import UsageError
from hopmeter.export.outlets import Outlets
from hopmeter.log import get_logger
from hopmeter.proxy import options
from hopmeter.proxy.addon.failures import http1_client
from hopmeter.proxy.addon.meter import HopMeter
from hopmeter.proxy.addon.readiness import Readiness
from hopmeter.proxy.fastpath.internals import connection_handlers

log = get_logger()

# How often the drain looks whether the flows in flight have finished: a drain lasts seconds,
# and the look is one len(); 50 ms adds at most that to a drain.
POLL_S = 0.05


class Drain:
    """Graceful drain on the first SIGTERM/SIGINT; an immediate stop on the second."""

    def __init__(
        self,
        meter: HopMeter,
        readiness: Readiness | None = None,
        outlets: Outlets | None = None,
        *,
        clock: Clock = MONOTONIC,
        timers: Timers | None = None,
    ) -> None:
        self.meter = meter
        self.clock = clock
        self.timers = timers  # the looks at the flows in flight; None: the running loop's
        self.readiness = readiness
        self.outlets = outlets  # told the drain's deadline, to write what they hold by then
        self.draining = False
        self.task: asyncio.Task[None] | None = None
        self.idle_closed = 0
        self.timeout_s: float = options.default("hopmeter_drain_timeout")
        # client connections carrying a WebSocket: busy, though no HTTP flow is in flight
        self.websockets: set[str] = set()

    def load(self, loader: Loader) -> None:
        options.declare(loader, options.DRAIN)

    def configure(self, updated: set[str]) -> None:
        if "hopmeter_drain_timeout" in updated:
            try:
                self.timeout_s = options.read(ctx.options, "hopmeter_drain_timeout")
            except UsageError as exc:
                raise exceptions.OptionsError(str(exc)) from None

    def signal(self) -> None:
        """The event loop's handler for SIGTERM and SIGINT."""
        if self.draining:
            log.warning("hopmeter: second signal: stopping now; flows in flight end as shutdown")
            if self.outlets is not None:
                self.outlets.flush_by = self.clock()
            ctx.master.shutdown()
            return
        self.draining = True
        if self.readiness is not None:
            self.readiness.draining = True
        self.task = asyncio.get_running_loop().create_task(self._drain(self.clock()))

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # HTTP/1: the connection closes after this response (mitmproxy's mark_done reads it).
        # HTTP/2 forbids the header; a 101 must keep its Connection: Upgrade.
        response = flow.response
        if not self.draining or response is None or response.status_code == 101:
            return
        if http1_client(flow):
            response.headers["connection"] = "close"

    def websocket_start(self, flow: http.HTTPFlow) -> None:
        self.websockets.add(flow.client_conn.id)

    def websocket_end(self, flow: http.HTTPFlow) -> None:
        self.websockets.discard(flow.client_conn.id)

    def in_flight(self) -> int:
        """HTTP flows in flight and WebSocket connections open: what the drain waits for."""
        return self.meter.in_flight() + len(self.websockets)

    async def _drain(self, started_s: float) -> None:
        timeout_s = self.timeout_s
        if self.outlets is not None:
            self.outlets.flush_by = started_s + timeout_s
        ctx.options.update(server=False)  # Proxyserver closes the listening sockets
        self._close_idle()
        log.warning(
            f"hopmeter: draining: no longer accepting connections; {self.in_flight()} "
            f"flows in flight, {self.idle_closed} idle connections closed; stopping when they "
            f"finish or in {timeout_s:g}s (a second signal stops now)"
        )
        deadline = started_s + timeout_s
        while self.in_flight() and self.clock() < deadline:
            await sleep(POLL_S, self.timers)
        left = self.in_flight()
        if left:
            log.warning(
                f"hopmeter: drain timeout after {timeout_s:g}s: ending {left} flows still in "
                f"flight (recorded as shutdown)"
            )
        else:
            log.warning(f"hopmeter: drained in {self.clock() - started_s:.1f}s")
        ctx.master.shutdown()

    def _close_idle(self) -> None:
        """Close every client connection that has no flow in flight (kept alive, idle)."""
        handlers = connection_handlers()
        if handlers is None:
            return
        busy = self.meter.busy_clients() | self.websockets
        for handler in list(handlers.values()):
            client = handler.client
            if client.id not in busy and client in handler.transports:
                handler.close_connection(client)
                self.idle_closed += 1
