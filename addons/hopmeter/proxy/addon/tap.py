"""The stream callables: the code that keeps hopmeter's promise never to hold or change a byte.

mitmproxy calls a message's `stream` callable once per HTTP/1 chunk, socket read or HTTP/2 DATA
frame, then once with b"" at the end, and writes what it returns to the other side right after
(docs/design.md §9). mitmproxy guards hooks but not this callable: an exception here silently
drops the chunk. So each tap here stamps the chunk, queues a reference to it for measuring, and
returns it unchanged; everything that can fail is caught, and what it calls on failure never raises.

Measuring is deferred (`MeasureQueue`): the chunk is written to the client first, measured about a
millisecond later with the time it was stamped, so nothing measured moves and no stream waits.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hopmeter.clock import MONOTONIC, Clock, Timers
from hopmeter.core.ledger import GONE, SENT
from hopmeter.core.meter import FlowMeter
from hopmeter.core.trace import TraceContext, parse_traceparent
from hopmeter.core.upstream import UpstreamFailure
from hopmeter.core.vocab import TraceReceived
from hopmeter.core.wire import detect_api, sniff_request
from hopmeter.errors import said
from hopmeter.proxy.addon.chaos import Chaos
from hopmeter.proxy.delivery.lane import LAG_FLOOR_S, STEP_FLOOR_S

if TYPE_CHECKING:
    from mitmproxy import http

    from hopmeter.proxy.addon.passage import FlowPassage
    from hopmeter.proxy.delivery.lane import FlowOut, LoopLog

# The request body is streamed to upstream as it arrives; its first bytes are kept on the side to
# read `model` and `stream` from a JSON body. 64 KiB holds the head of any chat request; a longer
# prompt is cut, and only the fields that appear before the cut are read.
REQUEST_SNIFF_BYTES = 64 * 1024
# Chunks are measured this long after the first of them was stamped (MeasureQueue.add).
# A batched decoder's tick reaches the proxy as one event per stream within about a millisecond:
# measuring after the whole tick is forwarded kept hopmeter's added delay p99 at 50 lockstep
# streams within ~5% of bare mitmproxy's, against ~12% when measuring on the next loop turn
# (bench/README.md); the CPU is the same either way.
MEASURE_DELAY_S = 0.001
# A flow's chunks that reached the client are packed from lists into arrays (core.ledger.
# FlowChunks) once this many are on their way: the measuring step does it, not the callable. A
# followed chunk is ~230 bytes as a list and 9-25 packed: 4 keeps ~1 KiB of lists per open stream
# of a client that keeps up (16 kept ~4 KiB, 64 ~15 KiB; the packing costs the same per chunk
# either way). Packing stops at the first chunk not yet seen sent, so a client that falls behind
# holds lists for what it has not taken (up to the 4,096 chunks a record lists).
PACK_AFTER_CHUNKS = 4

# Called with where a measuring step failed and the exception; must never raise.
OnError = Callable[[str, BaseException], None]


@dataclass(slots=True)
class FlowState:
    """What hopmeter keeps per flow between hooks (the live side; never saved with the flow)."""

    mono0: float  # monotonic clock at the request headers
    skew_s: float  # request start is this much before mono0 on the wall clock
    listener: str
    hop: str
    trace: TraceContext | None
    span_id: str  # this flow's own span: the one hopmeter put in traceparent, or a new one
    request_bytes: int = 0
    request_head: bytearray = field(default_factory=bytearray)
    request_model: str | None = None
    stream_requested: bool | None = None
    tap: ResponseTap | None = None
    response_headers: dict[str, str] | None = None  # lower-cased, first value wins
    streaming: bool = False  # counted in streams_active
    finished: bool = False
    failure: UpstreamFailure | None = (
        None  # why the upstream failed it (hopmeter.proxy.addon.guard)
    )
    passage: FlowPassage | None = None  # what mitmproxy's features did to it (proxy.passage)
    # the fault that made hopmeter's relay cut the client's connection (the record's relay_error)
    relay_error: str | None = None

    def offset(self, mono: float) -> float:
        """Seconds since the request started, on the monotonic clock."""
        return mono - self.mono0 + self.skew_s


def start_trace(flow: http.HTTPFlow, forward: bool) -> tuple[TraceContext, str]:
    """The flow's trace context as it came (made up when none came) and its own span id, which
    goes on in `traceparent` as the next hop's parent when `forward` (W3C Trace Context: the
    trace id and flags kept, the parent-id replaced, as Envoy and nginx's OpenTelemetry module
    do); `tracestate` is passed on untouched, but for a malformed `traceparent`'s, which W3C has
    discarded with it (it belongs to a trace the new one is not)."""
    incoming = flow.request.headers.get("traceparent")
    parsed = parse_traceparent(incoming) if incoming else None
    own = secrets.token_hex(8)
    trace = parsed or TraceContext(
        trace_id=secrets.token_hex(16),
        span_id=own,
        flags="01",
        created=True,
        # a header that came and was no trace context: the client's trace is lost, and said
        received=TraceReceived.ABSENT if incoming is None else TraceReceived.MALFORMED,
    )
    if forward:
        flow.request.headers["traceparent"] = trace.child(own).header()
        if trace.received is TraceReceived.MALFORMED:
            flow.request.headers.pop("tracestate", None)
    return trace, own


def header_map(headers: http.Headers) -> dict[str, str]:
    """`core.wire.lower_headers(headers)`, read from mitmproxy's raw fields in one pass.

    The same map: each name lower-cased, with the values of every field of that name (names
    compared as mitmproxy compares them, their bytes lower-cased) joined by ", ", as
    `Headers.items()` gives them; `items()` looks each name up again over all fields, a scan
    per name, twice per flow (the request's headers and the response's).
    """
    values: dict[bytes, list[bytes]] = {}
    for name, value in headers.fields:
        key = name.lower()
        same = values.get(key)
        if same is None:
            values[key] = [value]
        else:
            same.append(value)
    out: dict[str, str] = {}
    for key, vals in values.items():
        # the first spelling differs from `key` in ASCII case alone: the same once lower-cased
        out.setdefault(
            key.decode("utf-8", "surrogateescape").lower(),
            ", ".join(v.decode("utf-8", "surrogateescape") for v in vals),
        )
    return out


def new_meter(
    flow: http.HTTPFlow, headers: dict[str, str], stream_requested: bool | None = None
) -> FlowMeter:
    """The meter of a response whose (lower-cased) headers came, for the API they name
    (`stream_requested`: the request's own `stream` field, read from its body)."""
    req = flow.request
    content_type = headers.get("content-type", "")
    api = detect_api(
        req.method, req.path.split("?", 1)[0], header_map(req.headers), headers, content_type
    )
    return FlowMeter(
        api=api,
        content_type=content_type,
        content_encoding=headers.get("content-encoding"),
        headers=headers,
        stream_requested=stream_requested,
    )


class RequestTap:
    """Counts request body bytes and keeps the head of the body; returns every chunk unchanged."""

    __slots__ = ("on_error", "state")

    def __init__(self, state: FlowState, on_error: OnError) -> None:
        self.state: FlowState | None = state
        self.on_error = on_error

    def __call__(self, data: bytes) -> bytes:
        st = self.state
        if st is None:  # the flow ended (hopmeter.proxy.addon.ending._forget)
            return data
        try:
            st.request_bytes += len(data)
            room = REQUEST_SNIFF_BYTES - len(st.request_head)
            if room > 0 and data:
                st.request_head += data[:room]
            if not data:
                st.request_model, st.stream_requested = sniff_request(bytes(st.request_head))
                st.request_head = bytearray()
        except Exception as exc:  # a measuring bug must never touch the request
            self.on_error("request_tap", exc)
        return data


def request_tapped(stream: object, state: FlowState) -> bool:
    """Whether a request body goes through the RequestTap, given its `stream` at the hopmeter's
    `requestheaders`: one hopmeter streams (not left to mitmproxy to buffer for an edit), and one
    mitmproxy streams itself (`stream_large_bodies`: True), whose bytes the tap hands on as they
    are, counted (its size and model were 0 and unread)."""
    if stream is True:
        return True
    buffered = state.passage is not None and state.passage.request_buffered_by is not None
    return stream is False and not buffered


class ResponseTap:
    """The response's stream callable: stamps each chunk, queues it for measuring, returns it."""

    # hopmeter run's relay (proxy/fastpath/relay.py) may call this tap in mitmproxy's place: it
    # never raises and starts no task
    relay_safe = True

    __slots__ = (
        "bytes_out",
        "chaos",
        "clock",
        "error",
        "last_s",
        "meter",
        "on_error",
        "out",
        "queue",
        "state",
    )

    def __init__(self, state: FlowState | None, queue: MeasureQueue, on_error: OnError) -> None:
        self.state = state
        self.queue = queue
        self.on_error = on_error
        self.meter: FlowMeter | None = None
        self.bytes_out = 0
        self.error: str | None = None
        self.chaos: Chaos | None = None  # only with --chaos: staging, never by default
        self.out: FlowOut | None = None  # follows the chunks to the client (proxy.delivery)
        self.clock = queue.clock  # the process's monotonic clock (hopmeter.clock)
        # monotonic time of the last chunk: the read timeout's timer reads it when it comes due
        # (hopmeter.proxy.addon.guard), so a chunk costs one attribute store, never a timer
        self.last_s = self.clock()

    def __call__(self, data: bytes) -> bytes | list[bytes]:
        now = self.last_s = self.clock()
        if data and self.meter is not None:
            # Stamp now; measure after the chunk is written (MeasureQueue). The FlowOut arms the
            # client connection's write counter with the chunk. An exception that left the
            # callable would cost the client this chunk while mitmproxy went on with the next
            # (its layers log the crash and carry on): a hole in the body. Nothing here raises
            # short of running out of memory, but then too only measuring stops (a `try` costs
            # nothing unless it catches).
            try:
                out = self.out
                if out is not None:
                    out.chunk(len(data), now)
                queue = self.queue  # MeasureQueue.add, inlined: a call less on every chunk
                queue.pending.append((self, data, now))
                if not queue.scheduled:
                    queue._schedule(now)
            except Exception as exc:
                self.fail(exc)
        if self.chaos is not None:
            return self._chaos(data)
        self.bytes_out += len(data)
        return data

    def _chaos(self, data: bytes) -> bytes | list[bytes]:
        chaos = self.chaos
        assert chaos is not None
        try:
            pieces = chaos.feed(data) if data else chaos.flush()
        except Exception as exc:  # chaos that fails falls back to the original bytes
            self.chaos = None
            self.fail(exc)
            self.bytes_out += len(data)
            return data
        self.bytes_out += sum(map(len, pieces))
        # the final call must return b"" (bytes), and no data piece may be empty
        return pieces if data or pieces else b""

    def measure(self, data: bytes, now: float) -> None:
        """Feed one stamped chunk to the meter; a failure stops measuring this flow only."""
        meter, st = self.meter, self.state
        if meter is None or st is None:
            return
        try:
            meter.feed(data, now - st.mono0 + st.skew_s)  # st.offset(now), inlined
            out = self.out
            if out is not None:
                live = out.chunks.live
                # FlowChunks.pack stops at the first chunk neither seen sent nor given up on:
                # with the head still on its way there is nothing to pack, and no call is made
                if len(live) > PACK_AFTER_CHUNKS and (
                    live[0][SENT] is not None or live[0][GONE] is not None
                ):
                    out.chunks.pack()
        except Exception as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Stop measuring this flow, say so once, and count it. Never raises: it runs inside the
        stream callable and in the measuring batch, where an exception would cost the client
        bytes or other flows their measuring (a counter that fails is lost with it)."""
        self.meter = None
        if self.error is None:
            self.error = said(exc)
            with contextlib.suppress(Exception):
                self.on_error("response_tap", exc)


class MeasureQueue:
    """Chunks stamped by the response taps and not yet measured, measured together a moment later.

    mitmproxy writes a chunk to the client right after the stream callable returns, so whatever
    the callable does delays that write, and with many streams emitting together (batched
    decoding) it delays every stream behind it. The callable therefore only stamps the chunk and
    appends it here; one callback `MEASURE_DELAY_S` later measures the queue, all chunks in a row
    (cheaper than interleaved with mitmproxy's work), after the writes of every chunk that arrived
    meanwhile. The queue holds at most that long's chunks, which mitmproxy has already handed to
    the sockets; measuring reads the stamps, so nothing measured moves. With no event loop running
    (offline tools, tests) a chunk is measured at once.

    Measuring blocks the loop every stream shares, so with a `LoopLog` each scheduled measuring
    is timed (wall and CPU) and its timer's lateness noted: hopmeter never hides its own cost.
    """

    __slots__ = ("clock", "due", "log", "pending", "scheduled", "timed", "timers")

    def __init__(
        self, log: LoopLog | None = None, *, clock: Clock = MONOTONIC, timers: Timers | None = None
    ) -> None:
        self.clock = clock  # the chunks' stamps (ResponseTap)
        self.timers = timers  # the measuring's; None: the running loop's (hopmeter.clock)
        self.pending: list[tuple[ResponseTap, bytes, float]] = []
        self.scheduled = False
        self.log = log
        self.due = 0.0  # when the scheduled measuring should run (monotonic)
        self.timed = self._timed  # bound once: a batch's timer takes it as it is

    def add(self, tap: ResponseTap, data: bytes, now: float) -> None:
        """Queue one stamped chunk; the first of a batch schedules the measuring.

        `ResponseTap.__call__` does the same inline; keep the two alike.
        """
        self.pending.append((tap, data, now))
        if not self.scheduled:
            self._schedule(now)

    def _schedule(self, now: float) -> None:
        try:
            timers = self.timers  # timers_or_loop, inlined: once per batch of chunks
            (timers or asyncio.get_running_loop()).call_later(MEASURE_DELAY_S, self.timed)
        except RuntimeError:  # no running loop (offline tools, tests): measure now
            self.measure()
            return
        self.scheduled = True
        self.due = now + MEASURE_DELAY_S

    def _timed(self) -> None:
        """The scheduled measuring, timed when there is a log.

        With a log, `LoopLog.lag`, `measure` and `LoopLog.step` are inlined (a single stream has
        a batch per chunk: three calls less per event); keep them alike.
        """
        log = self.log
        if log is None:
            self.measure()
            return
        t0, cpu0 = time.monotonic(), time.thread_time()
        late_s = t0 - self.due
        if late_s >= LAG_FLOOR_S:
            log.lags.append((t0, late_s))
        self.scheduled = False
        pending, self.pending = self.pending, []
        for tap, data, now in pending:
            tap.measure(data, now)
        # the thread's CPU is read again only for a step that is kept (LoopLog.step)
        wall = time.monotonic() - t0
        if wall >= STEP_FLOOR_S:
            log.steps.append((t0, wall, min(time.thread_time() - cpu0, wall)))

    def measure(self) -> None:
        """Measure every queued chunk, in arrival order. Never raises."""
        self.scheduled = False
        pending, self.pending = self.pending, []
        for tap, data, now in pending:
            tap.measure(data, now)
