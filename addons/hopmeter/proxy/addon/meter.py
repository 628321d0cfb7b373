"""HopMeter: the addon whose hooks hand every HTTP flow to the sans-I/O core.

Load it in plain mitmproxy with `mitmdump -s "$(hopmeter --addon-path)" --set hopmeter_hop=edge`.
Its hooks stamp times, keep per-flow state (`FlowState`, in this addon, never on the flow: a flow
is saved and copied with its metadata) and install the stream taps (hopmeter.proxy.addon.tap);
when a flow ends they build its record with the core (hopmeter.core.record) and hand the result
to the observers, the outputs of hopmeter.proxy.addon.outputs. Every call into measuring code and
into an observer is guarded: a bug there is counted and logged, and never touches a byte of the
flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mitmproxy import connection, ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from hopmeter.core.delivery import DeliverySeen
from hopmeter.core.fingerprint import FINGERPRINT_CHARS
from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import FlowResult, RequestInfo, ResponseInfo, finish_flow
from hopmeter.core.trace import TraceContext, parse_traceparent
from hopmeter.core.upstream import UpstreamFailure
from hopmeter.core.vocab import Ended
from hopmeter.core.wire import detect_api, lower_headers, model_from_path
from hopmeter.errors import HopmeterError, UsageError
from hopmeter.export import FlowObserver
from hopmeter.log import get_logger
from hopmeter.proxy import options
from hopmeter.proxy.addon import passage
from hopmeter.proxy.addon.chaos import Chaos
from hopmeter.proxy.addon.meter_options import (
    chaos_actions,
    fingerprint_key,
    listener_modes,
    pairing_hops,
    parse_listeners,
)
from hopmeter.proxy.addon.pairing import LiveFlow, Pairing
from hopmeter.proxy.addon.passage import (
    BUFFERED,
    CHAINED,
    CrashWatch,
    FlowPassage,
    Passage,
    PassageTap,
)
from hopmeter.proxy.addon.tap import FlowState, MeasureQueue, RequestTap, ResponseTap
from hopmeter.proxy.addon.tokenizer_load import TokenizerLoad
from hopmeter.proxy.addon.tokenizers import Counters, load_counter, traffic_started
from hopmeter.proxy.delivery.lane import Delivery

if TYPE_CHECKING:
    from hopmeter.proxy.addon.browser_meter import BrowserMeter

log = get_logger()


class HopMeter:
    """Measures every HTTP flow that passes: times, events, tokens, figures, a record per flow."""

    def __init__(self) -> None:
        self.listener_names: dict[str, str] = {}
        self.counter: Counters | None = None
        # what runs once the tokenizers' patterns are compiled, in that thread (hopmeter run:
        # hopmeter.proxy.run.runner.FreezeAtStart freezes what the compiler left)
        self.after_patterns: Callable[[], None] | None = None
        # loads the default vocabulary at the first flow; records wait for it (tokenizer_load)
        self.tokenizer_load: TokenizerLoad | None = None
        self.internal_errors = 0
        self.observers: list[FlowObserver] = []
        # called with the flow and its record as soon as the record is built (before pairing)
        self.flow_listeners: list[Callable[[http.HTTPFlow, FlowResult], None]] = []
        self.pairing = Pairing(
            schedule=self._call_later,
            emit=self._emit,
            in_flight=self._in_flight,
            soon=self._call_soon,
        )
        self.fingerprint_key: bytes | None = None  # from hopmeter_fingerprint_key_env
        self.live: dict[str, tuple[http.HTTPFlow, FlowState]] = {}  # flows not yet finished
        self.chaos_actions: tuple[str, ...] = ()
        self.stall_threshold_s: float = options.default("hopmeter_stall_threshold")
        # follows each chunk to the client, and logs what hopmeter's own steps cost the loop
        self.delivery = Delivery(self.internal_error)
        self.queue = MeasureQueue(self.delivery.log)
        # browser measuring (hopmeter.proxy.addon.browser_meter): its paths, and records held
        # for beacons
        self.browser: BrowserMeter | None = None
        # what hopmeter leaves of mitmproxy's own features (streams, edits, bodies, failures)
        self.passage = Passage()
        self.crash_watch = CrashWatch(self._mitmproxy_crashed)
        # Set by `done`: the outputs are closing, so flows that still start on connections open
        # until the process exits are forwarded but not measured (their record could not be
        # written).
        self.stopped = False

    # -- options -------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        options.declare(loader, options.MEASURING)
        options.declare(loader, options.PASSAGE)

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        try:  # each option read once (hopmeter.proxy.addon.meter_options): a bad one named
            passage.configure(self.passage, opts, updated)
            if "hopmeter_stall_threshold" in updated:
                self.stall_threshold_s = options.read(opts, "hopmeter_stall_threshold")
            if "hopmeter_listeners" in updated:
                self.listener_names = parse_listeners(opts.hopmeter_listeners)
                modes = listener_modes(opts.mode, self.listener_names)
                if modes is not None:
                    opts.update(mode=modes)
            if "hopmeter_fingerprint_key_env" in updated:
                self.fingerprint_key = fingerprint_key(opts.hopmeter_fingerprint_key_env)
            if "hopmeter_chaos" in updated:
                self.chaos_actions = chaos_actions(opts.hopmeter_chaos)
        except UsageError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        if updated & {"hopmeter_listeners", "hopmeter_hop", "mode", "hopmeter_content_pairing"}:
            self.pairing.hops = pairing_hops(opts, self.listener_names)
            # where no parent link says which hop is outer: the listeners as declared, outermost
            # first
            self.pairing.order.declare([*self.listener_names.values(), opts.hopmeter_hop])
        if updated & {"hopmeter_tokenizer", "hopmeter_lazy_tokenizer"} or self.counter is None:
            if self.tokenizer_load is not None:
                self.tokenizer_load.drain()  # records of the old tokenizer first
            try:
                self.counter = load_counter(opts.hopmeter_tokenizer or None)
            except HopmeterError as exc:
                raise exceptions.OptionsError(f"hopmeter_tokenizer: {exc}") from None
            self.tokenizer_load = None
            if opts.hopmeter_lazy_tokenizer:
                self.tokenizer_load = TokenizerLoad(
                    self.counter, lambda: not self.live, self.internal_error
                )

    def running(self) -> None:
        self.preload()  # `hopmeter run` did it before its listeners opened; mitmdump -s: now
        # mitmproxy's connection handler logs a crash of its layers, and that is all it does
        # (the flow's client waits): hopmeter ends such a flow as an error (passage.CrashWatch)
        logging.getLogger(passage.CRASH_LOGGER).addHandler(self.crash_watch)

    def preload(self) -> None:
        """Load the default vocabulary now, unless it is to be loaded at the first flow."""
        if self.counter is not None and self.tokenizer_load is None:
            self.counter.preload()

    def done(self) -> None:
        logging.getLogger(passage.CRASH_LOGGER).removeHandler(self.crash_watch)
        # flows waiting for their last bytes to reach the client are written with what was seen
        self.delivery.shutdown()
        # flows still in flight when the proxy stops are written as ended "shutdown"
        self.stopped = True
        for flow, state in list(self.live.values()):
            if not state.finished:
                state.finished = True
                self._complete(flow, state, Ended.SHUTDOWN, state.offset(time.monotonic()))
        self.live.clear()
        if self.tokenizer_load is not None:  # records waiting for the vocabulary: now
            self.tokenizer_load.drain()
        self.pairing.drain()
        if self.browser is not None:  # records waiting for a beacon: written without it
            self.browser.joins.drain()

    # -- observers -----------------------------------------------------------------------------
    def add_observer(self, observer: FlowObserver) -> None:
        """Hand every finished flow (and the stream and error notices) to `observer` too."""
        if observer not in self.observers:
            self.observers.append(observer)

    def remove_observer(self, observer: FlowObserver) -> None:
        """Stop handing flows to `observer`."""
        if observer in self.observers:
            self.observers.remove(observer)

    def add_flow_listener(self, listener: Callable[[http.HTTPFlow, FlowResult], None]) -> None:
        """Call `listener(flow, result)` when a flow's record is built, before pairing."""
        if listener not in self.flow_listeners:
            self.flow_listeners.append(listener)

    def remove_flow_listener(self, listener: Callable[[http.HTTPFlow, FlowResult], None]) -> None:
        """Stop calling `listener`."""
        if listener in self.flow_listeners:
            self.flow_listeners.remove(listener)

    def _notify(self, notice: Callable[[FlowObserver], None], where: str) -> None:
        """Call `notice` on every observer; one that raises is counted and the rest still run."""
        for obs in self.observers:
            try:
                notice(obs)
            except Exception as exc:
                self.internal_error(where, exc)

    def internal_error(self, where: str, exc: BaseException | None = None) -> None:
        """Count a bug in measuring code; the flow goes on unmeasured. Never raises.

        The stream taps call this from their `except` clauses, where an exception would escape
        into mitmproxy and drop a chunk: so an observer that fails here is not told again (no
        recursion) and not allowed out, and a failing log call is swallowed too.
        """
        self.internal_errors += 1
        for obs in self.observers:
            with contextlib.suppress(Exception):  # the one place a failure can only be dropped
                obs.internal_error(where)
        with contextlib.suppress(Exception):
            log.warning(
                "hopmeter: measuring failed; the flow is forwarded unmeasured",
                where=where,
                error=f"{type(exc).__name__}: {exc}" if exc else None,
            )

    def fast_path_failed(self, where: str, exc: BaseException) -> None:
        """A fault in one of `hopmeter run`'s fast paths past mitmproxy (framing, backpressure)
        before it had done anything: mitmproxy's own method took over. Counted and logged as an
        internal error; the flow goes on, measured. Never raises."""
        self.internal_errors += 1
        for obs in self.observers:
            with contextlib.suppress(Exception):
                obs.internal_error(where)
        with contextlib.suppress(Exception):
            log.warning(
                "hopmeter: a fast path past mitmproxy failed; mitmproxy's own step took over",
                where=where,
                error=f"{type(exc).__name__}: {exc}"[:300],
            )

    def relay_failed(self, flow: http.HTTPFlow, exc: BaseException, cut: bool) -> None:
        """A fault in `hopmeter run`'s relay (hopmeter.proxy.fastpath.relay), counted and logged
        as an internal error. `cut`: the relay had begun moving a read and ended the client's
        connection, so the flow is recorded as ended by an error, with the fault as its
        `relay_error`; else mitmproxy's layers moved the read and the flow goes on. Never
        raises."""
        error = f"{type(exc).__name__}: {exc}"[:300]
        self.internal_errors += 1
        for obs in self.observers:
            with contextlib.suppress(Exception):
                obs.internal_error("relay")
        with contextlib.suppress(Exception):
            state = self._state(flow)
            if cut and state is not None and state.relay_error is None:
                state.relay_error = error
        with contextlib.suppress(Exception):
            if cut:
                log.warning(
                    "hopmeter: the relay failed while moving a read; the client's connection "
                    "was reset so that it can tell its response is not whole (recorded ended "
                    "error)",
                    error=error,
                )
            else:
                log.warning(
                    "hopmeter: the relay failed before moving a read; mitmproxy's layers move "
                    "the rest of this response",
                    error=error,
                )

    # -- hooks ---------------------------------------------------------------------------------
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not flow.live or self.stopped:  # read from a file (measured when it was live), or
            return  # the proxy is stopping: nothing could write its record any more
        if self.browser is not None and self.browser.owns(flow):  # answered by hopmeter itself
            return
        mono0 = time.monotonic()
        wall0 = time.time()
        state = None
        try:
            spec = flow.client_conn.proxy_mode.full_spec
            listener = self.listener_names.get(spec, ctx.options.hopmeter_hop)
            trace, span_id = self._trace(flow)
            state = FlowState(
                mono0=mono0,
                skew_s=max(0.0, wall0 - flow.request.timestamp_start),
                listener=listener,
                hop=listener,
                trace=trace,
                span_id=span_id,
                passage=FlowPassage(request_buffered_by=self.passage.buffer_request(flow)),
            )
            self.live[flow.id] = (flow, state)
            parent = None if trace.created else trace.span_id
            self.pairing.start(trace.trace_id, flow.request.timestamp_start, span_id, parent)
            if self.tokenizer_load is not None:
                self.tokenizer_load.start()  # once; at once after the first time
            traffic_started(self.after_patterns)  # the first flow's call acts; then a flag read
        except Exception as exc:
            self.internal_error("requestheaders", exc)
        if state is not None and flow.request.stream is False and not _request_buffered(state):
            flow.request.stream = RequestTap(state, self.internal_error)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # First: never hold a body hopmeter did not decide to leave buffered. Anything that fails
        # after the tap is in place only loses measuring.
        tap = self._tap(flow)
        try:
            state = tap.state
            if state is None or flow.response is None:
                return
            state.tap = tap
            resp = flow.response
            req = flow.request
            state.response_headers = headers = lower_headers(resp.headers)
            content_type = headers.get("content-type", "")
            api = detect_api(
                req.method,
                req.path.split("?", 1)[0],
                lower_headers(req.headers),
                headers,
                content_type,
            )
            tap.meter = FlowMeter(
                api=api,
                content_type=content_type,
                content_encoding=headers.get("content-encoding"),
                headers=headers,
            )
            state.streaming = True
            if self.chaos_actions:
                tap.chaos = Chaos(
                    self.chaos_actions,
                    ctx.options.hopmeter_chaos_seed or secrets.randbits(32),
                    rewrite_ok="content-length" not in headers
                    and "content-encoding" not in headers,
                )
            if flow.response.stream is tap:  # a buffered body has no chunks to follow out
                tap.out = self.delivery.attach(flow, chaos=tap.chaos is not None)  # never raises
        except Exception as exc:
            tap.fail(exc)
            return
        self._notify(lambda obs: obs.stream_started(), "observer")

    def response(self, flow: http.HTTPFlow) -> None:
        state = self._state(flow)
        if state is not None and state.passage is not None:
            try:
                if passage.informational(flow):
                    self._informational(flow, state.passage)
                    return
                self.passage.hand_off(flow, state.passage, state.tap)
            except Exception as exc:
                self.internal_error("passage", exc)
        self._finish(flow, Ended.COMPLETE)

    def error(self, flow: http.HTTPFlow) -> None:
        state = self._state(flow)
        if state is not None and state.passage is not None:
            try:
                # what the client got before the end, for a save of the flow
                self.passage.hand_off(flow, state.passage, state.tap)
            except Exception as exc:
                self.internal_error("passage", exc)
        if state is not None and state.failure is not None:
            self._finish(flow, state.failure.cause)  # the guard named why the upstream failed it
            return
        msg = flow.error.msg if flow.error else ""
        self._finish(flow, classify_error(msg))

    def client_disconnected(self, client: connection.Client) -> None:
        try:
            self.delivery.forget(client.id)
        except Exception as exc:
            self.internal_error("delivery", exc)

    # -- for the upstream guard ----------------------------------------------------------------
    def upstream_failed(self, flow: http.HTTPFlow, failure: UpstreamFailure) -> None:
        """Remember why the upstream failed `flow`, for its record (the first cause wins)."""
        state = self._state(flow)
        if state is not None and state.failure is None:
            state.failure = failure

    def in_flight(self) -> int:
        """Flows that started and have not finished."""
        return len(self.live)

    def busy_clients(self) -> set[str]:
        """The ids of the client connections that have a flow in flight."""
        return {flow.client_conn.id for flow, _ in self.live.values()}

    # -- internals -----------------------------------------------------------------------------
    def _state(self, flow: http.HTTPFlow) -> FlowState | None:
        entry = self.live.get(flow.id)
        return entry[1] if entry is not None else None

    def _tap(self, flow: http.HTTPFlow) -> ResponseTap:
        """The response's tap, installed as its stream callable unless the body is left to
        mitmproxy to buffer (hopmeter.proxy.addon.passage): chained after another addon's callable,
        keeping a copy of the body when asked, or the plain tap."""
        state = self._state(flow)
        response = flow.response
        assert response is not None
        chosen = response.stream
        p = state.passage if state is not None else None
        why, keep = None, None
        if p is not None:
            try:
                why = self.passage.decide(flow) if chosen is False else None
                keep = None if why is not None else self.passage.copy()
            except Exception as exc:  # measuring's loss only: the body is streamed
                self.internal_error("passage", exc)
                why, keep = None, None
        if why is not None and p is not None:
            p.stream, p.buffered_by = BUFFERED, why
            return ResponseTap(state, self.queue, self.internal_error)  # measures; not called
        if callable(chosen) or keep is not None:
            tap: ResponseTap = PassageTap(state, self.queue, self.internal_error)
            if callable(chosen):
                tap.inner = chosen  # type: ignore[attr-defined]
                if p is not None:
                    p.stream = CHAINED
            tap.body = keep  # type: ignore[attr-defined]
            if p is not None:
                p.body = keep
        else:
            tap = ResponseTap(state, self.queue, self.internal_error)
        response.stream = tap
        return tap

    def _informational(self, flow: http.HTTPFlow, p: FlowPassage) -> None:
        """A 1xx response reached the `response` hook: mitmproxy took it for the final one, and
        the client would wait for a reply that never comes. End the flow as an error now and
        kill it, which closes the client's connection (passage module doc)."""
        assert flow.response is not None
        status = flow.response.status_code
        p.informational.append(status)
        if p.body is not None:  # a 1xx has no body to keep
            p.body.release()
            p.body = None
        p.error = f"HTTP/1 {status} {flow.response.reason} taken for the final response"
        if flow.killable:
            flow.kill()
        self._finish(flow, Ended.ERROR)

    def _mitmproxy_crashed(self, client: Any, detail: str) -> None:
        """mitmproxy's layers raised on the connection of `client` (its address): every flow of
        that client in flight cannot be forwarded whole. End each as an error, and close the
        connection, which mitmproxy leaves open, so the client can tell."""
        for flow, state in list(self.live.values()):
            if flow.client_conn.peername != client or state.passage is None:
                continue  # another client's flow (every live flow has a passage)
            state.passage.error = detail
            self.passage.hand_off(flow, state.passage, state.tap)  # what the client got
            self._finish(flow, Ended.ERROR)
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().call_soon(passage.close_client, flow)

    def _trace(self, flow: http.HTTPFlow) -> tuple[TraceContext, str]:
        """The flow's trace context as it came (made up when none came) and its own span id,
        which goes on in `traceparent` as the next hop's parent (W3C Trace Context: the trace id
        and flags kept, the parent-id replaced, as Envoy and nginx's OpenTelemetry module do);
        `tracestate` is passed on untouched."""
        incoming = flow.request.headers.get("traceparent")
        parsed = parse_traceparent(incoming) if incoming else None
        own = secrets.token_hex(8)
        trace = parsed or TraceContext(
            trace_id=secrets.token_hex(16), span_id=own, flags="01", created=True
        )
        if ctx.options.hopmeter_trace_header:
            flow.request.headers["traceparent"] = trace.child(own).header()
        return trace, own

    def _finish(self, flow: http.HTTPFlow, ended: Ended) -> None:
        """Stamp the end now; build the record after this hook has returned.

        For a streamed response mitmproxy writes the end of the body to the client only after the
        `response` hook returns, so tokenizing, figures and detectors must not run inside it. A
        flow whose chunks are followed to the client waits until the kernel has sent the last
        one (or the connection closed, or hopmeter.proxy.delivery.lane.WAIT_MAX_S passed).
        """
        entry = self.live.pop(flow.id, None)
        if entry is None:
            return
        state = entry[1]
        if state.finished:
            return
        state.finished = True
        if state.relay_error is not None:
            ended = Ended.ERROR  # the relay cut the client's connection: never complete
        end_s = state.offset(time.monotonic())
        if state.streaming:
            state.streaming = False
            self._notify(lambda obs: obs.stream_finished(), "observer")
        out = state.tap.out if state.tap is not None else None
        if out is not None:
            try:
                self.delivery.finish(out, lambda: self._complete(flow, state, ended, end_s))
                return
            except Exception as exc:  # finish() itself guards; this is the last line
                self.internal_error("delivery", exc)
                if out.done:
                    return
        try:
            asyncio.get_running_loop().call_soon(self._complete, flow, state, ended, end_s)
        except RuntimeError:  # no running loop (offline tools, tests): do it now
            self._complete(flow, state, ended, end_s)

    def _complete(self, flow: http.HTTPFlow, state: FlowState, ended: Ended, end_s: float) -> None:
        """Take what the record says now; count its tokens and hand it on now, or once the
        vocabulary is loaded (hopmeter.proxy.addon.tokenizer_load)."""
        # hopmeter's own step on the loop every stream shares: timed, as the measuring steps are
        t0, cpu0 = time.monotonic(), time.thread_time()
        try:
            seen = self._seen_now(flow, state, ended, end_s)
        except Exception as exc:
            self.internal_error("finish", exc)
            return
        load = self.tokenizer_load
        if load is None or (load.ready and not load.parked):
            self._record(flow, seen)
            self.delivery.log.step(t0, cpu0)
            return
        self.delivery.log.step(t0, cpu0)
        load.run(lambda: self._timed_record(flow, seen))

    def _timed_record(self, flow: http.HTTPFlow, seen: dict[str, Any]) -> None:
        t0, cpu0 = time.monotonic(), time.thread_time()
        self._record(flow, seen)
        self.delivery.log.step(t0, cpu0)

    def _record(self, flow: http.HTTPFlow, seen: dict[str, Any]) -> None:
        """Build the record from what was seen (counting its tokens) and hand it on."""
        try:
            result = self._build(seen)
        except Exception as exc:
            self.internal_error("finish", exc)
            return
        for listener in self.flow_listeners:
            try:
                listener(flow, result)
            except Exception as exc:
                self.internal_error("flow_listener", exc)
        try:
            ready = self.pairing.finish(result)
        except Exception as exc:
            self.internal_error("pairing", exc)
            ready = [result]
        for r in ready:
            self._emit(r)

    def _emit(self, result: FlowResult) -> None:
        """Hand one finished record to every observer, unless it waits for its page's beacon."""
        if self.browser is not None:
            try:
                if self.browser.joins.take(result):
                    return
            except Exception as exc:
                self.internal_error("browser", exc)
        self.emit_now(result)

    def emit_now(self, result: FlowResult) -> None:
        """Hand one finished record to every observer (metrics, records, console, spans)."""
        self._notify(lambda obs: obs.observe(result), "observer")

    def notify_beacon(self, outcome: str) -> None:
        """Tell every observer what became of a browser beacon."""
        self._notify(lambda obs: obs.beacon(outcome), "observer")

    def _seen_now(
        self, flow: http.HTTPFlow, state: FlowState, ended: Ended, now: float
    ) -> dict[str, Any]:
        """Everything a record says but its token counts, as it is when the flow ends."""
        req = flow.request
        tap = state.tap
        p = state.passage
        self.queue.measure()  # this flow's last chunks may still be queued
        meter = tap.meter if tap is not None else None
        if p is not None:
            passage.settle(flow, p, meter, tap)
        if meter is not None:
            try:
                meter.close(now)
            except Exception as exc:
                tap.fail(exc)  # type: ignore[union-attr]
                meter = None
        if ended == Ended.CLIENT_GONE and meter is not None and meter.facts.terminal_seen:
            # SDKs close the response at the stream's terminal event ([DONE], message_stop), which
            # the stream callable handed on to the client as it read it; the body's own end (a
            # chunked body's last chunk) may come after: the reply was whole
            ended = Ended.COMPLETE
        request = RequestInfo(
            method=req.method,
            scheme=req.scheme,
            host=req.pretty_host,
            path=req.path.split("?", 1)[0],
            t_start=req.timestamp_start,
            t_end=req.timestamp_end,
            bytes=state.request_bytes,
            model=state.request_model or model_from_path(req.path),
            stream_requested=state.stream_requested,
        )
        response = None
        if flow.response is not None and tap is not None and not (p and p.informational):
            resp = flow.response
            response = ResponseInfo(
                status=resp.status_code,
                http_version=resp.http_version,
                headers=state.response_headers or lower_headers(resp.headers),
                t_headers_s=(resp.timestamp_start - req.timestamp_start),
            )
        return dict(
            flow_id=flow.id,
            trace_id=state.trace.trace_id if state.trace else None,
            span_id=state.span_id,
            parent_span_id=None
            if state.trace is None or state.trace.created
            else state.trace.span_id,
            hop=state.hop,
            listener=state.listener,
            request=request,
            response=response,
            meter=meter,
            ended=ended,
            bytes_out=tap.bytes_out if tap is not None else 0,
            stall_threshold_s=self.stall_threshold_s,
            log_content=ctx.options.hopmeter_log_content,
            measuring_error=tap.error if tap is not None else None,
            delivery=self._seen(state),
            failure=state.failure,
            fingerprint_key=self.fingerprint_key,
            chaos=sorted(tap.chaos.actions) if tap is not None and tap.chaos is not None else None,
            passage=p,
            relay_error=state.relay_error,
        )

    def _build(self, seen: dict[str, Any]) -> FlowResult:
        """The record from what was seen, its tokens counted."""
        assert self.counter is not None  # configure() makes it before any flow
        chaos = seen.pop("chaos")
        flow_passage = seen.pop("passage")
        relay_error = seen.pop("relay_error")
        result = finish_flow(**seen, counters=self.counter)
        if chaos is not None:
            result.record["chaos"] = chaos
        if relay_error is not None:
            result.record["relay_error"] = relay_error
        if flow_passage is not None:
            passage.annotate(result.record, flow_passage)
        return result

    def _seen(self, state: FlowState) -> DeliverySeen | None:
        """What was seen of the flow's bytes going out; a failure loses only that."""
        out = state.tap.out if state.tap is not None else None
        if out is None:
            return None
        try:
            return out.seen(state.mono0, state.skew_s, self.delivery.log)
        except Exception as exc:
            self.internal_error("delivery", exc)
            return None

    def _call_later(self, delay_s: float, fn: Callable[[], None]) -> None:
        """Run `fn` later on the loop; a failure in it is counted, never raised into the loop."""

        def guarded() -> None:
            try:
                fn()
            except Exception as exc:
                self.internal_error("pairing", exc)

        asyncio.get_running_loop().call_later(delay_s, guarded)

    def _call_soon(self, fn: Callable[[], None]) -> None:
        """Run `fn` on the loop's next turn, timed as one of hopmeter's own steps; a failure in
        it is counted, never raised into the loop."""

        def step() -> None:
            t0, cpu0 = time.monotonic(), time.thread_time()
            try:
                fn()
            except Exception as exc:
                self.internal_error("pairing", exc)
            self.delivery.log.step(t0, cpu0)

        asyncio.get_running_loop().call_soon(step)

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


def _request_buffered(state: FlowState) -> bool:
    """Whether the request's body is left to mitmproxy to buffer (an edit must apply to it)."""
    return state.passage is not None and state.passage.request_buffered_by is not None


def classify_error(message: str) -> Ended:
    """How a flow that fired `error` ended, from mitmproxy's error message."""
    m = message.lower()
    if "client" in m:
        return Ended.CLIENT_GONE
    if "server" in m or "reset" in m or "peer" in m or "closed" in m or "eof" in m:
        return Ended.UPSTREAM_RESET
    return Ended.ERROR
