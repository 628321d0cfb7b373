"""HopMeter: the addon whose hooks hand every HTTP flow to the sans-I/O core.

Load it in plain mitmproxy with `mitmdump -s "$(hopmeter --addon-path)" --set hopmeter_hop=edge`.
Its hooks stamp times, keep per-flow state (`FlowState`, in this addon, never on the flow: a flow
is saved and copied with its metadata) and install the stream taps (hopmeter.proxy.addon.tap);
when a flow ends they stamp the end and hand it to the flow's end (hopmeter.proxy.addon.ending),
which waits for its last bytes to reach the client, builds its record with the core and hands
it to the observers, the outputs of hopmeter.proxy.addon.outputs. Every call into measuring code
and into an observer is guarded: a bug there is counted and logged, never touching the flow.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import Callable
from typing import Any

from mitmproxy import connection, ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from hopmeter.clock import MONOTONIC, Clock, Timers
from hopmeter.core.upstream import UpstreamFailure
from hopmeter.core.vocab import Ended
from hopmeter.errors import HopmeterError, UsageError, said
from hopmeter.export import FlowObserver
from hopmeter.log import get_logger
from hopmeter.proxy import options
from hopmeter.proxy.addon import passage
from hopmeter.proxy.addon.browser_gate import answered_here
from hopmeter.proxy.addon.chaos import Chaos
from hopmeter.proxy.addon.ending import Ending, FlowEnd
from hopmeter.proxy.addon.meter_options import (
    chaos_actions,
    fingerprint_key,
    hop_name,
    listener_modes,
    pairing_hops,
    parse_listeners,
    serve_mode,
    unknown_options,
)
from hopmeter.proxy.addon.observers import Observers
from hopmeter.proxy.addon.passage import CrashWatch, FlowPassage, Passage
from hopmeter.proxy.addon.tap import (
    FlowState,
    MeasureQueue,
    RequestTap,
    header_map,
    new_meter,
    request_tapped,
    start_trace,
)
from hopmeter.proxy.addon.tokenizers import load_counter, traffic_started
from hopmeter.proxy.delivery.lane import DeliveryLane

log = get_logger()


class HopMeter:
    """Measures every HTTP flow that passes: times, events, tokens, figures, a record per flow."""

    def __init__(self, *, clock: Clock = MONOTONIC, timers: Timers | None = None) -> None:
        self.clock = clock  # monotonic; the record's wall time is read from time.time()
        self.listener_names: dict[str, str] = {}
        self.modes_added = False  # listeners' modes this addon added to `mode` (serve_mode)
        # what runs once the tokenizers' patterns are compiled, in that thread (hopmeter run:
        # hopmeter.proxy.run.runner.FreezeAtStart freezes what the compiler left)
        self.after_patterns: Callable[[], None] | None = None
        self.fingerprint_key: bytes | None = None  # from hopmeter_fingerprint_key_env
        self.live: dict[str, tuple[http.HTTPFlow, FlowState]] = {}  # flows not yet finished
        self.chaos_actions: tuple[str, ...] = ()
        self.stall_threshold_s: float = options.default("hopmeter_stall_threshold")
        # the observers (outputs), and the count of hopmeter's own faults
        self.observers = Observers()
        self.internal_error = self.observers.internal_error
        # follows each chunk to the client, and logs what hopmeter's own steps cost the loop
        self.delivery = DeliveryLane(self.internal_error, clock=clock, timers=timers)
        self.queue = MeasureQueue(self.delivery.log, clock=clock, timers=timers)
        # a flow's end: the waits between the last hook and the observers, in one chain
        self.ending = Ending(
            self.observers,
            self.delivery,
            self.queue,
            live=self.live,
            options=self,
            clock=clock,
            timers=timers,
        )
        self.pairing = self.ending.pairing  # configured here (hopmeter_listeners)
        self.vocabulary = self.ending.vocabulary  # the tokenizers (hopmeter_tokenizer)
        # what hopmeter leaves of mitmproxy's own features (streams, edits, bodies, failures)
        self.passage = Passage()
        self.crash_watch = CrashWatch(self._mitmproxy_crashed)
        # Set by `done`: the outputs are closing, so flows that still start on connections open
        # until the process exits are forwarded, not measured (nothing could write their record)
        self.stopped = False

    # -- options -------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        options.declare(loader, options.MEASURING)
        options.declare(loader, options.PASSAGE)

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        try:  # each option read once (hopmeter.proxy.addon.meter_options): a bad one named
            passage.configure(self.passage, opts, updated)
            if "hopmeter_hop" in updated:
                hop_name(opts.hopmeter_hop)
            if "hopmeter_stall_threshold" in updated:
                self.stall_threshold_s = options.read(opts, "hopmeter_stall_threshold")
            if "hopmeter_listeners" in updated:
                self.listener_names = parse_listeners(opts.hopmeter_listeners)
                modes = listener_modes(opts.mode, self.listener_names)
                if modes is not None:
                    opts.update(mode=modes)
                    self.modes_added = True
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
        tokenizer = {"hopmeter_tokenizer", "hopmeter_lazy_tokenizer"}
        if updated & tokenizer or self.vocabulary.counters is None:
            try:
                counters = load_counter(opts.hopmeter_tokenizer or None)
            except HopmeterError as exc:
                raise exceptions.OptionsError(f"hopmeter_tokenizer: {exc}") from None
            self.vocabulary.use(counters, lazy=opts.hopmeter_lazy_tokenizer)

    def running(self) -> None:
        if self.modes_added:  # mitmdump -s opened its listeners before this added to `mode`
            serve_mode(ctx.master)
        for line in unknown_options(ctx.options):  # a misspelled --set, which mitmdump keeps
            log.warning(line)
        self.preload()  # `hopmeter run` did it before its listeners opened; mitmdump -s: now
        # mitmproxy's connection handler logs a crash of its layers, and that is all it does
        # (the flow's client waits): hopmeter ends such a flow as an error (passage.CrashWatch)
        logging.getLogger(passage.CRASH_LOGGER).addHandler(self.crash_watch)

    def preload(self) -> None:
        """Load the default vocabulary now, unless it is to be loaded at the first flow."""
        self.vocabulary.preload()

    def done(self) -> None:
        logging.getLogger(passage.CRASH_LOGGER).removeHandler(self.crash_watch)
        self.ending.drain(self._stop)  # every waiting flow written now, with what was seen

    def _stop(self) -> list[FlowEnd]:
        """Stop measuring: the flows still in flight, ended "shutdown"."""
        self.stopped = True
        out = []
        for flow, state in list(self.live.values()):
            if not state.finished:
                state.finished = True
                out.append(FlowEnd(flow, state, Ended.SHUTDOWN, state.offset(self.clock())))
        self.live.clear()
        return out

    # -- observers and faults ------------------------------------------------------------------
    def add_observer(self, observer: FlowObserver) -> None:
        """Hand every finished flow (and the stream and error notices) to `observer` too."""
        self.observers.add_observer(observer)

    def remove_observer(self, observer: FlowObserver) -> None:
        """Stop handing flows to `observer`."""
        self.observers.remove_observer(observer)

    def relay_failed(self, flow: http.HTTPFlow, exc: BaseException, cut: bool) -> None:
        """A fault in `hopmeter run`'s relay (proxy/fastpath/relay.py), counted and logged. `cut`:
        the relay had begun moving a read and reset the client's connection, so the flow ends as
        an error with the fault as its `relay_error`; else mitmproxy's layers moved the read."""
        error = said(exc)
        with contextlib.suppress(Exception):
            state = self._state(flow)
            if cut and state is not None and state.relay_error is None:
                state.relay_error = error
        self.observers.relay_failed(error, cut)  # counted and logged

    # -- hooks ---------------------------------------------------------------------------------
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        if not flow.live or self.stopped:  # read from a file (measured when it was live), or
            return  # the proxy is stopping: nothing could write its record any more
        if answered_here(flow):  # hopmeter's own paths (browser measuring): never measured
            return
        mono0 = self.clock()
        wall0 = time.time()
        state = None
        try:
            spec = flow.client_conn.proxy_mode.full_spec
            listener = self.listener_names.get(spec, ctx.options.hopmeter_hop)
            trace, span_id = start_trace(flow, ctx.options.hopmeter_trace_header)
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
            self.vocabulary.flow_started()
            traffic_started(self.after_patterns)  # the first flow's call acts; then a flag read
        except Exception as exc:
            self.internal_error("requestheaders", exc)
        if state is not None and request_tapped(flow.request.stream, state):
            flow.request.stream = RequestTap(state, self.internal_error)

    def request(self, flow: http.HTTPFlow) -> None:
        state = self._state(flow)  # a body mitmproxy buffered: read as the request tap reads one
        if state is not None and flow.request.stream is False:
            passage.take_request(state, flow.request, self.internal_error)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # First: never hold a body hopmeter did not decide to leave buffered. Anything that fails
        # after the tap is in place only loses measuring.
        tap = self.passage.tap(flow, self._state(flow), self.queue, self.internal_error)
        try:
            state = tap.state
            if state is None or flow.response is None:
                return
            state.tap = tap
            state.response_headers = headers = header_map(flow.response.headers)
            tap.meter = new_meter(flow, headers, state.stream_requested)
            state.streaming = True
            if self.chaos_actions:
                tap.chaos = Chaos(
                    self.chaos_actions,
                    ctx.options.hopmeter_chaos_seed or secrets.randbits(32),
                    rewrite_ok="content-length" not in headers
                    and "content-encoding" not in headers,
                )
                tap.chaos = tap.chaos if tap.chaos.applied else None  # nothing it may do here
            if flow.response.stream is tap:  # a buffered body has no chunks to follow out
                tap.out = self.delivery.attach(flow, chaos=tap.chaos is not None)  # never raises
        except Exception as exc:
            tap.fail(exc)
            return
        self.observers.notify(lambda obs: obs.stream_started())

    def response(self, flow: http.HTTPFlow) -> None:
        state = self._state(flow)
        if state is not None and state.passage is not None:
            try:
                if passage.informational(flow):  # taken for the final response: ends as an error
                    passage.end_informational(flow, state.passage)
                    self._finish(flow, Ended.ERROR)
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
        self._finish(flow, passage.ended_by_error(flow, state.passage if state else None))

    def client_disconnected(self, client: connection.Client) -> None:
        try:
            self.delivery.forget(client.id)
        except Exception as exc:
            self.internal_error("delivery", exc)

    # -- for the upstream guard ----------------------------------------------------------------
    def orphaned(self, flow: http.HTTPFlow) -> None:
        """End a flow mitmproxy will not end (no hook comes): its client left while it waited
        for its upstream (guard.UpstreamGuard.client_disconnected)."""
        state = self._state(flow)
        if state is not None:
            self._finish(flow, state.failure.cause if state.failure else Ended.CLIENT_GONE)

    def upstream_failed(self, flow: http.HTTPFlow, failure: UpstreamFailure) -> None:
        """Remember why the upstream failed `flow`, for its record (the first cause wins)."""
        state = self._state(flow)
        if state is not None and state.failure is None:
            state.failure = failure

    def in_flight(self) -> int:
        return len(self.live)  # flows that started and have not finished

    def busy_clients(self) -> set[str]:
        """The ids of the client connections that have a flow in flight."""
        return {flow.client_conn.id for flow, _ in self.live.values()}

    # -- internals -----------------------------------------------------------------------------
    def _state(self, flow: http.HTTPFlow) -> FlowState | None:
        entry = self.live.get(flow.id)
        return entry[1] if entry is not None else None

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

    def _finish(self, flow: http.HTTPFlow, ended: Ended) -> None:
        """Stamp the end now; the flow's end (hopmeter.proxy.addon.ending) builds the record after
        this hook has returned (mitmproxy writes a streamed body's end to the client after the
        `response` hook), once the kernel has sent the last chunk to the client."""
        entry = self.live.pop(flow.id, None)
        if entry is None:
            return
        state = entry[1]
        if state.finished:
            return
        state.finished = True
        if state.relay_error is not None:
            ended = Ended.ERROR  # the relay cut the client's connection: never complete
        end_s = state.offset(self.clock())
        if state.streaming:
            state.streaming = False
            self.observers.notify(lambda obs: obs.stream_finished())
        self.ending.end(FlowEnd(flow, state, ended, end_s))

    @property
    def log_content(self) -> bool:
        """hopmeter_log_content, for the record being taken (ending.RecordOptions)."""
        return bool(ctx.options.hopmeter_log_content)
