"""`hopmeter join --serve`: the running join service.

Spans come in over OTLP/HTTP (and OTLP/gRPC when asked) and go into one `JoinWindow`; every pair
the window makes ready is aligned with hopmeter.core.hops.align right after the sender has its
answer, observed into `hopmeter_hold_seconds{segment}` and `hopmeter_segment_findings_total`, and
written as one joined line (`hopmeter.join/1`: the trace id and its segment, as
`hopmeter join --json` writes them). One event loop does it all: decoding is CPU-bound and
threads would not add throughput; more throughput is more instances, sharded by trace id
(docs/fleet.md). The joined lines and the log lines are written off the loop, each by its
output's thread (hopmeter.export.outlets): a full disk or a stalled reader costs lines, counted
on /metrics, never the receivers' time. SIGHUP reopens the records file (after a rotation).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from hopmeter.core.hops import Segment, align, unordered
from hopmeter.core.order import HopOrder
from hopmeter.core.spans import SpanView, read_span
from hopmeter.core.vocab import SegmentOrder, SpanOutcome
from hopmeter.errors import PortError, UsageError
from hopmeter.export.join_metrics import JoinCounts, JoinMetrics
from hopmeter.export.outlets import STDERR, LineLogHandler, Outlets
from hopmeter.export.prometheus import Metrics, new_registry
from hopmeter.export.server import MetricsServer, serve
from hopmeter.join.grpc import CODE_NAMES, GrpcReceiver
from hopmeter.join.http import HttpReceiver
from hopmeter.join.window import JoinWindow, Pair
from hopmeter.log import get_logger
from hopmeter.pidfile import REOPEN_SIGNALS

log = get_logger()

JOIN_SCHEMA = "hopmeter.join/1"
TICKS_PER_WINDOW = 10  # the window is checked for ended traces ten times per window...
MAX_TICK_S = 1.0  # ...and at least once a second
LISTEN_BACKLOG = 1024  # senders connect in bursts when their batches fire together
CLOSE_TIMEOUT_S = 2.0  # at a stop, how long handlers of closed connections get to end
# partial_success's error_message, by what was rejected
MALFORMED_WHY = (
    "{n} malformed: absurd ids, hop name, start time or hopmeter.timeline arrays (not retried)"
)
OVERFLOW_WHY = (
    "{n} refused: with it, its trace's timelines would hold more than --max-events {max} "
    "events; raise --max-events"
)
FLUSH_S = 5.0  # at stop, the joined lines still queued get this long to be written


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """What `hopmeter join --serve` was asked to do, validated."""

    http: tuple[str, int]
    grpc: tuple[str, int] | None
    metrics: tuple[str, int] | None
    records: str  # "" for none, "-" for stdout
    window_s: float
    max_traces: int
    max_events: int
    order: tuple[str, ...] = ()  # --order: the hops outermost first, for spans no link joins


class JoinService:
    """The window, its metrics and its records, fed by the receivers (their `Intake`)."""

    def __init__(self, cfg: ServeConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.window = JoinWindow(
            window_s=cfg.window_s,
            max_traces=cfg.max_traces,
            max_events=cfg.max_events,
            order=HopOrder(cfg.order),
        )
        self.clock = clock
        self.metrics = Metrics(new_registry())
        self.requests: Counter[tuple[str, str]] = Counter()
        for status in ("200", "400", "413", "415"):
            self.requests["http", status] += 0
        for name in CODE_NAMES.values():
            self.requests["grpc", name] += 0
        self.segments = {"true": 0, "false": 0}
        self.orders = dict.fromkeys(SegmentOrder, 0)  # segments written, by how ordered
        self.outlets = Outlets()
        self.records = self.outlets.open("records", cfg.records) if cfg.records else None
        self.metrics.watch_outputs(self.outlets.states)
        JoinMetrics(self.metrics.registry, self.counts)

    # -- Intake ----------------------------------------------------------------------------------
    def accept(self, spans: list[SpanView]) -> tuple[int, str]:
        """File each span; (spans rejected as absurd, why) for the sender's partial_success."""
        now = self.clock()
        malformed = overflow = failed = 0
        for view in spans:
            try:
                span = read_span(view)
                if isinstance(span, SpanOutcome):
                    self.window.count(span)
                    malformed += span is SpanOutcome.MALFORMED
                elif self.window.add(span, now) is SpanOutcome.OVERFLOW:
                    overflow += 1
            except Exception as exc:  # a bug in reading one span must not lose the others
                failed += 1
                self._internal_error("join_accept", exc)
        why = [MALFORMED_WHY.format(n=malformed)] if malformed else []
        why += [OVERFLOW_WHY.format(n=overflow, max=self.window.max_events)] if overflow else []
        why += [f"{failed} not read: an internal error, counted"] if failed else []
        return malformed + overflow + failed, "; ".join(why)

    def settle(self) -> None:
        """Align every pair the window made ready; observe and write each segment."""
        for pair in self.window.take_ready():
            trace_id = pair.trace_id.hex()
            try:
                segment = _segment(pair)
                self.metrics.observe_segment(segment, trace_id)
            except Exception as exc:  # a bug in measuring must not stop the service
                self._internal_error("join_align", exc)
                continue
            self.orders[pair.order] += 1
            if segment.ordered:
                self.segments["true" if pair.linked else "false"] += 1
            line = {
                "schema": JOIN_SCHEMA,
                "trace_id": trace_id,
                "linked": pair.linked,
                "hops": [segment.as_dict()],
            }
            if self.records is not None:
                self.records.put(orjson.dumps(line) + b"\n")

    def answered(self, transport: str, status: str) -> None:
        """Count one request answered."""
        self.requests[transport, status] += 1

    # -- the rest --------------------------------------------------------------------------------
    def tick(self) -> None:
        """End the traces whose window passed (chaining unlinked ones) and write their segments."""
        try:
            self.window.expire(self.clock())
        except Exception as exc:  # the service goes on; the counter says something is wrong
            self._internal_error("join_expire", exc)
        self.settle()
        for line in self.outlets.report(time.monotonic()):  # a loss, at most once a minute
            log.warning(line)

    def reopen(self) -> None:
        """Open the records file again at its path (SIGHUP, after a rotation)."""
        for path in self.outlets.reopen():
            log.warning(f"hopmeter join: reopening {path} (SIGHUP or SIGUSR1)")

    def stop(self) -> None:
        """End every trace still waiting (counted lost), write what is queued (for FLUSH_S at
        most) and say what could not be."""
        self.window.close(self.clock())
        self.settle()
        self.outlets.close(time.monotonic() + FLUSH_S, say=log.error)

    @property
    def lost_records(self) -> int:
        """Joined lines that could not be written (hopmeter_output_lost_lines_total)."""
        records = self.records
        return records.counts.lost_total() if records is not None else 0

    def counts(self) -> JoinCounts:
        """A snapshot of the counters (read by the metrics endpoint's thread)."""
        window = self.window
        return JoinCounts(
            requests=dict(self.requests),
            spans={str(k): n for k, n in window.spans.items()},
            traces={str(k): n for k, n in window.traces.items()},
            segments=dict(self.segments),
            orders={str(k): n for k, n in self.orders.items()},
            out_of_order=window.out_of_order,
            window_traces=window.held_traces,
            window_events=window.held_events,
            window_tombstones=window.held_tombstones,
        )

    def _internal_error(self, where: str, exc: Exception) -> None:
        """Count a bug caught in the service (hopmeter_internal_errors_total) and log it."""
        self.metrics.internal_error(where)
        log.error(
            "hopmeter join: internal error, the service goes on", where=where, error=repr(exc)
        )


def _segment(pair: Pair) -> Segment:
    """The segment of a pair: aligned, or unordered when nothing said which hop is outer."""
    if pair.order == SegmentOrder.UNKNOWN:
        return unordered(pair.outer.view(), pair.inner.view())
    return dataclasses.replace(align(pair.outer.view(), pair.inner.view()), order=pair.order)


def run(cfg: ServeConfig) -> int:
    """Serve until SIGINT or SIGTERM; 0 after a clean stop."""
    try:
        service = JoinService(cfg)
    except OSError as exc:
        raise UsageError(
            f"cannot write joined records to {cfg.records}: {exc.strerror}; pick a writable "
            "path with --records"
        ) from None
    try:
        server = serve(service.metrics, *cfg.metrics) if cfg.metrics is not None else None
    except PortError:
        service.stop()
        raise
    # the service owns this process: its log lines (warnings and errors, as before) go to
    # standard error through an output of its own, never written by the loop
    handler = LineLogHandler(service.outlets.open("log", STDERR), logging.WARNING)
    logging.getLogger("hopmeter").addHandler(handler)
    try:
        asyncio.run(_serve(service, cfg, server))
    finally:
        if server is not None:
            server.close()
        logging.getLogger("hopmeter").removeHandler(handler)
    return 0


async def _serve(service: JoinService, cfg: ServeConfig, metrics: MetricsServer | None) -> None:
    http = HttpReceiver(service)
    servers = [await _listen(http.serve, cfg.http, "--listen")]
    receivers: list[HttpReceiver | GrpcReceiver] = [http]
    where = [f"OTLP/HTTP on http://{_show(servers[0])}/v1/traces"]
    if cfg.grpc is not None:
        grpc = GrpcReceiver(service)
        receivers.append(grpc)
        servers.append(await _listen(grpc.serve, cfg.grpc, "--grpc"))
        where.append(f"OTLP/gRPC on {_show(servers[1])}")
    if metrics is not None:
        where.append(f"metrics on {metrics.url}")
    print(f"hopmeter join: {'; '.join(where)}; window {cfg.window_s:g} s", file=sys.stderr)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stopping.set)
    for sig in REOPEN_SIGNALS:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, service.reopen)
    every_s = min(MAX_TICK_S, cfg.window_s / TICKS_PER_WINDOW)
    try:
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), every_s)
            service.tick()
    finally:
        for server in servers:
            server.close()
        for receiver in receivers:  # exporters keep connections open: each handler ends itself
            await receiver.connections.close(CLOSE_TIMEOUT_S)
        service.stop()
        _say_goodbye(service)


async def _listen(
    handler: Callable[..., object], address: tuple[str, int], flag: str
) -> asyncio.Server:
    host, port = address
    try:
        return await asyncio.start_server(handler, host, port, backlog=LISTEN_BACKLOG)  # type: ignore[arg-type]
    except OSError as exc:
        raise PortError(
            f"cannot listen on {host}:{port} ({exc.strerror}); choose another with {flag} HOST:PORT"
        ) from None


def _show(server: asyncio.Server) -> str:
    host, port = server.sockets[0].getsockname()[:2]
    return f"[{host}]:{port}" if ":" in str(host) else f"{host}:{port}"


def _say_goodbye(service: JoinService) -> None:
    counts = service.counts()
    spans = " ".join(f"{k}={v}" for k, v in counts.spans.items() if v)
    traces = " ".join(f"{k}={v}" for k, v in counts.traces.items() if v)
    print(
        f"hopmeter join: stopped; spans: {spans or 'none'}; traces: {traces or 'none'}",
        file=sys.stderr,
    )
