"""A flow's end, with one owner: the ordered chain from a flow's last hook to its observers.

When HopMeter's `response` or `error` hook ends a flow it stamps the end (`FlowEnd`) and hands
it to `Ending.end`. From there the flow goes down one chain, top to bottom (`Ending.chain`):

1. **delivery** (`DeliveryLane`, hopmeter.proxy.delivery.lane): wait until the kernel has sent the
   flow's last chunk to the client (or the connection closed, or WAIT_MAX_S passed); a flow whose
   bytes were not followed goes on on the loop's next turn, after the hook has returned.
2. **seen** (`Ending._seen`): what was seen, taken once: the chunks still queued are measured,
   the meter closed, a buffered body measured whole (hopmeter.proxy.addon.passage), what was seen
   of the bytes going out collected (`FlowOut.seen`): a typed, frozen `core.measure.Seen`.
3. **tokenizer** (`Vocabulary`, hopmeter.proxy.addon.tokenizer_load): with
   `hopmeter_lazy_tokenizer`, wait until the default vocabulary is loaded.
4. **measure** (`Ending._measure`): `core.record.finish`: tokens counted, figures, delivery
   summary and findings (`core.measure.measure`), then the record written (`core.record`).
5. **listeners** (`Ending._listen`): called with the flow and its result (mitmweb's HopView keeps
   the record in the flow), before pairing.
6. **pairing** (`Pairing`, hopmeter.proxy.addon.pairing): a request's outermost flow waits for
   the other flows of its trace (and of its reply, across hops), then gets their `hops`.
7. **beacon** (`BeaconJoins`, hopmeter.proxy.addon.beacons, filled in by BrowserMeter): a record
   whose page announced a beacon waits for it.
8. **observers** (`Ending._observe`): metrics, records, console, spans (`Observers`).

Every link has one interface (`Wait`): `take(item, then)` hands the item on to `then`, now or
later, and `drain()` lets everything it holds through now; when the proxy stops, `Ending.drain`
drains them in the chain's order. A link that raises is counted in
`hopmeter_internal_errors_total{where}`: the flow stops there (no record), except at the two
holds after the record exists, which let it through (it is written without its pairing or
beacon). Each time a wait hands on later, the rest of the chain is one of hopmeter's own timed
steps on the loop (`LoopLog`), as measuring is.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, NamedTuple, Protocol

from mitmproxy import http

from hopmeter.clock import MONOTONIC, Clock, Timers, timers_or_loop
from hopmeter.core.delivery import DeliverySeen
from hopmeter.core.fingerprint import FINGERPRINT_CHARS
from hopmeter.core.measure import RequestInfo, ResponseInfo, Seen
from hopmeter.core.passage import H2_PRIOR_KNOWLEDGE
from hopmeter.core.record import FlowResult, finish
from hopmeter.core.vocab import Api, Ended
from hopmeter.core.wire import credential_values, detect_api, model_from_path
from hopmeter.proxy.addon import passage
from hopmeter.proxy.addon.aside import Aside
from hopmeter.proxy.addon.observers import Observers
from hopmeter.proxy.addon.pairing import LiveFlow, Pairing
from hopmeter.proxy.addon.tap import FlowState, MeasureQueue, RequestTap, ResponseTap, header_map
from hopmeter.proxy.addon.tokenizer_load import Vocabulary
from hopmeter.proxy.delivery.lane import DeliveryLane, FlowOut, LoopLog

# A record takes ~5 µs of CPU an event (a character of its kept text ~a sixteenth of that): one
# that would take longer than the interpreter's switch interval, the longest the worker can hold
# the loop (`sys.getswitchinterval`), is built beside the loop (proxy.addon.aside). From 1,000
# events at Python's default 5 ms; `hopmeter run` sets 1 ms (hopmeter.proxy.run.runner): 200.
RECORD_S_PER_EVENT = 5e-6

# A flow in flight: mitmproxy's flow and hopmeter's state of it, by flow id (HopMeter.live).
Live = Mapping[str, tuple[http.HTTPFlow, FlowState]]
Listener = Callable[[http.HTTPFlow, FlowResult], None]


class Wait(Protocol):
    """One link of a flow's end."""

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        """Hand `item` (or what it became) to `then`, now or later; a wait that gathers items
        hands on several together (every take of one chain passes the same `then`)."""

    def drain(self) -> None:
        """Hand on everything held, now (the proxy is stopping)."""


@dataclass(frozen=True, slots=True)
class Link:
    """A wait in the chain: its name, the site its faults are counted under, and whether a
    fault lets the item through (the holds after the record exists) or stops it there."""

    name: str
    where: str
    wait: Wait
    fail_open: bool = False


class Step:
    """A link that does its work at once: `then(fn(item))`."""

    __slots__ = ("fn",)

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        then(self.fn(item))

    def drain(self) -> None:
        return


class Through:
    """A wait that holds nothing (the beacon link until BrowserMeter fills it in)."""

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        then(item)

    def drain(self) -> None:
        return


class FlowEnd(NamedTuple):
    """A flow the hooks ended: how, and when (seconds since its request started)."""

    flow: http.HTTPFlow
    state: FlowState
    ended: Ended
    end_s: float

    @property
    def out(self) -> FlowOut | None:
        """The flow's bytes on their way to the client, when they were followed."""
        tap = self.state.tap
        return tap.out if tap is not None else None


class RecordOptions(Protocol):
    """The options a record is taken with, read when it is taken (the measuring addon's)."""

    stall_threshold_s: float
    fingerprint_key: bytes | None

    @property
    def log_content(self) -> bool: ...


class Ending:
    """Owns a flow's end: the chain of waits, the flow listeners and the observers."""

    def __init__(
        self,
        observers: Observers,
        delivery: DeliveryLane,
        queue: MeasureQueue,
        *,
        live: Live,
        options: RecordOptions,
        clock: Clock = MONOTONIC,
        timers: Timers | None = None,
    ) -> None:
        self.observers = observers
        self.timers = timers  # the pairing's waits; None: the running loop's (hopmeter.clock)
        self.on_error = observers.internal_error
        self.delivery = delivery
        self.queue = queue
        self.live = live  # the flows in flight (read only)
        self.options = options
        self.vocabulary = Vocabulary(lambda: not live, self.on_error)
        self.pairing = Pairing(
            schedule=self._later, in_flight=self._in_flight, soon=self._soon, clock=clock
        )
        self.beacons: Wait = Through()
        self.listeners: list[Listener] = []
        self._timing = False  # inside one of hopmeter's timed steps (`timed`)
        # a long flow's record is built on a worker thread, beside the loop (proxy.addon.aside)
        self.aside = Aside(self._measure, big=_long, failed=partial(self.on_error, "finish"))
        self.chain: tuple[Link, ...] = (
            Link("delivery", "delivery", delivery),
            Link("seen", "finish", Step(self._seen)),
            Link("tokenizer", "tokenizer", self.vocabulary),
            Link("measure", "finish", self.aside),
            Link("listeners", "flow_listener", Step(self._listen)),
            Link("pairing", "pairing", self.pairing, fail_open=True),
            Link("beacon", "browser", _Slot(self), fail_open=True),
            Link("observers", "observer", Step(self._observe)),
        )
        last = len(self.chain) - 1
        thens = [partial(self._resume, i + 1) for i in range(last)] + [_nowhere]
        # per link: a step's function (or None for a wait), the wait, what comes after, the link
        self._plan = tuple(
            (link.wait.fn if type(link.wait) is Step else None, link.wait, then, link)
            for link, then in zip(self.chain, thens, strict=True)
        )

    @property
    def log(self) -> LoopLog:
        """What hopmeter's own steps cost the loop (the delivery lane's log)."""
        return self.delivery.log

    # -- the chain -----------------------------------------------------------------------------
    def end(self, end: FlowEnd) -> None:
        """A flow ended: its record, once its bytes reached the client (never inside the hook)."""
        self._go(0, end)

    def take_at(self, name: str, item: Any) -> None:
        """Hand `item` to the chain at the link `name` (what a result made elsewhere, a test's,
        goes through from there on)."""
        self._resume(next(i for i, link in enumerate(self.chain) if link.name == name), item)

    def _go(self, i: int, item: Any) -> None:
        """Hand `item` to link `i`: the steps run here one after the other, a wait gets the rest
        of the chain as its `then`."""
        plan, n = self._plan, len(self._plan)
        while i < n:
            step, wait, then, link = plan[i]
            try:
                if step is not None:  # a Step: its work done here, no call per link
                    item = step(item)
                    i += 1
                    continue
                wait.take(item, then)
            except Exception as exc:
                if link.fail_open:
                    self.on_error(link.where, exc)
                    then(item)
                else:
                    self.observers.record_lost(link.where, exc, _flow_id(item))
            return

    def _resume(self, i: int, item: Any) -> None:
        """Go on from link `i`: a wait handing on later starts one of hopmeter's timed steps."""
        if self._timing:  # handed on at once, inside the step that took it
            self._go(i, item)
        else:
            self.timed(partial(self._go, i, item))

    def drain(self, stopped: Callable[[], Iterable[FlowEnd]] = tuple) -> None:
        """The proxy stops: every wait lets its flows through, in the chain's order; the flows
        `stopped()` ends (in flight, written as ended "shutdown") go on after the first wait."""
        first, *rest = self.chain
        first.wait.drain()
        for end in stopped():
            self._resume(1, end)
        for link in rest:
            link.wait.drain()

    def timed(self, fn: Callable[[], None]) -> None:
        """Run `fn` as one of hopmeter's own steps on the loop every stream shares, timed (wall
        and CPU) in the LoopLog, so the records of the flows it delayed say so; inside another
        such step it is part of that one."""
        if self._timing:
            fn()
            return
        self._timing = True
        t0, cpu0 = time.monotonic(), time.thread_time()
        try:
            fn()
        finally:
            self._timing = False
            self.log.step(t0, cpu0)

    # -- the steps -----------------------------------------------------------------------------
    def _seen(self, end: FlowEnd) -> tuple[http.HTTPFlow, Seen]:
        """Everything the record says but its token counts, as it is when the flow ends; then
        the flow's taps let go of what only this needed (`_forget`)."""
        try:
            return self._seen_now(end)
        finally:
            _forget(end.flow, end.state)

    def _seen_now(self, end: FlowEnd) -> tuple[http.HTTPFlow, Seen]:
        flow, state, ended = end.flow, end.state, end.ended
        tap, p = state.tap, state.passage
        self.queue.measure()  # this flow's last chunks may still be queued
        meter = tap.meter if tap is not None else None
        if p is not None:
            passage.settle(flow, p, meter, tap)
            if p.stream == passage.REPLACED:
                meter = None  # another addon's callable took the body: none of it was measured
        if flow.error is not None and flow.error.msg == flow.error.KILLED_MESSAGE:
            # an addon killed the flow (`flow.kill()`), in any hook, even after hopmeter's own
            # `response` hook: its connection is closed, so the reply did not end whole
            ended = Ended.ERROR
            if p is not None:
                p.killed = True
                if passage.h2_preface(flow):  # mitmproxy's disable_h2c killed it
                    p.error, p.cause = passage.H2_PREFACE, H2_PRIOR_KNOWLEDGE
        if meter is not None:
            try:
                meter.close(end.end_s)
            except Exception as exc:
                tap.fail(exc)  # type: ignore[union-attr]
                meter = None
        if ended == Ended.CLIENT_GONE and meter is not None and meter.facts.terminal_seen:
            # SDKs close the response at the stream's terminal event ([DONE], message_stop), which
            # the stream callable handed on to the client as it read it; the body's own end (a
            # chunked body's last chunk) may come after: the reply was whole
            ended = Ended.COMPLETE
        trace, options = state.trace, self.options
        seen = Seen(
            flow_id=flow.id,
            trace_id=trace.trace_id if trace else None,
            span_id=state.span_id,
            parent_span_id=None if trace is None or trace.created else trace.span_id,
            trace_received=trace.received if trace else None,
            hop=state.hop,
            listener=state.listener,
            request=_request(flow, state, measured=meter is not None),
            response=_response(flow, state),
            meter=meter,
            ended=ended,
            bytes_out=tap.bytes_out if tap is not None else 0,
            stall_threshold_s=options.stall_threshold_s,
            log_content=options.log_content,
            hidden=_hidden(flow) if options.log_content else (),
            measuring_error=tap.error if tap is not None else None,
            delivery=self._delivered(end),
            failure=state.failure,
            fingerprint_key=options.fingerprint_key,
            chaos=_chaos(tap),
            relay_error=state.relay_error,
            passage=p.seen() if p is not None else None,
            mono_start_s=state.mono0 - state.skew_s,
        )
        return flow, seen

    def _delivered(self, end: FlowEnd) -> DeliverySeen | None:
        """What was seen of the flow's bytes going out; a failure loses only that."""
        out = end.out
        if out is None:
            return None
        try:
            return out.seen(end.state.mono0, end.state.skew_s, self.log, self.delivery.clock)
        except Exception as exc:
            self.on_error("delivery", exc)
            return None

    def _measure(self, taken: tuple[http.HTTPFlow, Seen]) -> tuple[http.HTTPFlow, FlowResult]:
        """The record from what was seen, its tokens counted."""
        flow, seen = taken
        counters = self.vocabulary.counters
        assert counters is not None  # the addon's configure() makes them before any flow
        return flow, finish(seen, counters)

    def _listen(self, done: tuple[http.HTTPFlow, FlowResult]) -> FlowResult:
        flow, result = done
        for listener in self.listeners:
            try:
                listener(flow, result)
            except Exception as exc:
                self.on_error("flow_listener", exc)
        return result

    def _observe(self, result: FlowResult) -> None:
        self.observers.notify(lambda obs: obs.observe(result))

    # -- for the other addons ------------------------------------------------------------------
    def add_listener(self, listener: Listener) -> None:
        """Call `listener(flow, result)` when a flow's record is built, before pairing."""
        if listener not in self.listeners:
            self.listeners.append(listener)

    def remove_listener(self, listener: Listener) -> None:
        """Stop calling `listener`."""
        if listener in self.listeners:
            self.listeners.remove(listener)

    # -- for pairing ---------------------------------------------------------------------------
    def _later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run `fn` later on the loop; a failure in it is counted, never raised into the loop."""
        timers_or_loop(self.timers).call_later(delay_s, partial(self._guarded, fn))

    def _soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop's next turn, as one of hopmeter's timed steps; a failure in it is
        counted, never raised into the loop."""
        asyncio.get_running_loop().call_soon(self.timed, partial(self._guarded, fn))

    def _guarded(self, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception as exc:
            self.on_error("pairing", exc)

    def _in_flight(self) -> list[LiveFlow]:
        """The flows in flight, for content pairing: their reply text so far."""
        out = []
        for flow, state in self.live.values():
            meter = state.tap.meter if state.tap is not None else None
            out.append(
                LiveFlow(
                    trace_id=state.trace.trace_id if state.trace else "",
                    t_start=flow.request.timestamp_start,
                    opening=meter.text_head(FINGERPRINT_CHARS) if meter is not None else "",
                    chars=meter.visible_chars if meter is not None else 0,
                )
            )
        return out


class _Slot:
    """The beacon link: whatever wait `Ending.beacons` holds now."""

    __slots__ = ("ending",)

    def __init__(self, ending: Ending) -> None:
        self.ending = ending

    def take(self, item: Any, then: Callable[[Any], None]) -> None:
        self.ending.beacons.take(item, then)

    def drain(self) -> None:
        self.ending.beacons.drain()


def _nowhere(item: Any) -> None:
    """After the last link: nothing."""


def _flow_id(item: Any) -> str | None:
    """The id of the flow an item of the chain is about (a FlowEnd, a (flow, seen) pair or a
    FlowResult, as the links hand them on), for a log line; None if it cannot tell."""
    with contextlib.suppress(Exception):
        if isinstance(item, FlowEnd):
            return str(item.flow.id)
        if isinstance(item, tuple):
            return str(item[0].id)
        if isinstance(item, FlowResult):
            return str(item.record.get("flow_id"))
    return None


def _forget(flow: http.HTTPFlow, state: FlowState) -> None:
    """The flow's taps let go of its state, meter and chunk follower once its Seen is made.

    mitmproxy keeps a finished flow, and the stream callables on it, as long as it keeps the
    flow: an HTTP/2 connection keeps every one of its requests until it closes (~5.6 KiB each of
    mitmproxy's own, on a connection a gateway's pool holds open for days). Through the taps
    every one of them also kept hopmeter's per-flow state (its passage, trace context, meter):
    as much again. A tap called after this hands its bytes on unmeasured, as after a failure."""
    tap = state.tap
    if tap is not None:
        tap.state = tap.meter = tap.out = tap.chaos = None
    request_tap = flow.request.stream
    if isinstance(request_tap, RequestTap):
        request_tap.state = None


def _request(flow: http.HTTPFlow, state: FlowState, *, measured: bool) -> RequestInfo:
    req = flow.request
    return RequestInfo(
        method=req.method,
        scheme=req.scheme,
        host=req.pretty_host,
        path=req.path.split("?", 1)[0],
        t_start=req.timestamp_start,
        t_end=req.timestamp_end,
        bytes=state.request_bytes,
        model=state.request_model or model_from_path(req.path),
        stream_requested=state.stream_requested,
        api=None if measured else _request_api(flow),
    )


def _hidden(flow: http.HTTPFlow) -> tuple[str, ...]:
    """The request's own credentials, to be kept out of the upstream text a record shows."""
    return credential_values(flow.request.headers.items(multi=True), flow.request.path)


def _request_api(flow: http.HTTPFlow) -> str | None:
    """The API the request alone names (its path, its headers), for a flow whose response was
    not measured (none came, or measuring failed); None where it names none."""
    req = flow.request
    api = detect_api(req.method, req.path.split("?", 1)[0], header_map(req.headers), {}, "")
    return None if api == Api.OTHER else str(api)


def _response(flow: http.HTTPFlow, state: FlowState) -> ResponseInfo | None:
    """The response as the record says it; none when no final response was measured."""
    p = state.passage
    if flow.response is None or state.tap is None or (p and p.informational):
        return None
    resp = flow.response
    return ResponseInfo(
        status=resp.status_code,
        http_version=resp.http_version,
        headers=state.response_headers or header_map(resp.headers),
        t_headers_s=(resp.timestamp_start - flow.request.timestamp_start),
    )


def _chaos(tap: ResponseTap | None) -> tuple[str, ...] | None:
    """The --chaos actions that re-cut the response, when they did."""
    if tap is None or tap.chaos is None:
        return None
    return tuple(sorted(tap.chaos.applied))


def _long(taken: tuple[http.HTTPFlow, Seen]) -> bool:
    """Whether the record of what was seen would hold the loop longer than the worker could."""
    meter = taken[1].meter
    if meter is None:
        return False
    events = len(meter.events.t_s) + meter.text_chars / 16
    return events * RECORD_S_PER_EVENT >= sys.getswitchinterval()
