"""The mitmproxy layer: the HopMeter addon and the stream taps. The only mitmproxy import site.

Load it in plain mitmproxy with `mitmdump -s "$(hopmeter --addon-path)" --set hopmeter_hop=edge`.
Everything measured is handed to the sans-I/O core; this module only stamps times, keeps per-flow
state and guards every call into measuring code so that a bug there can never touch a byte.
"""

from __future__ import annotations

import asyncio
import gc
import secrets
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from mitmproxy import ctx, exceptions, http
from mitmproxy.addonmanager import Loader

from hopmeter.core.meter import FlowMeter
from hopmeter.core.record import FlowResult, RequestInfo, ResponseInfo, finish_flow
from hopmeter.core.trace import TraceContext, parse_traceparent
from hopmeter.core.wire import detect_api, model_from_path
from hopmeter.errors import HopmeterError, OtelConfigError
from hopmeter.export.console import MODES as CONSOLE_MODES
from hopmeter.export.console import Console
from hopmeter.export.records import RecordSink
from hopmeter.log import get_logger
from hopmeter.proxy.chaos import Chaos, parse_actions
from hopmeter.proxy.pairing import Pairing
from hopmeter.proxy.tokenizers import load_counter

log = get_logger()

# The request body is streamed to upstream as it arrives; its first bytes are kept on the side to
# read `model` and `stream` from a JSON body. 64 KiB holds the head of any chat request; a longer
# prompt is cut, and only the fields that appear before the cut are read.
REQUEST_SNIFF_BYTES = 64 * 1024
# Chunks are measured this long after the first of them was stamped (HopMeter.schedule_measure).
# A batched decoder's tick reaches the proxy as one event per stream within about a millisecond:
# measuring after the whole tick is forwarded kept hopmeter's added delay p99 at 50 lockstep
# streams within ~5% of bare mitmproxy's, against ~12% when measuring on the next loop turn
# (bench/README.md); the CPU is the same either way.
MEASURE_DELAY_S = 0.001


@dataclass(slots=True)
class FlowState:
    """What the addon keeps per flow between hooks."""

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

    def offset(self, mono: float) -> float:
        """Seconds since the request started, on the monotonic clock."""
        return mono - self.mono0 + self.skew_s


class RequestTap:
    """Counts request body bytes and keeps the head of the body; returns every chunk unchanged."""

    __slots__ = ("addon", "state")

    def __init__(self, addon: HopMeter, state: FlowState) -> None:
        self.addon = addon
        self.state = state

    def __call__(self, data: bytes) -> bytes:
        try:
            st = self.state
            st.request_bytes += len(data)
            room = REQUEST_SNIFF_BYTES - len(st.request_head)
            if room > 0 and data:
                st.request_head += data[:room]
            if not data:
                st.request_model, st.stream_requested = sniff_request(bytes(st.request_head))
                st.request_head = bytearray()
        except Exception:  # a measuring bug must never touch the request
            self.addon.internal_error("request_tap")
        return data


class ResponseTap:
    """The stream callable: stamps each chunk, feeds a side copy to the core, returns the chunk.

    mitmproxy calls it once per HTTP/1 chunk, socket read or HTTP/2 DATA frame, then once with
    b"" at the end. It must return every chunk unchanged: an exception here would silently drop the
    chunk (mitmproxy does not guard stream callables), so everything is caught.
    """

    __slots__ = ("addon", "bytes_out", "chaos", "error", "meter", "state")

    def __init__(self, addon: HopMeter, state: FlowState | None) -> None:
        self.addon = addon
        self.state = state
        self.meter: FlowMeter | None = None
        self.bytes_out = 0
        self.error: str | None = None
        self.chaos: Chaos | None = None  # only with --chaos: staging, never by default

    def __call__(self, data: bytes) -> bytes | list[bytes]:
        if data and self.meter is not None:
            # Stamp now; measure after the chunk is written (HopMeter.schedule_measure).
            addon = self.addon
            addon.pending.append((self, data, time.monotonic()))
            if not addon.measure_scheduled:
                addon.schedule_measure()
        if self.chaos is not None:
            return self._chaos(data)
        self.bytes_out += len(data)
        return data

    def _chaos(self, data: bytes) -> bytes | list[bytes]:
        assert self.chaos is not None
        try:
            pieces = self.chaos.feed(data) if data else self.chaos.flush()
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
        except Exception as exc:
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        """Stop measuring this flow, say so once, and count it."""
        self.meter = None
        if self.error is None:
            self.error = f"{type(exc).__name__}: {exc}"[:300]
            self.addon.internal_error("response_tap", exc)


class HopMeter:
    """Measures every HTTP flow that passes: times, events, tokens, figures, a record per flow."""

    def __init__(self) -> None:
        self.sink: RecordSink | None = None
        self.listener_names: dict[str, str] = {}
        self.counter: Any = None
        self.internal_errors = 0
        self.flows_finished = 0
        self.observers: list[Any] = []  # objects with observe(FlowResult) and optional hooks
        self.pairing = Pairing(schedule=_call_later, emit=self._emit)
        self.otel: Any = None
        self.live: dict[str, tuple[http.HTTPFlow, FlowState]] = {}  # flows not yet finished
        self.records_lost = 0
        self.console: Console | None = None
        self.chaos_actions: tuple[str, ...] = ()
        # Chunks stamped by the stream callables and not yet measured (see schedule_measure).
        self.pending: list[tuple[ResponseTap, bytes, float]] = []
        self.measure_scheduled = False

    # -- options -------------------------------------------------------------------------------
    def load(self, loader: Loader) -> None:
        loader.add_option("hopmeter_hop", str, "proxy", "This vantage point's name.")
        loader.add_option(
            "hopmeter_listeners",
            Sequence[str],
            [],
            "NAME=MODE pairs naming listeners; each MODE is also added to `mode`.",
        )
        loader.add_option(
            "hopmeter_records",
            str,
            "",
            'Append one JSON line per finished flow to this file ("-" = stdout).',
        )
        loader.add_option(
            "hopmeter_stall_threshold",
            float,
            0.5,
            "A gap between tokens at or above this many seconds is a stall.",
        )
        loader.add_option(
            "hopmeter_tokenizer",
            str,
            "",
            "tiktoken encoding name or tokenizer file; default: chosen by model.",
        )
        loader.add_option(
            "hopmeter_log_content",
            bool,
            False,
            "Include prompt and reply text in records (off by default).",
        )
        loader.add_option(
            "hopmeter_chaos",
            str,
            "",
            "Staging only: comma list of rechunk, split_utf8, crlf, cr applied to responses on "
            "the way to the client (measuring sees the original).",
        )
        loader.add_option(
            "hopmeter_chaos_seed", int, 0, "Seed for --chaos (0 = a new seed per flow)."
        )
        loader.add_option(
            "hopmeter_console",
            str,
            "text",
            'Per-flow console output: "text" (a line per flow), "json" (an object per line on '
            'stdout) or "off".',
        )
        loader.add_option(
            "hopmeter_summary_interval",
            float,
            60.0,
            "Seconds between compact console summaries (0 = none).",
        )
        loader.add_option(
            "hopmeter_otel_endpoint",
            str,
            "",
            "Export one OpenTelemetry span per flow to this OTLP/HTTP endpoint "
            "(needs `pip install hopmeter[otel]`).",
        )
        loader.add_option(
            "hopmeter_trace_header", bool, True, "Add a W3C traceparent to requests that have none."
        )

    def configure(self, updated: set[str]) -> None:
        opts = ctx.options
        if "hopmeter_stall_threshold" in updated and not opts.hopmeter_stall_threshold > 0:
            raise exceptions.OptionsError(
                f"hopmeter_stall_threshold must be a positive number of seconds, "
                f"got {opts.hopmeter_stall_threshold}"
            )
        if "hopmeter_listeners" in updated:
            self.listener_names = parse_listeners(opts.hopmeter_listeners)
            modes = list(opts.mode)
            wanted = [m for m in self.listener_names if m not in modes]
            if wanted:
                if modes == ["regular"]:
                    modes = []
                opts.update(mode=[*modes, *wanted])
        if "hopmeter_records" in updated:
            if self.sink is not None:
                self.sink.close()
                self.sink = None
            if opts.hopmeter_records:
                try:
                    self.sink = RecordSink.open(opts.hopmeter_records)
                except OSError as exc:
                    raise exceptions.OptionsError(
                        f"cannot write records to {opts.hopmeter_records}: {exc.strerror}; "
                        f"pick a writable path with --records"
                    ) from exc
        if "hopmeter_console" in updated or "hopmeter_summary_interval" in updated:
            self._set_console(opts.hopmeter_console, opts.hopmeter_summary_interval)
        if "hopmeter_chaos" in updated:
            try:
                self.chaos_actions = parse_actions(opts.hopmeter_chaos)
            except HopmeterError as exc:
                raise exceptions.OptionsError(f"hopmeter_chaos: {exc}") from None
            if self.chaos_actions:
                log.warning(
                    "hopmeter: CHAOS is on: responses are re-cut on the way to clients",
                    actions=",".join(self.chaos_actions),
                )
        if "hopmeter_otel_endpoint" in updated:
            self._set_otel(opts.hopmeter_otel_endpoint.strip())
        if "hopmeter_tokenizer" in updated or self.counter is None:
            try:
                self.counter = load_counter(opts.hopmeter_tokenizer or None)
            except HopmeterError as exc:
                raise exceptions.OptionsError(f"hopmeter_tokenizer: {exc}") from None

    def running(self) -> None:
        if self.counter is not None:
            self.counter.preload()
        # Everything loaded so far (mitmproxy, the tokenizers' vocabularies) lives as long as the
        # process: move it out of the collector's reach. A full collection over it takes ~25 ms,
        # a pause every stream on the loop would feel, at a rate set by allocation, not by load.
        gc.collect()
        gc.freeze()
        if self.console is not None:
            self.console.start()

    def _set_console(self, mode: str, interval_s: float) -> None:
        if mode not in CONSOLE_MODES:
            raise exceptions.OptionsError(
                f"hopmeter_console must be one of {', '.join(CONSOLE_MODES)}, got {mode!r}"
            )
        if interval_s < 0:
            raise exceptions.OptionsError("hopmeter_summary_interval must be 0 or more seconds")
        if self.console is not None:
            self.console.stop()
            self.observers.remove(self.console)
        self.console = Console(mode, interval_s)
        self.observers.append(self.console)

    def done(self) -> None:
        # flows still in flight when the proxy stops are written as ended "shutdown"
        for flow, state in list(self.live.values()):
            if not state.finished:
                state.finished = True
                self._complete(flow, state, "shutdown", state.offset(time.monotonic()))
        self.live.clear()
        self.pairing.drain()
        if self.console is not None:
            self.console.stop()
        if self.sink is not None:
            self.sink.close()
        if self.records_lost:
            log.error(
                "hopmeter: records were lost",
                lost=self.records_lost,
                path=ctx.options.hopmeter_records,
            )
        self._set_otel("")

    def _set_otel(self, endpoint: str) -> None:
        if self.otel is not None:
            self.observers.remove(self.otel)
            self.otel.close()
            self.otel = None
        if not endpoint:
            return
        try:
            from hopmeter.export.otel import OtelExporter  # noqa: PLC0415 - optional
        except ImportError as exc:
            raise exceptions.OptionsError(
                f"hopmeter_otel_endpoint needs the OpenTelemetry extra: pip install "
                f"'hopmeter[otel]' ({exc})"
            ) from None
        try:
            self.otel = OtelExporter(endpoint)
        except OtelConfigError as exc:
            raise exceptions.OptionsError(str(exc)) from None
        self.observers.append(self.otel)

    # -- hooks ---------------------------------------------------------------------------------
    def requestheaders(self, flow: http.HTTPFlow) -> None:
        mono0 = time.monotonic()
        wall0 = time.time()
        state = None
        try:
            spec = flow.client_conn.proxy_mode.full_spec
            listener = self.listener_names.get(spec, ctx.options.hopmeter_hop)
            trace = self._trace(flow)
            state = FlowState(
                mono0=mono0,
                skew_s=max(0.0, wall0 - flow.request.timestamp_start),
                listener=listener,
                hop=listener,
                trace=trace,
                span_id=trace.span_id if trace.created else secrets.token_hex(8),
            )
            flow.metadata["hopmeter"] = state
            self.live[flow.id] = (flow, state)
            self.pairing.start(trace.trace_id, flow.request.timestamp_start)
        except Exception as exc:
            self.internal_error("requestheaders", exc)
        if state is not None and flow.request.stream is False:
            flow.request.stream = RequestTap(self, state)

    def responseheaders(self, flow: http.HTTPFlow) -> None:
        # First statement: never hold the body. Anything that fails after this only loses measuring.
        flow.response.stream = tap = ResponseTap(self, flow.metadata.get("hopmeter"))  # type: ignore[union-attr]
        try:
            state = tap.state
            if state is None or flow.response is None:
                return
            state.tap = tap
            resp = flow.response
            req = flow.request
            state.response_headers = headers = _lower(resp.headers)
            content_type = headers.get("content-type", "")
            api = detect_api(
                req.method, req.path.split("?", 1)[0], _lower(req.headers), headers, content_type
            )
            tap.meter = FlowMeter(
                api=api,
                content_type=content_type,
                content_encoding=headers.get("content-encoding"),
                headers=headers,
            )
            state.streaming = True
            self._notify("stream_started")
            if self.chaos_actions:
                tap.chaos = Chaos(
                    self.chaos_actions,
                    ctx.options.hopmeter_chaos_seed or secrets.randbits(32),
                    rewrite_ok="content-length" not in headers
                    and "content-encoding" not in headers,
                )
        except Exception as exc:
            tap.fail(exc)

    def response(self, flow: http.HTTPFlow) -> None:
        self._finish(flow, "complete")

    def error(self, flow: http.HTTPFlow) -> None:
        msg = flow.error.msg if flow.error else ""
        self._finish(flow, classify_error(msg))

    # -- internals -----------------------------------------------------------------------------
    def schedule_measure(self) -> None:
        """Measure the queue of stamped chunks on the next turn of the loop.

        mitmproxy writes a chunk to the client right after the stream callable returns, so
        whatever the callable does delays that write, and with many streams emitting together
        (batched decoding) it delays every stream behind it. The callable therefore only stamps
        the chunk and appends it to `pending`; one callback `MEASURE_DELAY_S` later measures
        the queue, all chunks in a row (cheaper than interleaved with mitmproxy's work), after
        the writes of every chunk that arrived meanwhile. The queue holds at most that long's
        chunks, which mitmproxy has already handed to the sockets; measuring reads the stamps,
        so nothing measured moves. With no loop running (offline tools, tests) it measures now.
        """
        try:
            asyncio.get_running_loop().call_later(MEASURE_DELAY_S, self.measure_pending)
        except RuntimeError:  # no running loop (offline tools, tests): measure now
            self.measure_pending()
            return
        self.measure_scheduled = True

    def measure_pending(self) -> None:
        """Measure every queued chunk, in arrival order. Never raises."""
        self.measure_scheduled = False
        pending, self.pending = self.pending, []
        for tap, data, now in pending:
            tap.measure(data, now)

    def _notify(self, hook: str, *args: Any) -> None:
        for obs in self.observers:
            fn = getattr(obs, hook, None)
            if fn is not None:
                fn(*args)

    def internal_error(self, where: str, exc: BaseException | None = None) -> None:
        """Count a bug in measuring code; the flow goes on unmeasured."""
        self.internal_errors += 1
        self._notify("internal_error", where)
        log.warning(
            "hopmeter: measuring failed; the flow is forwarded unmeasured",
            where=where,
            error=f"{type(exc).__name__}: {exc}" if exc else None,
        )

    def _trace(self, flow: http.HTTPFlow) -> TraceContext:
        incoming = flow.request.headers.get("traceparent")
        parsed = parse_traceparent(incoming) if incoming else None
        if parsed is not None:
            return parsed
        created = TraceContext(
            trace_id=secrets.token_hex(16), span_id=secrets.token_hex(8), flags="01", created=True
        )
        if ctx.options.hopmeter_trace_header:
            flow.request.headers["traceparent"] = created.header()
        return created

    def _finish(self, flow: http.HTTPFlow, ended: str) -> None:
        """Stamp the end now; build the record after this hook has returned.

        For a streamed response mitmproxy writes the end of the body to the client only after the
        `response` hook returns, so tokenizing, figures and detectors must not run inside it.
        """
        state: FlowState | None = flow.metadata.get("hopmeter")
        if state is None or state.finished:
            return
        state.finished = True
        self.live.pop(flow.id, None)
        end_s = state.offset(time.monotonic())
        if state.streaming:
            state.streaming = False
            try:
                self._notify("stream_finished")
            except Exception as exc:
                self.internal_error("observer", exc)
        try:
            asyncio.get_running_loop().call_soon(self._complete, flow, state, ended, end_s)
        except RuntimeError:  # no running loop (offline tools, tests): do it now
            self._complete(flow, state, ended, end_s)

    def _complete(self, flow: http.HTTPFlow, state: FlowState, ended: str, end_s: float) -> None:
        try:
            result = self._result(flow, state, ended, end_s)
        except Exception as exc:
            self.internal_error("finish", exc)
            return
        self.flows_finished += 1
        try:
            ready = self.pairing.finish(result)
        except Exception as exc:
            self.internal_error("pairing", exc)
            ready = [result]
        for r in ready:
            self._emit(r)

    def _emit(self, result: FlowResult) -> None:
        """Hand one finished record to the observers (metrics), the records file and the console."""
        for obs in self.observers:
            try:
                obs.observe(result)
            except Exception as exc:
                self.internal_error("observer", exc)
        if self.sink is not None:
            try:
                self.sink.write(orjson.dumps(result.record) + b"\n")
            except OSError as exc:
                self.records_lost += 1
                if self.records_lost == 1:
                    log.error(
                        "hopmeter: ERROR cannot write records; every record from now on is lost "
                        "until the file is writable again",
                        path=ctx.options.hopmeter_records,
                        error=str(exc),
                    )

    def _result(self, flow: http.HTTPFlow, state: FlowState, ended: str, now: float) -> FlowResult:
        req = flow.request
        tap = state.tap
        self.measure_pending()  # this flow's last chunks may still be queued
        meter = tap.meter if tap is not None else None
        if meter is not None:
            try:
                meter.close(now)
            except Exception as exc:
                tap.fail(exc)  # type: ignore[union-attr]
                meter = None
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
        if flow.response is not None and tap is not None:
            resp = flow.response
            response = ResponseInfo(
                status=resp.status_code,
                http_version=resp.http_version,
                headers=state.response_headers or _lower(resp.headers),
                t_headers_s=(resp.timestamp_start - req.timestamp_start),
            )
        result = finish_flow(
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
            counters=self.counter,
            stall_threshold_s=ctx.options.hopmeter_stall_threshold,
            log_content=ctx.options.hopmeter_log_content,
            measuring_error=tap.error if tap is not None else None,
        )
        if tap is not None and tap.chaos is not None:
            result.record["chaos"] = sorted(tap.chaos.actions)
        return result


def _call_later(delay_s: float, fn: Any) -> None:
    asyncio.get_running_loop().call_later(delay_s, fn)


def _lower(headers: Any) -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in headers.items():
        out.setdefault(k.lower(), v)
    return out


def parse_listeners(pairs: Sequence[str]) -> dict[str, str]:
    """Map each listener's mode spec to its name, from NAME=MODE pairs."""
    out: dict[str, str] = {}
    for pair in pairs:
        name, sep, mode = pair.partition("=")
        if not sep or not name or not mode:
            raise exceptions.OptionsError(
                f"listener {pair!r} is not NAME=MODE, e.g. edge=reverse:http://127.0.0.1:9000@8081"
            )
        out[mode] = name
    return out


def classify_error(message: str) -> str:
    """How a flow that fired `error` ended, from mitmproxy's error message."""
    m = message.lower()
    if "client" in m:
        return "client_gone"
    if "server" in m or "reset" in m or "peer" in m or "closed" in m or "eof" in m:
        return "upstream_reset"
    return "error"


def sniff_request(head: bytes) -> tuple[str | None, bool | None]:
    """The `model` and `stream` fields of a JSON request body, if they are in its head."""
    if not head.lstrip().startswith(b"{"):
        return None, None
    try:
        doc = orjson.loads(head)
    except orjson.JSONDecodeError:
        return _sniff_partial(head)
    if not isinstance(doc, dict):
        return None, None
    model = doc.get("model")
    stream = doc.get("stream")
    return (model if isinstance(model, str) else None, stream if isinstance(stream, bool) else None)


def _sniff_partial(head: bytes) -> tuple[str | None, bool | None]:
    import re  # noqa: PLC0415 - only for truncated bodies

    model = re.search(rb'"model"\s*:\s*"([^"\\]{1,200})"', head)
    stream = re.search(rb'"stream"\s*:\s*(true|false)', head)
    return (
        model.group(1).decode("utf-8", "replace") if model else None,
        (stream.group(1) == b"true") if stream else None,
    )
